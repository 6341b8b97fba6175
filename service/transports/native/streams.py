"""The native face's streams, each a projector (:mod:`service.transports.native.dialects`) handed
to the one writer (:func:`service.transports.stream.sse.serve`):

- ``POST /agent/stream``: a short-lived session's run in the **agent** dialect (``data:`` only).
- ``GET /sessions/{id}/events``: the **session** dialect with ``event:`` and ``id:``; resume with
  ``Last-Event-ID`` (or ``?last_event_id=``); heartbeats while idle; closes after the ``done``
  that ends the log.
- ``GET /sessions/{id}/stream?query=``: starts a query and streams the **steps** dialect.
- ``GET /selftest/stream``: timestamped ticks, to test the path to a client.

If a client goes away, aiohttp cancels the handler and the subscription ends with it; only
``/agent/stream`` (whose session lives for that request alone) cancels its query then.
"""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from service import jsonsafe
from service.core.sessions import ACTIVE
from service.transports.edge.auth import owner_of
from service.transports.edge.context import context_of, session_of
from service.transports.edge.inputs import (
    AgentRequest,
    check_length,
    check_text_param,
    int_param,
    last_event_id,
    read_json,
)
from service.transports.edge.middleware import json_error
from service.transports.native.dialects import AgentProjector, SessionProjector, StepsProjector
from service.transports.stream.follow import Stop
from service.transports.stream.frames import sse_block
from service.transports.stream.reading import purged_body
from service.transports.stream.sse import event_stream, serve

encode = jsonsafe.dumps


async def agent_stream(request: web.Request) -> web.StreamResponse:
    """``POST /agent/stream``: the run's events as ``data: {json}`` lines, ``done`` last."""
    context = context_of(request)
    body = await read_json(request, AgentRequest)
    owner = owner_of(request)
    # The stream slot first: a key at its stream quota gets its 429 before any query starts.
    async with context.stream_slot("sse", owner):
        check_length(context.settings, body.message, "message")
        session = await context.start_ephemeral(body.message, body.max_turns, owner, agent=body.agent)
        try:
            return await serve(
                request, AgentProjector(), session.log, transport="sse", allow_all_methods=True
            )
        finally:
            # Shielded: a second cancellation must not leave the run going with nobody to read it.
            await asyncio.shield(context.end_ephemeral(session.id))


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
    settings = context.settings
    head = ""
    if after is None:
        # A fresh connection learns the status first (seed 002), then only what comes next.
        head = sse_block(encode({"type": "status_change", "status": session.status}), event="status_change")
        after = last
    projector = SessionProjector(session.status, settings.merge_deltas_after, head)
    async with context.stream_slot("sse", owner_of(request)):
        return await serve(
            request,
            projector,
            log if running or after < last else None,
            after,
            transport="sse",
            stop=Stop.AT_REST,
            idle_timeout=settings.heartbeat_interval_s,
            retry=True,
            drain=True,
        )


async def steps_stream(request: web.Request) -> web.StreamResponse:
    """``GET /sessions/{id}/stream?query=``: start the query and stream its steps (seed 000)."""
    context, session = await session_of(request)
    query = check_text_param(request, "query") or ""
    if not query.strip():
        raise json_error(400, "Query parameter is required")
    check_length(context.settings, query, "query")
    after = await session.log.last_id()
    async with context.stream_slot("sse", owner_of(request)):
        await context.runs.start(session, query)  # after the stream slot: a 429 starts nothing
        return await serve(request, StepsProjector(), session.log, after, transport="sse")


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
    """Register the native face's SSE routes."""
    app.router.add_get("/selftest/stream", selftest_stream)
    app.router.add_post("/agent/stream", agent_stream)
    app.router.add_get("/sessions/{session_id}/events", session_events)
    app.router.add_get("/sessions/{session_id}/stream", steps_stream)
