"""JSON routes that are not about one session: ``POST /agent/run``, ``GET /healthz`` and
``GET /metrics``."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from aiohttp import web

from service import jsonsafe
from service.core.events import Event, RunDone, RunError, TextDelta
from service.core.sessions import Session
from service.transports.edge.auth import AUTH_KEY, TOKEN_COOKIE, owner_of
from service.transports.edge.context import context_of
from service.transports.edge.inputs import AgentRequest, TokenRequest, check_length, read_json
from service.transports.edge.middleware import error_response, json_error
from service.transports.native.dialects import agent
from service.transports.stream.follow import ThroughRun
from service.transports.stream.session import usage_dict

# Each health probe's time: /healthz answers within a second whatever a dependency does.
HEALTH_PROBE_S = 0.4


async def agent_run(request: web.Request) -> web.Response:
    """``POST /agent/run``: the same run as ``/agent/stream``, collected into one JSON reply."""
    context = context_of(request)
    body = await read_json(request, AgentRequest)
    check_length(context.settings, body.message, "message")
    session = await context.start_ephemeral(body.message, body.max_turns, owner_of(request), agent=body.agent)
    try:
        text, terminal = await _collect(session)
    finally:
        await asyncio.shield(context.end_ephemeral(session.id))
    if isinstance(terminal, RunDone):
        reply = agent(terminal) or {}
        reply.pop("type", None)
        return web.json_response({"response": text, **reply}, dumps=jsonsafe.dumps)
    error = terminal if isinstance(terminal, RunError) else RunError(error="the run ended without a result")
    return error_response(
        503,
        error.error,
        code=error.code,
        turns=error.turns,
        response=text,
        usage=usage_dict(error.usage),
    )


async def _collect(session: Session) -> tuple[str, Event | RunError | None]:
    """The run's text and its terminal event (or why none was read)."""
    parts: list[str] = []
    last: Event | None = None
    reader = ThroughRun(session.log)
    async with contextlib.aclosing(reader.batches()) as batches:
        async for batch in batches:
            for entry in batch:
                if isinstance(entry.event, TextDelta):
                    parts.append(entry.event.text)
            last = batch[-1].event
    ending = reader.ending
    if ending is not None and ending.clean:  # the last event read is the run's terminal one
        if reader.skipped and isinstance(last, RunDone):
            return last.output, last
        return "".join(parts), last
    return "".join(parts), ending.as_error() if ending is not None else None


async def healthz(request: web.Request) -> web.Response:
    """``GET /healthz``: 200 while serving, with a few numbers worth watching; 503 ``degraded``
    while a dependency the service cannot work without (the shared store, the session database)
    does not answer, named in ``unavailable``."""
    context = context_of(request)
    try:
        since = float(request.query["lag_since"]) if "lag_since" in request.query else None
    except ValueError:
        raise json_error(400, "lag_since must be a number (a time.monotonic() reading)") from None
    sections, down = await context.probe(HEALTH_PROBE_S)
    healthy = not down
    store: dict[str, Any] = dict(sections.get("store") or {"kind": "memory", "connected": True})
    sessions = store.pop("sessions", None)
    return web.json_response(
        {
            "status": "ok" if healthy else "degraded",
            "provider": context.settings.provider,
            "runs_active": context.runs.active,
            "sessions": sessions,
            # Redis when the service is scaled out; without it no new work can be taken (503).
            "store": store,
            "loop_lag_ms": context.monitor.summary(since),
            # What does not answer, by name (``store``, ``database``): an operator sees which.
            **({"unavailable": down} if down else {}),
            # The session database, when there is one; without it nothing new can be recorded (503).
            **({"database": sections["database"]} if "database" in sections else {}),
            # Per MCP server: connected or not, and why; a server being down is not a failure.
            "mcp": sections.get("mcp", []),
        },
        status=200 if healthy else 503,
    )


async def metrics(request: web.Request) -> web.Response:
    """``GET /metrics``: Prometheus's text format; with ``AGENT_API_KEYS`` set the scraper sends a
    key as a bearer token, like any client."""
    from service.metrics import CONTENT_TYPE

    body = context_of(request).metrics.render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def issue_token(request: web.Request) -> web.Response:
    """``POST /auth/token``: trade a key (Bearer) for a short-lived token, also set as a cookie;
    with a body ``{"sub": "alice"}``, a token for that user of the key's app."""
    auth = request.app[AUTH_KEY]
    if not auth.keys:
        return web.json_response(
            {"error": "no API keys are configured, so no token is issued here"}, status=404
        )
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    owner = auth.owner_of_key(value.strip()) if scheme.lower() == "bearer" else None
    if owner is None:
        return web.json_response(
            {"error": "a token is issued for an API key only"},
            status=401,
            headers={"WWW-Authenticate": "Bearer"},
        )
    body = await read_json(request, TokenRequest, allow_empty=True)
    token, expires = auth.issue_token(owner, subject=body.sub)
    response = web.json_response({"token": token, "expires_at": expires})
    response.set_cookie(
        TOKEN_COOKIE,
        token,
        max_age=int(auth.token_ttl_s),
        httponly=True,
        samesite="Strict",
        secure=request.secure,
        path="/",
    )
    return response


def add_routes(app: web.Application) -> None:
    """Register the JSON routes."""
    app.router.add_post("/agent/run", agent_run)
    app.router.add_post("/auth/token", issue_token)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)
