"""Turn a Bedrock ConverseStream response into canonical events and one finished turn.

:class:`BedrockStreamParser` is fed the event dicts that boto3's
``converse_stream(...)["stream"]`` yields, one at a time. Each call to
:meth:`~BedrockStreamParser.feed` returns the canonical events to emit right away; once the
stream has ended, :meth:`~BedrockStreamParser.result` gives the assistant message to append to
the conversation, the stop reason, the usage and the tool uses to run.

The parser is a plain class: one small handler per event kind, all working on explicit state
(the content blocks by ``contentBlockIndex``, the stop reason, the usage). It does no I/O.

:func:`stream_error_from_exception` maps what boto3 raises (before or during the stream) to the
service's own :class:`~service.errors.ProviderError` family, so nothing above this layer needs to
know botocore.

:class:`OpenAIStreamParser` does the same for an OpenAI-compatible chat-completions stream (the
Bedrock Access Gateway, vLLM, LiteLLM, OpenAI itself): it is fed the JSON object of each SSE
``data:`` line, or the string ``"[DONE]"``, and produces the same canonical events and a
:class:`TurnResult` whose message is in Bedrock's format, because the agent loop keeps the
conversation in that one format whatever the provider.
"""

from __future__ import annotations

import builtins
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import urllib3.exceptions
from botocore import exceptions as botocore_exceptions

from service.core.events import (
    Event,
    ReasoningDelta,
    TextDelta,
    ToolInputDelta,
    ToolUse,
    ToolUseStart,
    Usage,
)
from service.errors import ModelStreamError, ProviderError
from service.providers import upstream_json

__all__ = [
    "BedrockStreamParser",
    "OpenAIStreamParser",
    "PendingToolUse",
    "TurnResult",
    "stream_error_from_exception",
]

# Exception events inside the stream that are worth retrying; the spelling is Bedrock's event key.
# botocore never retries these (they arrive after the HTTP 200), so the agent loop does.
RETRYABLE_STREAM_ERRORS = frozenset(
    {
        "throttlingException",
        "serviceUnavailableException",
        "internalServerException",
        "modelStreamErrorException",
    }
)

_RETRYABLE_STREAM_CODES = frozenset(code.lower() for code in RETRYABLE_STREAM_ERRORS)

# Error codes of a ClientError raised before the stream that a retry may cure (compared lowercased,
# since the same error is spelled "ThrottlingException" there and "throttlingException" in-stream).
_RETRYABLE_CODES = frozenset(
    {
        "throttlingexception",
        "serviceunavailableexception",
        "internalserverexception",
        "modelnotreadyexception",
    }
)

# What a user should read in front of Bedrock's own message, keyed by the lowercased error code.
_DESCRIPTIONS: dict[str, str] = {
    "throttlingexception": "Bedrock throttled the request",
    "servicequotaexceededexception": "The Bedrock service quota was exceeded",
    "serviceunavailableexception": "Bedrock is temporarily unavailable",
    "internalserverexception": "Bedrock hit an internal error",
    "modelstreamerrorexception": "The model failed while streaming its answer",
    "modeltimeoutexception": "The model took too long to answer",
    "modelerrorexception": "The model returned an error",
    "modelnotreadyexception": "The model is not ready yet",
    "validationexception": "Bedrock rejected the request as invalid",
    "accessdeniedexception": "Access to the Bedrock model was denied",
    "resourcenotfoundexception": "The Bedrock model or resource was not found",
    "unrecognizedclientexception": "AWS did not recognise the credentials",
    "expiredtokenexception": "The AWS credentials have expired",
}


@dataclass
class PendingToolUse:
    """A complete tool-use block the agent loop has to run."""

    tool: str
    tool_use_id: str
    input: Any
    input_error: str | None = None


@dataclass
class TurnResult:
    """Everything one model turn produced, ready for the agent loop."""

    message: dict[str, Any]
    stop_reason: str
    usage: Usage
    latency_ms: int | None
    tool_uses: list[PendingToolUse]
    text: str


@dataclass
class _TextBlock:
    """State of a text block; Bedrock opens it with its first delta, not with a start event."""

    parts: list[str] = field(default_factory=list)
    closed: bool = False

    def content(self) -> dict[str, Any] | None:
        """The block as Bedrock expects it back, or None when it must be left out."""
        text = "".join(self.parts)
        # Bedrock rejects a conversation holding a blank text block, so an empty one is dropped.
        return {"text": text} if text.strip() else None


@dataclass
class _ToolBlock:
    """State of a tool-use block: its input arrives as JSON text in fragments."""

    tool: str
    tool_use_id: str
    parts: list[str] = field(default_factory=list)
    closed: bool = False
    pending: PendingToolUse | None = None

    def close(self) -> PendingToolUse:
        """Parse the gathered input; never raises, a bad input is recorded instead."""
        raw = "".join(self.parts).strip()
        parsed: Any = {}
        error: str | None = None
        if raw:
            try:
                value = upstream_json.loads(raw)
            except ValueError as exc:
                error = f"tool input is not valid JSON: {exc}"
            else:
                if isinstance(value, dict):
                    parsed = value
                else:
                    error = f"tool input is not a JSON object: got {type(value).__name__}"
        self.closed = True
        self.pending = PendingToolUse(self.tool, self.tool_use_id, parsed, error)
        return self.pending

    def content(self) -> dict[str, Any]:
        """The block as Bedrock expects it back."""
        parsed = self.pending.input if self.pending is not None else {}
        return {"toolUse": {"toolUseId": self.tool_use_id, "name": self.tool, "input": parsed}}


@dataclass
class _ReasoningBlock:
    """State of a reasoning block: visible text plus signature, or opaque redacted bytes."""

    parts: list[str] = field(default_factory=list)
    signature_parts: list[str] = field(default_factory=list)
    redacted: bytearray | None = None
    closed: bool = False

    def content(self) -> dict[str, Any] | None:
        """The block as Bedrock expects it back, or None when nothing arrived."""
        if self.redacted is not None:
            return {"reasoningContent": {"redactedContent": bytes(self.redacted)}}
        text = "".join(self.parts)
        signature = "".join(self.signature_parts)
        if not text and not signature:
            return None
        reasoning: dict[str, Any] = {"text": text}
        if signature:
            reasoning["signature"] = signature
        return {"reasoningContent": {"reasoningText": reasoning}}


_Block = _TextBlock | _ToolBlock | _ReasoningBlock


class BedrockStreamParser:
    """Parse one ConverseStream response, event by event, into canonical events and a TurnResult."""

    def __init__(self, turn: int = 1) -> None:
        self.turn = turn
        self.role: str | None = None
        self.stop_reason: str | None = None
        self.usage = Usage()
        self.latency_ms: int | None = None
        self._blocks: dict[int, _Block] = {}
        self._handlers: dict[str, Callable[[dict[str, Any]], list[Event]]] = {
            "messageStart": self._on_message_start,
            "contentBlockStart": self._on_block_start,
            "contentBlockDelta": self._on_block_delta,
            "contentBlockStop": self._on_block_stop,
            "messageStop": self._on_message_stop,
            "metadata": self._on_metadata,
        }
        self._delta_handlers: dict[str, Callable[[int, Any], list[Event]]] = {
            "text": self._on_text_delta,
            "toolUse": self._on_tool_input_delta,
            "reasoningContent": self._on_reasoning_delta,
        }

    # -- public API -------------------------------------------------------------------------

    def feed(self, event: dict[str, Any]) -> list[Event]:
        """Take one stream event; return the canonical events to emit now."""
        emitted: list[Event] = []
        # boto3 yields one key per event; walking all keys just keeps an odd event from being lost.
        for key, payload in event.items():
            if key.endswith("Exception"):
                raise _stream_exception_event(key, payload)
            handler = self._handlers.get(key)
            if handler is None:
                continue  # a newer event kind than this parser knows: not worth failing a run
            emitted.extend(handler(payload if isinstance(payload, dict) else {}))
        return emitted

    def text_so_far(self) -> str:
        """The answer's text received so far, for a turn that will not finish."""
        return "".join(
            "".join(block.parts) for _, block in sorted(self._blocks.items()) if isinstance(block, _TextBlock)
        )

    def result(self) -> TurnResult:
        """The finished turn; raises ProviderError if the stream ended without messageStop."""
        if self.stop_reason is None:
            raise ProviderError(
                "model stream ended without messageStop", code="incomplete_stream", retryable=False
            )
        content: list[dict[str, Any]] = []
        tool_uses: list[PendingToolUse] = []
        texts: list[str] = []
        for index in sorted(self._blocks):
            block = self._blocks[index]
            if isinstance(block, _TextBlock):
                texts.append("".join(block.parts))
            elif isinstance(block, _ToolBlock) and block.pending is not None:
                tool_uses.append(block.pending)
            item = block.content()
            if item is not None:
                content.append(item)
        return TurnResult(
            message={"role": "assistant", "content": content},
            stop_reason=self.stop_reason,
            usage=self.usage,
            latency_ms=self.latency_ms,
            tool_uses=tool_uses,
            # Joined with "" so it equals what the client saw by concatenating the TextDeltas.
            text="".join(texts),
        )

    # -- event handlers ---------------------------------------------------------------------

    def _on_message_start(self, payload: dict[str, Any]) -> list[Event]:
        role = payload.get("role")
        self.role = role if isinstance(role, str) else "assistant"
        return []

    def _on_block_start(self, payload: dict[str, Any]) -> list[Event]:
        index = _block_index(payload)
        start = payload.get("start")
        start = start if isinstance(start, dict) else {}
        if "toolUse" in start:
            if index in self._blocks:
                return []
            spec = start["toolUse"] if isinstance(start["toolUse"], dict) else {}
            block = _ToolBlock(tool=str(spec.get("name", "")), tool_use_id=str(spec.get("toolUseId", "")))
            self._blocks[index] = block
            return [ToolUseStart(tool=block.tool, tool_use_id=block.tool_use_id, turn=self.turn)]
        if "reasoningContent" in start:
            self._blocks.setdefault(index, _ReasoningBlock())
            return []
        if "text" in start:
            # Older streams announced text blocks; any text carried by the start counts as a delta.
            self._blocks.setdefault(index, _TextBlock())
            return self._on_text_delta(index, start["text"])
        return []  # an empty or unknown start: the first delta decides the block's kind

    def _on_block_delta(self, payload: dict[str, Any]) -> list[Event]:
        index = _block_index(payload)
        delta = payload.get("delta")
        if not isinstance(delta, dict):
            return []
        emitted: list[Event] = []
        for kind, value in delta.items():
            handler = self._delta_handlers.get(kind)
            if handler is not None:  # citations, images and later kinds are not ours to render
                emitted.extend(handler(index, value))
        return emitted

    def _on_block_stop(self, payload: dict[str, Any]) -> list[Event]:
        block = self._blocks.get(_block_index(payload))
        return self._close(block) if block is not None else []

    def _on_message_stop(self, payload: dict[str, Any]) -> list[Event]:
        reason = payload.get("stopReason")
        self.stop_reason = reason if isinstance(reason, str) and reason else "unknown"
        emitted: list[Event] = []
        # A block left open by the model still belongs to the message; close it here.
        for index in sorted(self._blocks):
            emitted.extend(self._close(self._blocks[index]))
        return emitted

    def _on_metadata(self, payload: dict[str, Any]) -> list[Event]:
        usage = payload.get("usage")
        if isinstance(usage, dict):
            self.usage = _usage(usage, "inputTokens", "outputTokens", "totalTokens")
        metrics = payload.get("metrics")
        if isinstance(metrics, dict) and "latencyMs" in metrics:
            self.latency_ms = _as_int(metrics["latencyMs"])
        return []

    # -- delta handlers ---------------------------------------------------------------------

    def _on_text_delta(self, index: int, text: Any) -> list[Event]:
        if not isinstance(text, str):
            return []
        block = self._blocks.setdefault(index, _TextBlock())
        if not isinstance(block, _TextBlock) or block.closed or not text:
            return []
        block.parts.append(text)
        return [TextDelta(text=text, turn=self.turn)]

    def _on_tool_input_delta(self, index: int, value: Any) -> list[Event]:
        block = self._blocks.get(index)
        # Without its start the tool's name and id are unknown, so the fragment cannot be used.
        if not isinstance(block, _ToolBlock) or block.closed or not isinstance(value, dict):
            return []
        fragment = value.get("input")
        if not isinstance(fragment, str) or not fragment:
            return []
        block.parts.append(fragment)
        return [ToolInputDelta(tool_use_id=block.tool_use_id, delta=fragment, turn=self.turn)]

    def _on_reasoning_delta(self, index: int, value: Any) -> list[Event]:
        if not isinstance(value, dict):
            return []
        block = self._blocks.setdefault(index, _ReasoningBlock())
        if not isinstance(block, _ReasoningBlock) or block.closed:
            return []
        emitted: list[Event] = []
        text = value.get("text")
        if isinstance(text, str) and text:
            block.parts.append(text)
            emitted.append(ReasoningDelta(text=text, turn=self.turn))
        signature = value.get("signature")
        if isinstance(signature, str) and signature:
            # Kept verbatim: the model checks it when the message is sent back next turn.
            block.signature_parts.append(signature)
        redacted = value.get("redactedContent")
        if isinstance(redacted, (bytes, bytearray, str)):
            chunk = redacted.encode() if isinstance(redacted, str) else bytes(redacted)
            block.redacted = (block.redacted or bytearray()) + chunk
        return emitted

    # -- helpers ----------------------------------------------------------------------------

    def _close(self, block: _Block) -> list[Event]:
        if block.closed:
            return []
        if isinstance(block, _ToolBlock):
            pending = block.close()
            return [
                ToolUse(
                    tool=pending.tool,
                    tool_use_id=pending.tool_use_id,
                    input=pending.input,
                    turn=self.turn,
                )
            ]
        block.closed = True
        return []


def _block_index(payload: dict[str, Any]) -> int:
    """The payload's contentBlockIndex, 0 when missing or unusable."""
    index = _as_int(payload.get("contentBlockIndex"))
    return index if index is not None else 0


def _usage(raw: dict[str, Any], input_key: str, output_key: str, total_key: str) -> Usage:
    """Usage from a provider's own field names; a missing total is the sum."""
    input_tokens = _as_int(raw.get(input_key)) or 0
    output_tokens = _as_int(raw.get(output_key)) or 0
    total = _as_int(raw.get(total_key))
    return Usage(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        total_tokens=total if total is not None else input_tokens + output_tokens,
    )


def _as_int(value: Any) -> int | None:
    """``value`` as an int, or None when it is not a number."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return int(value)
    return None


def _describe(code: str, message: str) -> str:
    """A user-facing sentence for an upstream error code and Bedrock's own message."""
    prefix = _DESCRIPTIONS.get(code.lower(), "Bedrock returned an error")
    return f"{prefix} ({code}): {message}" if message else f"{prefix} ({code})"


def _stream_exception_event(key: str, payload: Any) -> ModelStreamError:
    """The error for an exception event found inside the stream."""
    message = payload.get("message") if isinstance(payload, dict) else payload
    message = message if isinstance(message, str) else ""
    return ModelStreamError(_describe(key, message), code=key, retryable=key in RETRYABLE_STREAM_ERRORS)


def _client_error_parts(exc: botocore_exceptions.ClientError) -> tuple[str, str, int | None]:
    """Code, message and HTTP status out of a botocore ClientError's response dict."""
    response = exc.response if isinstance(exc.response, dict) else {}
    error = response.get("Error") if isinstance(response.get("Error"), dict) else {}
    code = str(error.get("Code") or "Unknown")
    message = str(error.get("Message") or "")
    metadata = response.get("ResponseMetadata")
    status = _as_int(metadata.get("HTTPStatusCode")) if isinstance(metadata, dict) else None
    return code, message, status


def stream_error_from_exception(exc: BaseException) -> ProviderError:
    """Map an exception raised by boto3 (before or during the stream) to a ProviderError."""
    if isinstance(exc, ProviderError):
        return exc
    if isinstance(exc, botocore_exceptions.EventStreamError):
        code, message, _ = _client_error_parts(exc)
        return ModelStreamError(
            _describe(code, message), code=code, retryable=code.lower() in _RETRYABLE_STREAM_CODES
        )
    if isinstance(exc, botocore_exceptions.ClientError):
        code, message, status = _client_error_parts(exc)
        retryable = code.lower() in _RETRYABLE_CODES or status == 429 or (status or 0) >= 500
        return ProviderError(_describe(code, message), code=code, retryable=retryable)
    if isinstance(exc, (botocore_exceptions.NoCredentialsError, botocore_exceptions.PartialCredentialsError)):
        return ProviderError(
            f"No usable AWS credentials were found for Bedrock: {exc}",
            code="no_credentials",
            retryable=False,
        )
    if isinstance(exc, botocore_exceptions.NoRegionError):
        return ProviderError(
            "No AWS region is configured for Bedrock; set AWS_REGION or AWS_DEFAULT_REGION",
            code="no_region",
            retryable=False,
        )
    # Timeouts are tested before the connection errors they subclass, to keep their own code.
    if isinstance(exc, (botocore_exceptions.ReadTimeoutError, urllib3.exceptions.ReadTimeoutError)):
        return ProviderError(f"Bedrock did not answer in time: {exc}", code="read_timeout", retryable=True)
    if isinstance(exc, botocore_exceptions.ConnectTimeoutError):
        return ProviderError(
            f"Could not reach Bedrock in time: {exc}", code="connect_timeout", retryable=True
        )
    if isinstance(
        exc,
        (
            botocore_exceptions.ConnectionError,
            botocore_exceptions.HTTPClientError,
            urllib3.exceptions.ProtocolError,
            builtins.ConnectionError,
        ),
    ):
        return ProviderError(
            f"The connection to Bedrock failed: {exc}", code="connection_error", retryable=True
        )
    if isinstance(exc, RecursionError):
        # botocore parses the stream's frames and error bodies with json.loads, which gives up
        # on JSON nested about a thousand levels deep.
        return ProviderError(
            f"Bedrock sent JSON nested too deeply to read: {exc}", code="malformed_chunk", retryable=False
        )
    if isinstance(exc, builtins.TimeoutError):
        return ProviderError(
            f"Bedrock did not answer in time: {exc or 'timed out'}",
            code="read_timeout",
            retryable=True,
        )
    detail = str(exc)
    return ProviderError(
        f"The Bedrock call failed ({type(exc).__name__}){': ' + detail if detail else ''}",
        code="provider_error",
        retryable=False,
    )


# --- OpenAI-compatible chat-completions streams ------------------------------------------------

DONE = "[DONE]"

# OpenAI's finish reasons in Bedrock's words: the agent loop and every client speak one vocabulary.
# A reason not listed here is passed on as it came.
OPENAI_FINISH_REASONS: dict[str, str] = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "length": "max_tokens",
    "content_filter": "content_filtered",
}

# Error codes found inside an OpenAI-compatible stream that a retry may cure (compared lowercased):
# OpenAI's own, plus Bedrock's, which the Bedrock Access Gateway passes through.
_RETRYABLE_OPENAI_CODES = (
    _RETRYABLE_CODES
    | _RETRYABLE_STREAM_CODES
    | {
        "rate_limit_exceeded",
        "rate_limit_error",
        "server_error",
        "overloaded_error",
    }
)

# The Bedrock Access Gateway reports a mid-stream failure as {"error": {"message": str(exc)}} with
# boto3's text, "An error occurred (throttlingException) when calling ...": the code is in there.
_BOTO_CODE_RE = re.compile(r"An error occurred \(([A-Za-z][A-Za-z0-9_.]*)\)")


@dataclass
class _StreamedToolCall:
    """One tool call streamed under its ``index``: a Bedrock tool block plus whether it was announced."""

    block: _ToolBlock
    started: bool = False


class OpenAIStreamParser:
    """Parse one OpenAI-compatible chat-completions stream, chunk by chunk, into events and a TurnResult."""

    def __init__(self, turn: int = 1) -> None:
        self.turn = turn
        self.finish_reason: str | None = None  # as the server sent it
        self.stop_reason: str | None = None  # in Bedrock's words; set by finish_reason or [DONE]
        self.usage = Usage()
        self.latency_ms: int | None = None  # the wire carries no latency
        self.done = False
        self._text = _TextBlock()
        self._reasoning = _ReasoningBlock()
        self._tools: dict[int, _StreamedToolCall] = {}
        self._closed = False  # the tool calls are parsed: later deltas cannot change the message

    # -- public API -------------------------------------------------------------------------

    def feed(self, event: dict[str, Any] | str) -> list[Event]:
        """Take one chunk (the JSON object of a ``data:`` line) or ``"[DONE]"``; return events to emit now."""
        if isinstance(event, str):
            if event.strip() != DONE:
                raise ProviderError(
                    f"The model stream sent a data line that is not JSON: {event[:80]!r}",
                    code="malformed_chunk",
                )
            return self._on_done()
        if not isinstance(event, dict):
            raise ProviderError(
                f"The model stream sent a chunk that is not a JSON object: {type(event).__name__}",
                code="malformed_chunk",
            )
        if self.done:
            return []  # [DONE] is the last word; anything after it is not part of the answer
        error = event.get("error")
        if error:
            raise _openai_stream_error(error)
        usage = event.get("usage")
        if isinstance(usage, dict):
            self._on_usage(usage)
        choice = _first_choice(event.get("choices"))
        if choice is None:
            return []  # the usage chunk (choices: []), or a keep-alive
        emitted: list[Event] = []
        delta = choice.get("delta")
        if isinstance(delta, dict) and not self._closed:
            emitted.extend(self._on_delta(delta))
        reason = choice.get("finish_reason")
        if isinstance(reason, str) and reason and self.finish_reason is None:
            self.finish_reason = reason
            self.stop_reason = OPENAI_FINISH_REASONS.get(reason, reason)
            emitted.extend(self._close())
        return emitted

    def text_so_far(self) -> str:
        """The answer's text received so far, for a turn that will not finish."""
        return "".join(self._text.parts)

    def result(self) -> TurnResult:
        """The finished turn; raises ProviderError if neither a finish_reason nor [DONE] arrived."""
        if self.stop_reason is None:
            raise ProviderError(
                "The model stream ended without a finish_reason or [DONE]: the answer is incomplete",
                code="incomplete_stream",
                retryable=False,
            )
        content: list[dict[str, Any]] = []
        for item in (self._reasoning.content(), self._text.content()):
            if item is not None:
                content.append(item)
        tool_uses: list[PendingToolUse] = []
        for index in sorted(self._tools):
            block = self._tools[index].block
            if block.pending is not None:
                tool_uses.append(block.pending)
                content.append(block.content())
        return TurnResult(
            message={"role": "assistant", "content": content},
            stop_reason=self.stop_reason,
            usage=self.usage,
            latency_ms=self.latency_ms,
            tool_uses=tool_uses,
            text=self.text_so_far(),
        )

    # -- chunk parts ------------------------------------------------------------------------

    def _on_delta(self, delta: dict[str, Any]) -> list[Event]:
        emitted: list[Event] = []
        # "reasoning_content" is what the Bedrock Access Gateway and DeepSeek send; vLLM says "reasoning".
        for key in ("reasoning_content", "reasoning"):
            reasoning = delta.get(key)
            if isinstance(reasoning, str) and reasoning:
                self._reasoning.parts.append(reasoning)
                emitted.append(ReasoningDelta(text=reasoning, turn=self.turn))
                break
        text = delta.get("content")
        if isinstance(text, str) and text:
            self._text.parts.append(text)
            emitted.append(TextDelta(text=text, turn=self.turn))
        tool_calls = delta.get("tool_calls")
        if isinstance(tool_calls, list):
            for piece in tool_calls:
                if isinstance(piece, dict):
                    emitted.extend(self._on_tool_call_piece(piece))
        function_call = delta.get("function_call")
        if isinstance(function_call, dict):
            # The deprecated single-function form: one call, always at index 0.
            emitted.extend(self._on_tool_call_piece({"index": 0, "function": function_call}))
        return emitted

    def _on_tool_call_piece(self, piece: dict[str, Any]) -> list[Event]:
        index = self._tool_index(piece)
        call = self._tools.get(index)
        if call is None:
            call = self._tools[index] = _StreamedToolCall(_ToolBlock(tool="", tool_use_id=""))
        block = call.block
        ident = piece.get("id")
        if isinstance(ident, str) and ident and not block.tool_use_id:
            block.tool_use_id = ident
        function = piece.get("function")
        function = function if isinstance(function, dict) else {}
        name = function.get("name")
        if isinstance(name, str) and name and not block.tool:
            block.tool = name
        emitted: list[Event] = []
        if not call.started and block.tool:
            emitted.extend(self._start(index, call))
        fragment = function.get("arguments")
        if isinstance(fragment, dict):
            # A few servers send the arguments as an object rather than JSON text.
            fragment = json.dumps(fragment)
        if isinstance(fragment, str) and fragment:
            block.parts.append(fragment)
            if call.started:
                emitted.append(ToolInputDelta(tool_use_id=block.tool_use_id, delta=fragment, turn=self.turn))
        return emitted

    def _tool_index(self, piece: dict[str, Any]) -> int:
        index = _as_int(piece.get("index"))
        if index is not None:
            return index
        # Some servers leave the index out: a new id opens a new call, anything else continues the last.
        ident = piece.get("id")
        known = any(call.block.tool_use_id == ident for call in self._tools.values())
        if isinstance(ident, str) and ident and not known:
            return max(self._tools, default=-1) + 1
        return max(self._tools, default=0)

    def _start(self, index: int, call: _StreamedToolCall) -> list[Event]:
        """Announce a tool call; arguments that came before its name are passed on in one piece."""
        call.started = True
        block = call.block
        if not block.tool_use_id:
            # The tool result must name the call; a turn-scoped id keeps it unique in the conversation.
            block.tool_use_id = f"call_t{self.turn}_{index}"
        emitted: list[Event] = [ToolUseStart(tool=block.tool, tool_use_id=block.tool_use_id, turn=self.turn)]
        held = "".join(block.parts)
        if held:
            emitted.append(ToolInputDelta(tool_use_id=block.tool_use_id, delta=held, turn=self.turn))
        return emitted

    def _on_usage(self, usage: dict[str, Any]) -> None:
        self.usage = _usage(usage, "prompt_tokens", "completion_tokens", "total_tokens")

    def _on_done(self) -> list[Event]:
        self.done = True
        if self.stop_reason is None:
            # [DONE] without a finish_reason: infer the reason from what the answer holds.
            self.stop_reason = "tool_use" if self._tools else "end_turn"
        return self._close()

    def _close(self) -> list[Event]:
        """Parse every tool call's input, once; the ToolUse events follow in index order."""
        if self._closed:
            return []
        self._closed = True
        self._text.closed = True
        self._reasoning.closed = True
        emitted: list[Event] = []
        for index in sorted(self._tools):
            call = self._tools[index]
            if not call.started:
                emitted.extend(self._start(index, call))
            pending = call.block.close()
            emitted.append(
                ToolUse(
                    tool=pending.tool, tool_use_id=pending.tool_use_id, input=pending.input, turn=self.turn
                )
            )
        return emitted


def _first_choice(choices: Any) -> dict[str, Any] | None:
    """The choice with index 0 (the only one asked for), or the first one when none is numbered."""
    if not isinstance(choices, list):
        return None
    dicts = [choice for choice in choices if isinstance(choice, dict)]
    for choice in dicts:
        if _as_int(choice.get("index")) == 0:
            return choice
    return dicts[0] if dicts else None


def _openai_stream_error(error: Any) -> ModelStreamError:
    """The error for an ``{"error": ...}`` chunk inside an OpenAI-compatible stream."""
    message = ""
    code = ""
    status: int | None = None
    if isinstance(error, dict):
        raw_message = error.get("message")
        message = raw_message if isinstance(raw_message, str) else ""
        for key in ("code", "type"):
            value = error.get(key)
            if isinstance(value, str) and value:
                code = value
                break
            if isinstance(value, int) and not isinstance(value, bool):
                status = value
                code = f"http_{value}"
                break
    else:
        message = str(error)
    if not code:
        match = _BOTO_CODE_RE.search(message)
        code = match.group(1) if match else "stream_error"
    retryable = code.lower() in _RETRYABLE_OPENAI_CODES or status == 429 or (status or 0) >= 500
    text = f"The model endpoint reported an error mid-stream ({code})"
    return ModelStreamError(f"{text}: {message}" if message else text, code=code, retryable=retryable)
