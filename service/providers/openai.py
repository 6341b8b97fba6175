"""An OpenAI-compatible chat-completions endpoint (the Bedrock Access Gateway, vLLM, OpenAI) over aiohttp.

:class:`OpenAIProvider` POSTs ``{base_url}/chat/completions`` with ``"stream": true``.
:meth:`~OpenAIProvider.raw_stream` yields the stream's chunks (the JSON object of each SSE
``data:`` line, or ``"[DONE]"``) the moment their line arrives, and
:meth:`~OpenAIProvider.stream` feeds them to :class:`~service.providers.openai_stream.OpenAIStreamParser`:
the turn's canonical events, then its result. The agent loop keeps the conversation in Bedrock's
message format, so the request is converted on the way out (:func:`to_openai_messages`,
:func:`to_openai_tools`).

All streams share one ``aiohttp.ClientSession`` whose connector allows as many connections as
the service allows concurrent runs; it is created lazily, inside the running event loop.

Failures are raised as :class:`~service.errors.ProviderError` with a code: ``http_<status>``
(retryable for 429 and 5xx), ``connection_error``, ``connect_timeout``, ``read_timeout``,
``malformed_chunk``. Retries happen only while nothing of the answer has arrived: an HTTP error,
or a connection that failed before the first byte of the body. Once a byte of the answer is in,
a failure is reported, never retried, so no client ever sees half an answer twice.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncGenerator, Iterable
from typing import Any

import aiohttp

from service.core.admission import Admission
from service.core.burst import Burst
from service.core.events import Event, Sink
from service.errors import ProviderError
from service.providers import upstream_json
from service.providers.base import POOL_IDLE_S, ModelRequest, TurnResult, parse_stream
from service.providers.openai_stream import DONE, OpenAIStreamParser, SSELineReader, decode_data

__all__ = ["OpenAIProvider", "to_openai_messages", "to_openai_tools"]

# Enough of an error body to read its message; a gateway's HTML error page is cut here.
_ERROR_BODY_LIMIT = 64 * 1024


# --- Bedrock's message format to OpenAI's ------------------------------------------------------


def _blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    if isinstance(content, str):
        return [{"text": content}]
    return [block for block in content or [] if isinstance(block, dict)]


def _tool_result_text(result: dict[str, Any]) -> str:
    parts: list[str] = []
    for item in result.get("content") or []:
        if not isinstance(item, dict):
            continue
        if isinstance(item.get("text"), str):
            parts.append(item["text"])
        elif "json" in item:
            parts.append(json.dumps(item["json"], allow_nan=False))
    text = "\n".join(parts)
    # OpenAI's tool message has no status field: the model learns of a failure from the text.
    return f"Error: {text}" if result.get("status") == "error" else text


def _assistant_message(blocks: list[dict[str, Any]]) -> dict[str, Any] | None:
    text = "".join(block["text"] for block in blocks if isinstance(block.get("text"), str))
    tool_calls = [
        {
            "id": use.get("toolUseId", ""),
            "type": "function",
            "function": {
                "name": use.get("name", ""),
                "arguments": json.dumps(use.get("input") or {}, allow_nan=False),
            },
        }
        for use in (block["toolUse"] for block in blocks if isinstance(block.get("toolUse"), dict))
    ]
    if tool_calls:
        return {"role": "assistant", "content": text or None, "tool_calls": tool_calls}
    # A message that held only reasoning has nothing to say on this wire.
    return {"role": "assistant", "content": text} if text else None


def _user_messages(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # Tool results first: OpenAI wants them right after the assistant message that asked for them.
    out: list[dict[str, Any]] = [
        {"role": "tool", "tool_call_id": result.get("toolUseId", ""), "content": _tool_result_text(result)}
        for result in (block["toolResult"] for block in blocks if isinstance(block.get("toolResult"), dict))
    ]
    texts = [block["text"] for block in blocks if isinstance(block.get("text"), str)]
    if texts:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def to_openai_messages(messages: Iterable[dict[str, Any]], system: str = "") -> list[dict[str, Any]]:
    """A Bedrock-format conversation (and system prompt) as OpenAI chat messages."""
    out: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    for message in messages:
        if not isinstance(message, dict):
            continue
        blocks = _blocks(message)
        if message.get("role") == "assistant":
            converted = _assistant_message(blocks)
            if converted is not None:
                out.append(converted)
        elif message.get("role") == "user":
            out.extend(_user_messages(blocks))
    return out


def to_openai_tools(specs: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The agent's tool specs (name, description, input_schema) as OpenAI function tools."""
    return [
        {
            "type": "function",
            "function": {
                "name": spec["name"],
                "description": spec.get("description", ""),
                "parameters": spec.get("input_schema") or {"type": "object", "properties": {}},
            },
        }
        for spec in specs
    ]


# --- errors ------------------------------------------------------------------------------------


def _error_detail(body: bytes) -> tuple[str, str]:
    """The message and type/code of an error body, whichever of the usual shapes it has."""
    text = body.decode("utf-8", errors="replace").strip()
    try:
        parsed = upstream_json.loads(text)
    except ValueError:
        return text[:300], ""
    if not isinstance(parsed, dict):
        return text[:300], ""
    error = parsed.get("error")
    if isinstance(error, dict):
        kind = error.get("type") or error.get("code") or ""
        return str(error.get("message") or ""), str(kind)
    if isinstance(error, str):
        return error, ""
    # {"message": ...} from many gateways, {"detail": ...} from FastAPI ones like the Bedrock Access Gateway.
    for key in ("message", "detail"):
        if parsed.get(key):
            value = parsed[key]
            message = value if isinstance(value, str) else json.dumps(value, allow_nan=False)
            return message, str(parsed.get("type") or "")
    return text[:300], ""


async def _read_limited(response: aiohttp.ClientResponse, limit: int) -> bytes:
    body = bytearray()
    try:
        async for data in response.content.iter_any():
            body += data
            if len(body) >= limit:
                break
    except (TimeoutError, aiohttp.ClientError):
        pass  # the status says enough; a body cut short just has a shorter message
    return bytes(body[:limit])


async def _http_error(response: aiohttp.ClientResponse) -> ProviderError:
    """The ProviderError for an HTTP error status answered before any stream."""
    status = response.status
    message, kind = _error_detail(await _read_limited(response, _ERROR_BODY_LIMIT))
    message = message or response.reason or "no message"
    label = f"HTTP {status}" + (f" ({kind})" if kind else "")
    hint = " (check AGENT_OPENAI_API_KEY)" if status in (401, 403) else ""
    return ProviderError(
        f"The model endpoint answered {label}: {message}{hint}",
        code=f"http_{status}",
        retryable=status == 429 or status >= 500,
    )


def _transport_error(exc: BaseException, url: str, got_body: bool) -> ProviderError:
    """Map what aiohttp raises while calling or reading the endpoint to a ProviderError."""
    # Timeouts first: aiohttp's timeout errors are connection errors too.
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return ProviderError(
            f"Could not connect to the model endpoint {url} in time: {exc}",
            code="connect_timeout",
            retryable=True,
        )
    if isinstance(exc, TimeoutError):  # SocketTimeoutError and ServerTimeoutError included
        where = "mid-stream" if got_body else "before answering"
        return ProviderError(
            f"The model endpoint stopped sending {where}: no data within the read timeout",
            code="read_timeout",
            retryable=True,
        )
    if isinstance(exc, aiohttp.ClientConnectorError):
        return ProviderError(
            f"Could not connect to the model endpoint {url}: {exc.os_error or exc}",
            code="connection_error",
            retryable=True,
        )
    if isinstance(exc, aiohttp.InvalidURL):
        return ProviderError(f"The model endpoint URL is not valid: {url}", code="invalid_url")
    if isinstance(exc, (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, ConnectionError)):
        if isinstance(exc, aiohttp.ClientPayloadError):
            detail = "the response was cut off before its end"
        else:
            detail = str(exc) or type(exc).__name__
        if got_body:
            message = f"The connection to the model endpoint was lost mid-stream: {detail}"
        else:
            message = f"The model endpoint closed the connection before answering: {detail}"
        return ProviderError(message, code="connection_error", retryable=True)
    return ProviderError(
        f"The call to the model endpoint failed ({type(exc).__name__}): {exc}", code="provider_error"
    )


# Codes worth another attempt, as long as no byte of the answer has arrived. A read timeout is not
# among them: a model that is slow to start would be asked again and again.
_RETRY_CODES = frozenset({"connection_error", "connect_timeout"})


def _worth_retrying(error: ProviderError) -> bool:
    return error.code in _RETRY_CODES or (error.code.startswith("http_") and error.retryable)


class OpenAIProvider:
    """Chat completions on an OpenAI-compatible endpoint, streamed over one shared aiohttp session."""

    name = "openai"

    def __init__(
        self,
        *,
        base_url: str,
        model_id: str,
        api_key: str = "",
        max_concurrent_runs: int = 256,
        max_attempts: int = 3,
        backoff_s: float = 0.2,
        read_timeout: float = 120.0,
        connect_timeout: float = 10.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.url = f"{self.base_url}/chat/completions"
        self.server_url = self.base_url  # for traces' server.address
        self.model_id = model_id
        self.max_concurrent_runs = max_concurrent_runs
        self.max_attempts = max(1, max_attempts)
        self.backoff_s = backoff_s
        self.read_timeout = read_timeout
        self.connect_timeout = connect_timeout
        self._headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._session: aiohttp.ClientSession | None = None
        self._active = 0
        self.admission = Admission()

    @property
    def active_streams(self) -> int:
        """Responses currently open (for tests and drain)."""
        return self._active

    def request_body(self, request: ModelRequest) -> dict[str, Any]:
        """The JSON body of ``POST /chat/completions`` for one turn."""
        body: dict[str, Any] = {
            "model": request.model or self.model_id,
            "messages": to_openai_messages(request.messages, request.system),
            "stream": True,
            # Without this the stream carries no token counts at all.
            "stream_options": {"include_usage": True},
            "max_tokens": request.max_tokens,
        }
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if request.tool_specs:
            body["tools"] = to_openai_tools(request.tool_specs)
        return body

    def _client(self) -> aiohttp.ClientSession:
        # Made on first use so that it belongs to the loop the service runs in.
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=self.max_concurrent_runs, limit_per_host=0, keepalive_timeout=POOL_IDLE_S
                ),
                timeout=aiohttp.ClientTimeout(
                    total=None, connect=self.connect_timeout, sock_read=self.read_timeout
                ),
            )
        return self._session

    def stream(
        self, request: ModelRequest, turn: int = 1, sink: Sink | None = None
    ) -> AsyncGenerator[Event | TurnResult, None]:
        """One turn's canonical events, then its result (the text deltas ``sink`` takes are not
        yielded); errors are raised as ProviderError."""
        return parse_stream(self.raw_stream(request), OpenAIStreamParser(turn=turn), sink)

    async def raw_stream(self, request: ModelRequest) -> AsyncGenerator[dict[str, Any] | str, None]:
        """Yield the stream's chunks and finally ``"[DONE]"``; errors are raised as ProviderError."""
        await self.admission.enter()  # a burst of new requests starts a few per loop turn
        payload = json.dumps(self.request_body(request), allow_nan=False).encode("utf-8")
        session = self._client()
        self._active += 1
        try:
            for attempt in range(1, self.max_attempts + 1):
                response: aiohttp.ClientResponse | None = None
                got_body = False  # once a byte of the answer is in, nothing is retried
                complete = False
                try:
                    try:
                        headers = (
                            {**self._headers, **dict(request.headers)} if request.headers else self._headers
                        )
                        response = await session.post(self.url, data=payload, headers=headers)
                        if response.status >= 400:
                            raise await _http_error(response)
                        reader = SSELineReader()
                        async for data in response.content.iter_any():
                            got_body = True
                            lines = reader.feed(data)
                            # Several chunks in one read: what subscribers write for them goes at once.
                            burst = Burst() if len(lines) > 1 else None
                            try:
                                for line in lines:
                                    chunk = decode_data(line)
                                    if chunk is None:
                                        continue
                                    yield chunk
                                    if chunk == DONE:
                                        complete = True
                                        return
                            finally:
                                if burst is not None:
                                    burst.end()
                        for line in reader.close():
                            chunk = decode_data(line)
                            if chunk is not None:
                                yield chunk
                        complete = True
                        return  # an end without [DONE] is the parser's to judge (incomplete_stream)
                    except (TimeoutError, aiohttp.ClientError, ConnectionError) as exc:
                        raise _transport_error(exc, self.url, got_body) from exc
                except ProviderError as error:
                    if got_body or attempt >= self.max_attempts or not _worth_retrying(error):
                        raise
                finally:
                    if response is not None:
                        # A finished response goes back to the pool; any other (error, client gone,
                        # run cancelled) is closed now, which drops the upstream connection at once.
                        if complete:
                            response.release()
                        else:
                            response.close()
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1) * (0.5 + random.random()))
        finally:
            self._active -= 1

    async def close(self) -> None:
        """Close the shared session and its connections."""
        if self._session is not None:
            await self._session.close()
            self._session = None
