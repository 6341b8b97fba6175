"""Server-Sent Events through aiohttp-sse: ``POST /agent/stream`` (dialect **agent**).

The handler validates, starts the query on a short-lived session, subscribes to its log and
writes each event in the dialect until the terminal one. If the client goes away, aiohttp
cancels the handler and the ``finally`` cancels the query, which closes the upstream stream.
"""

from __future__ import annotations

import json

from aiohttp import web
from aiohttp_sse import sse_response

from service.app import SERVICES
from service.core.events import RunError, is_terminal
from service.transports import dialects
from service.transports.http import (
    AgentRequest,
    end_ephemeral,
    follow_run,
    read_json,
    start_ephemeral,
)

NO_BUFFERING = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def encode(payload: dict[str, object]) -> str:
    """Compact JSON for one ``data:`` line."""
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False)


async def agent_stream(request: web.Request) -> web.StreamResponse:
    """``POST /agent/stream``: the run's events as ``data: {json}`` lines, ``done`` last."""
    services = request.app[SERVICES]
    body = await read_json(request, AgentRequest)
    session = await start_ephemeral(services, body)
    try:
        async with sse_response(
            request,
            headers=NO_BUFFERING,
            allow_all_methods=True,
            ping_interval=services.settings.sse_ping_interval_s,
        ) as response:
            terminal_sent = False
            async for event in follow_run(session):
                payload = dialects.agent(event)
                if payload is not None:
                    await response.send(encode(payload))
                terminal_sent = is_terminal(event)
            if not terminal_sent:
                # The log closed under us (the server is going away): say so rather than hang up.
                await response.send(encode(dialects.agent(RunError(error="the stream ended early")) or {}))
        return response
    finally:
        await end_ephemeral(services, session)


def add_routes(app: web.Application) -> None:
    """Register the SSE routes."""
    app.router.add_post("/agent/stream", agent_stream)
