"""Amazon Bedrock ConverseStream through aiobotocore, read on the event loop.

aiobotocore is botocore on aiohttp: the same credential chain, region and endpoint settings
(``AWS_ENDPOINT_URL_BEDROCK_RUNTIME`` among them), SigV4 signing, retries of a throttle or 5xx
before the stream, and the same service model, with every read awaited instead of blocking a
thread. So a stream costs a coroutine and a socket, not a thread: hundreds of live streams run on
the loop's one thread.

The response body is read a socket read at a time and cut into frames by
:mod:`service.providers.bedrock_events`; the per-token deltas are built there, every other event
is parsed by aiobotocore's own EventStream parser (exception frames raise as they always did).

One client per provider, made on first use (an ``AsyncExitStack`` holds it until :meth:`close`).
Its aiohttp connection pool is sized for the configured number of concurrent runs. Leaving a
stream early (the client went away, the run was cancelled, the read timed out) closes its HTTP
response, which drops the connection at once rather than returning it to the pool half read;
a stream read to its end gives its connection back for the next request.

:meth:`BedrockProvider.stream` feeds the events to
:class:`~service.providers.bedrock_stream.BedrockStreamParser`: the turn's canonical events,
then its result.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import socket
import threading
from collections.abc import AsyncGenerator, Iterable
from typing import Any

import aiohttp
from aiobotocore.config import AioConfig
from aiobotocore.session import AioSession
from botocore.context import get_context

from service.core.admission import Admission
from service.core.burst import Burst
from service.core.events import Event, Sink
from service.errors import ProviderError
from service.providers.base import POOL_IDLE_S, ModelRequest, TurnResult, alternate_roles, appended_by_sink
from service.providers.bedrock_events import (
    FrameDecoder,
    delta_body,
    event_of,
    event_plans,
    plain_event,
    text_of,
)
from service.providers.bedrock_stream import BedrockStreamParser, stream_error_from_exception

SERVICE = "bedrock-runtime"
# Headers the turn under way adds to its request (its trace context), set around the call.
_UPSTREAM_HEADERS: contextvars.ContextVar[tuple[tuple[str, str], ...]] = contextvars.ContextVar(
    "bedrock_upstream_headers", default=()
)


def _add_headers(request: Any, **_: Any) -> None:
    """botocore's ``before-send``: the turn's own headers (its W3C ``traceparent``, so a traced
    upstream continues the trace), after signing: they are not signed and change nothing else."""
    for name, value in _UPSTREAM_HEADERS.get():
        request.headers[name] = value


def _tool_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """A tool spec (``name``, ``description``, ``input_schema``) as a ConverseStream ``toolSpec``.

    A client's tools may come without a description (OpenAI's is optional) or a schema; Bedrock
    refuses an empty description, so none is sent then, and a missing schema takes no input.
    """
    out: dict[str, Any] = {
        "name": spec["name"],
        "inputSchema": {"json": spec.get("input_schema") or {"type": "object", "properties": {}}},
    }
    if spec.get("description"):
        out["description"] = spec["description"]
    return out


def _keepalive_socket(addr_info: Any) -> socket.socket:
    """A TCP socket with keep-alive on: a model thinking for a minute sends nothing meanwhile."""
    family, type_, proto, _, _ = addr_info
    sock = socket.socket(family=family, type=type_, proto=proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    return sock


def _parsed(event: dict[str, Any], parser: BedrockStreamParser | None) -> Iterable[Any]:
    """What a stream yields for one of botocore's events: the event, or its parser's events."""
    return (event,) if parser is None else parser.feed(event)


def _cache_user_agent(client: Any) -> None:
    """Build the client's User-Agent header once per set of features, not twice per request.

    botocore rebuilds the header for every request (when it makes it, then again before sending,
    to add the request's feature codes), sanitising each of a dozen components each time, a
    noticeable share of a request's CPU in the service (measured: docs/benchmarks.md, section
    Write-through delivery and the per-token work (89119d6)). Every part but the features is fixed
    for a client, so the string is kept per set of features and is the same as botocore's. A
    botocore without this builder is left as it is.
    """
    creator = getattr(client, "_user_agent_creator", None)
    build = getattr(creator, "to_string", None)
    if build is None:
        return
    built: dict[frozenset[str], str] = {}

    def to_string() -> str:
        context = get_context()
        features = frozenset(context.features) if context is not None else frozenset()
        user_agent = built.get(features)
        if user_agent is None:
            user_agent = build()
            if len(built) < 64:
                built[features] = user_agent
        return user_agent

    creator.to_string = to_string


class StallWatch:
    """Ends a response body whose upstream sends nothing for ``timeout`` seconds, at a cost per
    read of one counter.

    aiohttp's own ``sock_read`` timeout does the same by cancelling and re-arming a timer on every
    read the socket makes: with hundreds of streams at a token per read, that is a timer's work per
    token, a visible part of the service's CPU per token (measured: docs/benchmarks.md, section
    Write-through delivery and the per-token work (89119d6)). Once the response's headers are in,
    the stream is watched here instead: a timer every quarter of ``timeout`` looks whether
    :attr:`reads` moved, and a stream that stood still for ``timeout`` gets aiohttp's own
    ``SocketTimeoutError``, the error aiohttp's timeout raises (within a quarter of ``timeout``
    later than aiohttp would). The wait for the headers keeps aiohttp's timeout.
    """

    __slots__ = ("_handle", "_loop", "_raw", "_seen", "_since", "_step", "_timeout", "reads")

    def __init__(self, raw: aiohttp.ClientResponse, timeout: float | None) -> None:
        self.reads = 0
        self._raw = raw
        self._handle: asyncio.TimerHandle | None = None
        if not timeout:
            return
        connection = raw.connection
        protocol = connection.protocol if connection is not None else None
        if protocol is None:
            return  # the whole body is in already: nothing left to wait for
        protocol.read_timeout = None  # aiohttp drops its timer at the next read
        self._loop = asyncio.get_running_loop()
        self._timeout = timeout
        self._step = timeout / 4
        self._seen = 0
        self._since = self._loop.time()
        self._handle = self._loop.call_later(self._step, self._check)

    def _check(self) -> None:
        now = self._loop.time()
        if self.reads != self._seen:
            self._seen, self._since = self.reads, now
        elif now - self._since >= self._timeout:
            self._handle = None
            self._raw.content.set_exception(aiohttp.SocketTimeoutError("Timeout on reading data from socket"))
            return
        self._handle = self._loop.call_later(self._step, self._check)

    def close(self) -> None:
        """Stop watching (the stream ended, one way or another)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


class BedrockProvider:
    """ConverseStream on Bedrock (or anything that speaks its wire format, like the emulator)."""

    name = "bedrock"

    def __init__(
        self,
        *,
        model_id: str,
        max_concurrent_runs: int = 256,
        endpoint_url: str | None = None,
        region_name: str | None = None,
        credentials: dict[str, str] | None = None,
        max_attempts: int = 3,
        read_timeout: float = 120.0,
        connect_timeout: float = 10.0,
    ) -> None:
        self.model_id = model_id
        self._session = AioSession()
        # botocore reads AWS_DEFAULT_REGION and ~/.aws/config; AWS_REGION is what other SDKs and
        # Lambda set. Resolved here, so that a missing region stops the service at start.
        region = region_name or self._session.get_config_variable("region") or os.environ.get("AWS_REGION")
        if not region:
            raise ProviderError(
                "no AWS region is configured for Bedrock: set AWS_DEFAULT_REGION (or AWS_REGION, "
                "or a region in ~/.aws/config)",
                code="no_region",
            )
        self._region: str = region
        config = AioConfig(
            # botocore's own check of the arguments against the model costs CPU on every request
            # (measured: docs/benchmarks.md, section Per-run work and the sink (c25db1d)) and
            # checks what request_kwargs made from validated input; Bedrock still refuses a bad
            # request, as a ValidationException.
            parameter_validation=False,
            max_pool_connections=max_concurrent_runs,
            retries={"mode": "standard", "max_attempts": max_attempts},
            read_timeout=read_timeout,
            connect_timeout=connect_timeout,
            connector_args={"socket_factory": _keepalive_socket, "keepalive_timeout": POOL_IDLE_S},
        )
        self._read_timeout = read_timeout
        self._client_kwargs: dict[str, Any] = {"region_name": region, "config": config, **(credentials or {})}
        # Pass an endpoint only when one is configured, so botocore's own
        # AWS_ENDPOINT_URL_BEDROCK_RUNTIME keeps working.
        if endpoint_url:
            self._client_kwargs["endpoint_url"] = endpoint_url
        # The service model and endpoint rules are files: read them now, at start, rather than
        # on the event loop when the first request makes the client.
        self._session.warm_up_loader_caches(SERVICE)
        self.admission = Admission()
        self._client: Any = None
        self._plans: dict[str, Any] = {}  # how to read the answer's other events (event_plans)
        self._client_lock = asyncio.Lock()
        self._exit_stack = contextlib.AsyncExitStack()
        self._active = 0
        # wait_idle is called from other threads (tests, drain), hence a condition, not an Event.
        self._idle = threading.Condition()

    @property
    def active_streams(self) -> int:
        """Streams currently open."""
        return self._active

    def wait_idle(self, timeout: float) -> bool:
        """Block until no stream is open; False on timeout (for tests and drain, from a thread)."""
        with self._idle:
            return self._idle.wait_for(lambda: self._active == 0, timeout)

    @property
    def server_url(self) -> str:
        """Where the turns go (for traces' ``server.address``): the endpoint configured, else
        the region's Bedrock runtime."""
        if self._client is not None:
            return str(self._client.meta.endpoint_url)
        return (
            self._client_kwargs.get("endpoint_url") or f"https://bedrock-runtime.{self._region}.amazonaws.com"
        )

    @property
    def region(self) -> str:
        """The AWS region the client talks to."""
        return self._client.meta.region_name if self._client is not None else self._region

    def request_kwargs(self, request: ModelRequest) -> dict[str, Any]:
        """The arguments of ``converse_stream`` for one turn."""
        inference: dict[str, Any] = {"maxTokens": request.max_tokens}
        if request.temperature is not None:
            inference["temperature"] = request.temperature
        kwargs: dict[str, Any] = {
            "modelId": request.model or self.model_id,
            "messages": alternate_roles(request.messages),
            "inferenceConfig": inference,
        }
        if request.system:
            kwargs["system"] = [{"text": request.system}]
        if request.tool_specs:
            kwargs["toolConfig"] = {"tools": [{"toolSpec": _tool_spec(spec)} for spec in request.tool_specs]}
        return kwargs

    async def start(self) -> None:
        """Make the client now rather than on the first request (credentials are resolved here)."""
        await self._get_client()

    async def _get_client(self) -> Any:
        if self._client is None:
            async with self._client_lock:  # hundreds of first requests at once make one client
                if self._client is None:
                    client = await self._exit_stack.enter_async_context(
                        self._session.create_client(SERVICE, **self._client_kwargs)
                    )
                    _cache_user_agent(client)
                    client.meta.events.register(f"before-send.{SERVICE}.ConverseStream", _add_headers)
                    stream = client.meta.service_model.operation_model("ConverseStream").output_shape
                    self._plans = event_plans(stream.members["stream"])
                    self._client = client
        return self._client

    def stream(
        self, request: ModelRequest, turn: int = 1, sink: Sink | None = None
    ) -> AsyncGenerator[Event | TurnResult, None]:
        """One turn's canonical events, then its result (the text deltas ``sink`` takes are not
        yielded); errors are raised as :class:`ProviderError`."""
        return self._read(request, BedrockStreamParser(turn=turn), sink)

    def raw_stream(self, request: ModelRequest) -> AsyncGenerator[dict[str, Any], None]:
        """Yield ConverseStream events as botocore parses them; errors are raised as
        :class:`ProviderError`."""
        return self._read(request, None)

    async def _read(
        self, request: ModelRequest, parser: BedrockStreamParser | None, sink: Sink | None = None
    ) -> AsyncGenerator[Any, None]:
        """The response's events: botocore's dicts, or with ``parser`` its canonical events and
        then the turn's result (a text delta then goes to the parser without its dict, and to
        ``sink`` before it is yielded)."""
        await self.admission.enter()  # a burst of new requests starts a few per loop turn
        kwargs = self.request_kwargs(request)
        self._opened()
        events: Any = None
        try:
            try:
                client = await self._get_client()
                # The turn's trace context goes on the request (see _add_headers), which botocore
                # builds inside this call, on this task.
                carried = _UPSTREAM_HEADERS.set(request.headers) if request.headers else None
                try:
                    response = await client.converse_stream(**kwargs)
                finally:
                    if carried is not None:
                        _UPSTREAM_HEADERS.reset(carried)
                events = response["stream"]
                if parser is not None:
                    parser.response_id = _request_id(response)
                    parser.response_model = str(kwargs.get("modelId", ""))
                raw = getattr(events, "_raw_stream", None)
                if not isinstance(raw, aiohttp.ClientResponse):  # not aiohttp: aiobotocore's own reader
                    async for event in events:
                        for item in _parsed(event, parser):
                            if not appended_by_sink(item, sink):
                                yield item
                else:
                    async with contextlib.aclosing(self._frames(raw, events, parser, sink)) as frames:
                        async for item in frames:
                            yield item
                if parser is not None:
                    yield parser.result()
            except Exception as exc:  # not GeneratorExit nor CancelledError: those just close
                raise stream_error_from_exception(exc) from exc
        finally:
            if events is not None:
                # Drops the connection unless the stream was read to its end (then it is back in
                # the pool already and this does nothing).
                events.close()
            self._closed()

    async def _frames(
        self,
        raw: aiohttp.ClientResponse,
        events: Any,
        parser: BedrockStreamParser | None,
        sink: Sink | None = None,
    ) -> AsyncGenerator[Any, None]:
        """The body read a socket read at a time: each read's frames at once (one wake-up per
        read, and a :class:`~service.core.burst.Burst` around them when there are several), a
        text delta straight to ``parser``, the rest through botocore's parser."""
        decoder = FrameDecoder()
        stall = StallWatch(raw, self._read_timeout)
        try:
            while data := await raw.content.readany():
                stall.reads += 1
                frames = decoder.feed(data)
                burst = Burst() if len(frames) > 1 else None
                try:
                    for frame in frames:
                        body = delta_body(frame)
                        if body is not None and parser is not None:
                            text = text_of(body)
                            if text is not None:
                                delta = parser.text(*text)
                                if delta is not None and (sink is None or not sink(delta)):
                                    yield delta
                                continue
                        event = event_of(body) if body is not None else plain_event(frame, self._plans)
                        if event is None:
                            event = await events._parse_event(frame.message())
                        if event:  # botocore skips what parses to nothing (an unknown event type)
                            for item in _parsed(event, parser):
                                if not appended_by_sink(item, sink):
                                    yield item
                finally:
                    if burst is not None:
                        burst.end()
        finally:
            stall.close()

    def _opened(self) -> None:
        with self._idle:
            self._active += 1

    def _closed(self) -> None:
        with self._idle:
            self._active -= 1
            self._idle.notify_all()

    async def close(self) -> None:
        """Close the client and its connections."""
        self._client = None
        await self._exit_stack.aclose()


def _request_id(response: dict[str, Any]) -> str:
    metadata = response.get("ResponseMetadata")
    return str(metadata.get("RequestId") or "") if isinstance(metadata, dict) else ""
