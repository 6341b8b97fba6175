"""Server-Sent Events through aiohttp-sse.

- ``POST /agent/stream``: a short-lived session's run in the **agent** dialect (``data:`` only).
- ``GET /sessions/{id}/events``: the **session** dialect with ``event:`` and ``id:``; resume with
  ``Last-Event-ID`` (or ``?last_event_id=``); heartbeats while idle; closes after the ``done``
  that ends the log.
- ``GET /sessions/{id}/stream?query=``: starts a query and streams the **steps** dialect.

Each handler validates, subscribes to the session's log, projects, and writes. If a client goes
away, aiohttp cancels the handler and the subscription ends with it; only ``/agent/stream``
(whose session lives for that request alone) cancels its query then.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web
from aiohttp_sse import EventSourceResponse, sse_response

from service import jsonsafe
from service.core.events import StatusChange
from service.core.log import LogEntry
from service.core.sessions import ACTIVE, Session
from service.errors import EventsPurged, StoreUnavailable
from service.transports import dialects
from service.transports.auth import owner_of
from service.transports.context import CONTEXT, Context, context_of, session_of
from service.transports.follow import Follower, Stop
from service.transports.inputs import (
    AgentRequest,
    check_length,
    check_text_param,
    decimal,
    int_param,
    read_json,
)
from service.transports.middleware import OPEN_STREAM, json_error
from service.transports.reading import purged_body
from service.transports.sse_writes import BurstResponse, write_blocks, write_now

NO_BUFFERING = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

encode = jsonsafe.dumps


@contextlib.asynccontextmanager
async def event_stream(
    request: web.Request, context: Context, *, headers: dict[str, str] | None = None, **kwargs: Any
) -> AsyncIterator[BurstResponse]:
    """aiohttp-sse's response with the service's ping interval, send timeout and no-buffering
    headers, registered as the request's open stream (see :data:`~service.transports.http.OPEN_STREAM`)."""
    settings = context.settings
    async with sse_response(
        request,
        headers={**NO_BUFFERING, **(headers or {})},
        ping_interval=settings.sse_ping_interval_s,
        send_timeout=settings.sse_send_timeout_s,
        response_cls=BurstResponse,
        **kwargs,
    ) as response:
        request[OPEN_STREAM] = response
        yield response


async def agent_stream(request: web.Request) -> web.StreamResponse:
    """``POST /agent/stream``: the run's events as ``data: {json}`` lines, ``done`` last."""
    context = context_of(request)
    body = await read_json(request, AgentRequest)
    owner = owner_of(request)
    delivered = context.metrics.delivered("sse")
    # The stream slot first: a key at its stream quota gets its 429 before any query starts.
    async with context.stream_slot("sse", owner):
        check_length(context.settings, body.message, "message")
        session = await context.start_ephemeral(body.message, body.max_turns, owner)
        try:
            return await _agent_stream(request, context, session, delivered)
        finally:
            # Shielded: a second cancellation must not leave the run going with nobody to read it.
            await asyncio.shield(context.end_ephemeral(session.id))


async def _agent_stream(
    request: web.Request, context: Context, session: Session, delivered: Any
) -> web.StreamResponse:
    timeout = context.settings.sse_send_timeout_s
    async with event_stream(request, context, allow_all_methods=True) as response:

        def deliver(entry: LogEntry) -> bool:
            block = dialects.agent_block(entry.event)
            if block is None:
                return True
            if not write_now(request, response, block.encode()):
                return False
            delivered.inc()
            return True

        follower = Follower(session.log, 0, stop=Stop.AT_TERMINAL, deliver=deliver)
        async with follower as batches:
            async for batch in batches:
                blocks = []
                for entry in batch:
                    block = dialects.agent_block(entry.event)
                    if block is not None:
                        blocks.append(block)
                if blocks:
                    await write_blocks(request, response, "".join(blocks).encode(), timeout)
                    delivered.inc(len(blocks))
        ending = follower.ending
        if ending is not None and not ending.clean:
            # Purged past this reader, the store gone, or the log closed under it (the server is
            # going away): say so in the stream's own dialect rather than hang up.
            payload = dialects.agent(ending.as_error()) or {}
            await response.send(encode({**payload, **ending.error_fields()}))
    return response


def last_event_id(request: web.Request) -> int | None:
    """The id a client resumes after: the `Last-Event-ID` header, else `?last_event_id=`; 400 if bad."""
    header = request.headers.get("Last-Event-ID")
    if header is not None and header.strip():
        try:
            value = decimal(header.strip())
        except ValueError:
            raise json_error(400, f"Last-Event-ID must be an event id (an integer), got {header!r}") from None
        if value < 0:
            raise json_error(400, "Last-Event-ID must not be negative")
        return value
    return int_param(request, "last_event_id")


async def session_events(request: web.Request) -> web.StreamResponse:
    """``GET /sessions/{id}/events``: the session dialect, resumable by event id."""
    context, session = await session_of(request)
    after = last_event_id(request)
    log = session.log
    last = await log.last_id()
    running = session.status in ACTIVE
    if after is not None:
        if after > last:
            raise json_error(400, f"Last-Event-ID {after} is ahead of the session's last event id {last}")
        if after == last and not running:
            # Nothing new and nothing coming: 204 tells EventSource to stop reconnecting.
            return web.Response(status=204)
        oldest = await log.first_id()
        if after < oldest - 1:
            return web.json_response(
                await purged_body(context, session, after, oldest), status=410, dumps=jsonsafe.dumps
            )
    async with context.stream_slot("sse", owner_of(request)):
        return await _session_stream(request, context, session, after, last, running)


async def _session_stream(
    request: web.Request, context: Context, session: Session, after: int | None, last: int, running: bool
) -> web.StreamResponse:
    async with event_stream(request, context) as response:
        if after is None:
            # A fresh connection learns the status first (seed 002), then only what comes next.
            await response.send(
                encode({"type": "status_change", "status": session.status}),
                event="status_change",
                retry=context.settings.sse_retry_ms,
            )
            if not running:
                return response
            after = last
            await _follow(request, response, context, session, after)
        else:
            await _follow(request, response, context, session, after, retry=context.settings.sse_retry_ms)
    return response


async def _follow(
    request: web.Request,
    response: EventSourceResponse,
    context: Context,
    session: Session,
    after: int,
    retry: int | None = None,
) -> None:
    """Write the session's events after ``after`` until the ``done`` that ends the log.

    ``retry`` (the reconnection delay a browser should use) goes with the first frame.
    """
    log = session.log
    settings = context.settings
    delivered = context.metrics.delivered("sse")
    # The status as of the last event sent: on a shared store the session object is a copy
    # read when the request came, and the log's status changes are what keep it current.
    status = session.status

    def deliver(entry: LogEntry) -> bool:
        nonlocal status
        if retry is not None:
            return False  # the first frame carries the retry hint: the handler writes it
        if not write_now(request, response, dialects.session_sse(entry)):
            return False
        delivered.inc()
        if isinstance(entry.event, StatusChange):
            status = entry.event.status
        return True

    follower = Follower(
        log, after, stop=Stop.AT_REST, idle_timeout=settings.heartbeat_interval_s, deliver=deliver
    )
    # A shutdown may end this stream while its follower waits on the log for the next batch (see
    # _drain); only then, so nothing is cut short mid-write or mid-read.
    streams = request.app[SESSION_STREAMS]
    task = asyncio.current_task()
    if task is not None:
        streams[task] = follower
    try:
        async with follower as batches:
            async for batch in batches:
                if not batch:
                    heartbeat = {"type": "heartbeat", "last_id": follower.last_id, "status": status}
                    await response.send(encode(heartbeat), event="heartbeat", retry=retry)
                    retry = None
                    continue
                if retry is not None:
                    # The first frame also tells the browser how soon to reconnect.
                    name, data = dialects.session_frame(batch[0])
                    await response.send(data, id=str(batch[0].id), event=name, retry=retry)
                    retry = None
                    rest = batch[1:]
                else:
                    rest = batch
                if len(rest) > settings.merge_deltas_after:
                    blocks = "".join(
                        dialects.sse_block(data, id=entry_id, event=name)
                        for entry_id, name, data in dialects.merge_text_runs(rest)
                    ).encode()
                elif len(rest) == 1:
                    blocks = dialects.session_sse(rest[0])
                else:
                    blocks = b"".join([dialects.session_sse(entry) for entry in rest])
                if blocks:
                    await write_blocks(request, response, blocks, settings.sse_send_timeout_s)
                delivered.inc(len(batch))
                for entry in batch:
                    if isinstance(entry.event, StatusChange):
                        status = entry.event.status
    except asyncio.CancelledError:
        if task is None or task not in request.app[DRAINED]:
            raise  # the client went away
        # The server is shutting down: what the log holds for this reader, then how soon to
        # come back (to another instance); the browser reconnects with its Last-Event-ID.
        task.uncancel()
        await _drain(request, response, context, log, follower.last_id)
        return
    finally:
        streams.pop(task, None)
    ending = follower.ending
    if ending is not None and ending.reason in {"purged", "store_unavailable"}:
        # Fell behind the purge horizon (a reconnect with its last id gets the 410 with a
        # snapshot), or the shared store went away (the client resumes once it is back).
        error = {
            "type": "error",
            "message": ending.message,
            "code": ending.code,
            "recoverable": True,
            **ending.error_fields(),
        }
        await response.send(encode(error), event="error")


async def _drain(
    request: web.Request, response: EventSourceResponse, context: Context, log: Any, last_sent: int
) -> None:
    settings = context.settings
    try:
        async with asyncio.timeout(settings.sse_send_timeout_s):
            backlog = await log.read(last_sent, strict=False)
            if backlog:
                blocks = b"".join(dialects.session_sse(entry) for entry in backlog)
                await write_blocks(request, response, blocks, settings.sse_send_timeout_s)
            await response.write(f": server shutting down\nretry: {settings.sse_retry_ms}\n\n".encode())
    except (TimeoutError, ConnectionResetError, StoreUnavailable, EventsPurged):
        pass  # the reader resumes from its last id all the same


DRAIN = "drain"
# The streams a shutdown ended (by the task, not by the cancellation's message: a library on the
# way, such as a Redis client interrupted mid-command, may raise a CancelledError of its own).
DRAINED = web.AppKey("drained_streams", set)
# The handler tasks of the open session streams, with their followers.
SESSION_STREAMS = web.AppKey("session_streams", dict)


async def _drain_session_streams(app: web.Application) -> None:
    """On shutdown (after every run here wrote its terminal event): end each session stream that
    waits for events (a query running on another instance, or one whose end it has yet to
    read) with what its log holds and a ``retry:`` hint, so the client reconnects, elsewhere,
    at once. Only streams suspended waiting are cancelled, so none is cut mid-write."""
    tasks = [task for task, follower in app[SESSION_STREAMS].items() if follower.waiting]
    for task in tasks:
        app[DRAINED].add(task)
        task.cancel(DRAIN)
    if tasks:
        await asyncio.wait(tasks, timeout=app[CONTEXT].settings.shutdown_timeout_s)


async def steps_stream(request: web.Request) -> web.StreamResponse:
    """``GET /sessions/{id}/stream?query=``: start the query and stream its steps (seed 000)."""
    context, session = await session_of(request)
    query = check_text_param(request, "query") or ""
    if not query.strip():
        raise json_error(400, "Query parameter is required")
    check_length(context.settings, query, "query")
    after = await session.log.last_id()
    delivered = context.metrics.delivered("sse")
    async with context.stream_slot("sse", owner_of(request)):
        await context.runs.start(session, query)  # after the stream slot: a 429 starts nothing
        async with event_stream(request, context) as response:
            follower = Follower(session.log, after, stop=Stop.AT_TERMINAL)
            async with follower as batches:
                async for batch in batches:
                    for entry in batch:
                        for payload in dialects.steps(entry.event):
                            await response.send(encode(payload), id=str(entry.id))
                            delivered.inc()
            ending = follower.ending
            if ending is not None and not ending.clean:
                for payload in dialects.steps(ending.as_error()):
                    await response.send(encode({**payload, **ending.error_fields()}))
    return response


SELFTEST_MAX_TICKS = 1000
SELFTEST_MAX_INTERVAL_MS = 60_000


async def selftest_stream(request: web.Request) -> web.StreamResponse:
    """``GET /selftest/stream?ticks=20&interval_ms=100&idle_ms=0``: timestamped ticks.

    A client compares each tick's ``ts`` (the server's clock when it was written) with when it
    arrived: ticks that arrive together although they were written ``interval_ms`` apart mean
    something on the way buffers the stream; a ``Content-Encoding`` on the response means it was
    compressed; a stream cut during the ``idle_ms`` pause before the last tick means something
    closes idle streams. No model, no session: it tests the path, not the service.
    """
    context = context_of(request)
    ticks = int_param(request, "ticks", minimum=1)
    ticks = 20 if ticks is None else ticks
    interval_ms = int_param(request, "interval_ms")
    interval_ms = 100 if interval_ms is None else interval_ms
    idle_ms = int_param(request, "idle_ms") or 0
    if ticks > SELFTEST_MAX_TICKS:
        raise json_error(400, f"ticks must be at most {SELFTEST_MAX_TICKS}")
    if interval_ms > SELFTEST_MAX_INTERVAL_MS or idle_ms > SELFTEST_MAX_INTERVAL_MS * 5:
        raise json_error(
            400, f"interval_ms must be at most {SELFTEST_MAX_INTERVAL_MS}, idle_ms five times that"
        )
    async with event_stream(request, context) as response:
        loop = asyncio.get_running_loop()
        started = loop.time()
        for n in range(1, ticks + 1):
            if n > 1:
                # Ticks keep to the schedule rather than drifting by each write's duration.
                delay = started + (n - 1) * interval_ms / 1000 + (idle_ms / 1000 if n == ticks else 0)
                await asyncio.sleep(max(0.0, delay - loop.time()))
            tick = {
                "type": "tick",
                "n": n,
                "of": ticks,
                "ts": round(time.time(), 6),
                "interval_ms": interval_ms,
            }
            if n == ticks:
                tick["idle_ms"] = idle_ms
            await response.send(encode(tick), id=str(n), event="tick")
        await response.send(encode({"type": "end", "ticks": ticks}), event="end")
    return response


def add_routes(app: web.Application) -> None:
    """Register the SSE routes."""
    app[SESSION_STREAMS] = {}
    app[DRAINED] = set()
    app.on_shutdown.append(_drain_session_streams)
    app.router.add_get("/selftest/stream", selftest_stream)
    app.router.add_post("/agent/stream", agent_stream)
    app.router.add_get("/sessions/{session_id}/events", session_events)
    app.router.add_get("/sessions/{session_id}/stream", steps_stream)
