"""The emulator's HTTP server: Bedrock's ConverseStream over real HTTP, plus its records.

Routes:

- ``POST /model/{modelId}/converse-stream``: answers as Bedrock does, per the scripted plan of
  :mod:`service.emulator.script`, paced by :class:`EmulatorConfig` (or per-request directives).
- ``POST /v1/chat/completions``: the same plans as an OpenAI-compatible chat-completions stream
  (SSE), rendered by :mod:`service.emulator.openai`; only ``"stream": true`` is served.
- ``GET /_emulator/records``: JSON list of the recent :class:`RequestRecord` entries.

:class:`~service.emulator.embedded.EmbeddedEmulator` serves the app from a thread of its own.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from service.emulator.bedrock import encode_metadata, error_body, render_steps
from service.emulator.eventstream import CONTENT_TYPE
from service.emulator.openai import CONTENT_TYPE as SSE_CONTENT_TYPE
from service.emulator.openai import bedrock_request, error_response, render_plan
from service.emulator.records import DEFAULT_MAX_RECORDS, RecordStore, RequestRecord
from service.emulator.request import system_text, tool_names
from service.emulator.script import DEFAULT_ANSWER_TOKENS, plan_response
from service.emulator.steps import HttpError, Plan, RaiseException


@dataclass(frozen=True, slots=True)
class EmulatorConfig:
    """Pacing and limits of the emulator; 0 disables the matching pacing."""

    ttft_ms: float = 0.0
    tokens_per_second: float = 0.0
    default_tokens: int = DEFAULT_ANSWER_TOKENS
    max_records: int = DEFAULT_MAX_RECORDS
    # The model's context window in input tokens (as the emulator counts them); a longer request
    # is refused with Bedrock's ValidationException. 0: no limit.
    context_tokens: int = 0
    # Keep when each token left the model in its request's record (``token_times``), so that a
    # benchmark can measure from there rather than from when the service logged it.
    record_token_times: bool = False


@dataclass(slots=True)
class _StreamTasks:
    """The handler tasks currently streaming, so that shutdown can end them promptly."""

    tasks: set[asyncio.Task[object]] = field(default_factory=set)
    stopping: bool = False


class _Pacer:
    """Paces the tokens of one response and records how far it got."""

    def __init__(
        self, interval: float, store: RecordStore, record: RequestRecord, record_times: bool = False
    ) -> None:
        self.interval = interval
        self.store = store
        self.record = record
        self.record_times = record_times
        self.loop = asyncio.get_running_loop()
        self.first: float | None = None
        self.tokens = 0

    async def wait(self, is_token: bool) -> None:
        """Before a write: hold a token until its deadline."""
        if not is_token:
            return
        if self.first is None:
            self.first = self.loop.time()
        elif self.interval:
            # Deadlines from the first token, not sleeps between writes, so that a busy loop
            # catches up instead of drifting slower than the asked rate.
            delay = self.first + self.tokens * self.interval - self.loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
        if self.record_times:
            self.store.token_produced(self.record, time.monotonic())

    def sent(self, is_token: bool) -> None:
        """After a write: count a token."""
        if not is_token:
            return
        self.tokens += 1
        if self.tokens == 1:
            self.store.update(self.record, deltas_sent=1, first_token_at=time.monotonic())
        else:
            self.store.update(self.record, deltas_sent=self.tokens)


CONFIG_KEY = web.AppKey("emulator_config", EmulatorConfig)
RECORDS_KEY = web.AppKey("emulator_records", RecordStore)
_STREAMS_KEY = web.AppKey("emulator_streams", _StreamTasks)


class _Stall:
    """``[emu:stall]``: the stream goes quiet after a number of tokens, as a stuck upstream does."""

    def __init__(self, plan: Plan) -> None:
        self.after = plan.stall_after_tokens
        self.ms = plan.stall_ms
        self.sent = 0

    async def maybe(self, sent: int) -> None:
        if self.after is not None and sent == self.after:
            await asyncio.sleep(self.ms / 1000.0)

    async def token_sent(self) -> None:
        self.sent += 1
        await self.maybe(self.sent)


ATTEMPTS_KEY = web.AppKey("attempts", dict)
MAX_REMEMBERED_REQUESTS = 10_000
# The listening socket's queue (aiohttp's default is 128): Bedrock takes a burst of hundreds of new
# connections at once without dropping any, and a stand-in that dropped SYNs would add its own
# retries of 1-7 s to whatever is measured through it.
LISTEN_BACKLOG = 4096


def _attempt(app: web.Application, raw: bytes) -> int:
    """How many times this very request body has come (1 for the first): a client's retries."""
    attempts: dict[str, int] = app[ATTEMPTS_KEY]
    key = hashlib.sha256(raw).hexdigest()
    if key not in attempts and len(attempts) >= MAX_REMEMBERED_REQUESTS:
        attempts.pop(next(iter(attempts)))
    attempts[key] = attempts.get(key, 0) + 1
    return attempts[key]


def create_emulator_app(config: EmulatorConfig | None = None) -> web.Application:
    """Build the emulator's aiohttp application."""
    config = config or EmulatorConfig()
    app = web.Application()
    app[CONFIG_KEY] = config
    app[RECORDS_KEY] = RecordStore(config.max_records)
    app[_STREAMS_KEY] = _StreamTasks()
    app[ATTEMPTS_KEY] = {}
    # ".+" because a model ARN holds "/" (sent as %2F), which a plain {modelId} would refuse.
    app.router.add_post("/model/{modelId:.+}/converse-stream", _converse_stream)
    app.router.add_post("/v1/chat/completions", _chat_completions)
    app.router.add_get("/_emulator/records", _records)
    app.on_shutdown.append(_end_streams)
    return app


async def _records(request: web.Request) -> web.Response:
    records = request.app[RECORDS_KEY].snapshot()
    return web.json_response([record.to_json() for record in records])


def _asked(body: Any) -> dict[str, Any]:
    """The system prompt and tool names of a ConverseStream body, for its record."""
    if not isinstance(body, dict):
        return {}
    return {"system": system_text(body), "tools": tuple(sorted(tool_names(body)))}


async def _end_streams(app: web.Application) -> None:
    # Without this, shutdown would wait (up to its timeout) for slow paced streams to finish.
    streams = app[_STREAMS_KEY]
    streams.stopping = True
    for task in list(streams.tasks):
        task.cancel()


async def _converse_stream(request: web.Request) -> web.StreamResponse:
    app = request.app
    config = app[CONFIG_KEY]
    store = app[RECORDS_KEY]
    request_id = str(uuid.uuid4())

    raw = await request.read()
    body: Any = None
    try:
        body = json.loads(raw)
    except ValueError:
        plan = Plan(http_error=HttpError(400, "ValidationException", "The request body is not valid JSON."))
    else:
        plan = plan_response(
            body,
            default_tokens=config.default_tokens,
            attempt=_attempt(app, raw),
            context_tokens=config.context_tokens,
        )

    record = store.open(
        request.match_info["modelId"],
        plan.user_text,
        traceparent=request.headers.get("traceparent", ""),
        **_asked(body),
    )
    if plan.http_error is not None:
        headers, payload = error_body(plan.http_error)
        headers["x-amzn-RequestId"] = request_id
        store.finish(record, "error", status=plan.http_error.status, error_type=plan.http_error.error_type)
        return web.Response(status=plan.http_error.status, body=payload, headers=headers)

    return await _tracked(app, store, record, _stream(request, plan, record, config, store, request_id))


async def _tracked(
    app: web.Application, store: RecordStore, record: RequestRecord, streaming: Awaitable[web.StreamResponse]
) -> web.StreamResponse:
    """Run a streaming response where shutdown can find it; a cancel is recorded as who caused it."""
    streams = app[_STREAMS_KEY]
    task = asyncio.current_task()
    if task is not None:
        streams.tasks.add(task)
    try:
        return await streaming
    except asyncio.CancelledError:
        store.finish(record, "error" if streams.stopping else "client_closed")
        raise
    finally:
        if task is not None:
            streams.tasks.discard(task)


async def _stream(
    request: web.Request,
    plan: Plan,
    record: RequestRecord,
    config: EmulatorConfig,
    store: RecordStore,
    request_id: str,
) -> web.StreamResponse:
    """Write the plan's frames, paced; the plan is rendered before the first byte goes out."""
    frames = render_steps(plan.steps)
    ttft_ms = plan.ttft_ms if plan.ttft_ms is not None else config.ttft_ms
    tps = plan.tokens_per_second
    if tps is None:
        tps = config.tokens_per_second
    interval = 1.0 / tps if tps > 0 else 0.0

    response = web.StreamResponse(
        status=200, headers={"Content-Type": CONTENT_TYPE, "x-amzn-RequestId": request_id}
    )
    response.enable_chunked_encoding()
    try:
        await response.prepare(request)
        if ttft_ms > 0:
            await asyncio.sleep(ttft_ms / 1000.0)
        pacer = _Pacer(interval, store, record, config.record_token_times)
        stall = _Stall(plan)
        await stall.maybe(0)
        for frame in frames:
            if frame.usage is not None:
                latency_ms = int((time.monotonic() - record.started_at) * 1000)
                await response.write(encode_metadata(frame.usage, latency_ms))
                continue
            await pacer.wait(frame.is_token)
            await response.write(frame.data)
            pacer.sent(frame.is_token)
            if frame.is_token:
                await stall.token_sent()
        await response.write_eof()
    except OSError:
        # aiohttp raises ConnectionResetError (an OSError) when writing to a closed client.
        store.finish(record, "client_closed")
        return response

    failure = next((s for s in plan.steps if isinstance(s, RaiseException)), None)
    if failure is not None:
        store.finish(record, "error", error_type=failure.exception_type)
    else:
        store.finish(record, "completed", stop_reason=plan.stop_reason)
    return response


async def _chat_completions(request: web.Request) -> web.StreamResponse:
    """The OpenAI-compatible route: the request is planned as a ConverseStream one, then rendered."""
    app = request.app
    config = app[CONFIG_KEY]
    store = app[RECORDS_KEY]
    request_id = uuid.uuid4().hex

    raw = await request.read()
    body: Any = None
    converted: Any = None
    try:
        body = json.loads(raw)
    except ValueError:
        plan = Plan(http_error=HttpError(400, "ValidationException", "The request body is not valid JSON."))
    else:
        if isinstance(body, dict) and body.get("stream") is not True:
            message = 'Only streaming is supported: send "stream": true.'
            plan = Plan(http_error=HttpError(400, "ValidationException", message))
        else:
            converted = bedrock_request(body)
            plan = plan_response(
                converted,
                default_tokens=config.default_tokens,
                attempt=_attempt(app, raw),
                context_tokens=config.context_tokens,
            )
    model = body.get("model") if isinstance(body, dict) and isinstance(body.get("model"), str) else ""

    record = store.open(
        model, plan.user_text, traceparent=request.headers.get("traceparent", ""), **_asked(converted)
    )
    if plan.http_error is not None:
        status, headers, payload = error_response(plan.http_error)
        headers["x-request-id"] = request_id
        store.finish(record, "error", status=status, error_type=plan.http_error.error_type)
        return web.Response(status=status, body=payload, headers=headers)

    options = body.get("stream_options") if isinstance(body, dict) else None
    include_usage = isinstance(options, dict) and options.get("include_usage") is True
    return await _tracked(
        app,
        store,
        record,
        _stream_openai(
            request, plan, record, config, store, request_id, model=model, include_usage=include_usage
        ),
    )


async def _stream_openai(
    request: web.Request,
    plan: Plan,
    record: RequestRecord,
    config: EmulatorConfig,
    store: RecordStore,
    request_id: str,
    *,
    model: str,
    include_usage: bool,
) -> web.StreamResponse:
    """Write the plan as SSE chunks, paced exactly as the Bedrock route paces its frames."""
    rendering = render_plan(
        plan,
        completion_id=f"chatcmpl-{request_id}",
        model=model,
        created=int(time.time()),
        include_usage=include_usage,
    )
    ttft_ms = plan.ttft_ms if plan.ttft_ms is not None else config.ttft_ms
    tps = plan.tokens_per_second
    if tps is None:
        tps = config.tokens_per_second
    interval = 1.0 / tps if tps > 0 else 0.0

    response = web.StreamResponse(
        status=200,
        headers={"Content-Type": SSE_CONTENT_TYPE, "Cache-Control": "no-cache", "x-request-id": request_id},
    )
    response.enable_chunked_encoding()
    try:
        await response.prepare(request)
        if ttft_ms > 0:
            await asyncio.sleep(ttft_ms / 1000.0)
        pacer = _Pacer(interval, store, record, config.record_token_times)
        stall = _Stall(plan)
        await stall.maybe(0)
        for chunk in rendering.chunks:
            if chunk.cut:
                store.finish(record, "error", error_type=rendering.error_type)
                # Dropped without the chunked body's terminator: the client sees a cut, not an end.
                if request.transport is not None:
                    request.transport.abort()
                return response
            await pacer.wait(chunk.is_token)
            await response.write(chunk.data)
            pacer.sent(chunk.is_token)
            if chunk.is_token:
                await stall.token_sent()
        await response.write_eof()
    except OSError:
        store.finish(record, "client_closed")
        return response

    if rendering.error_type is not None:
        store.finish(record, "error", error_type=rendering.error_type)
    else:
        store.finish(record, "completed", stop_reason=plan.stop_reason)
    return response
