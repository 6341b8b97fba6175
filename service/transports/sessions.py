"""Session routes over JSON HTTP: create, read, delete, send a message, cancel, and poll events.

Polling (seed 004's ``session_events``) reads the same log as the SSE stream, with the same ids,
so a client may mix the two and see nothing lost and nothing twice.
"""

from __future__ import annotations

from aiohttp import web

from service.transports import approvals, dialects
from service.transports.auth import owner_of
from service.transports.context import context_of, session_of
from service.transports.inputs import MessageRequest, check_length, int_param, read_json, read_object
from service.transports.middleware import json_error
from service.transports.reading import IndexAhead, poll


async def create_session(request: web.Request) -> web.Response:
    """``POST /sessions``: a new idle session (the body, if any, must be a JSON object)."""
    context = context_of(request)
    await read_object(request, allow_empty=True)
    session = await context.sessions.create(owner=owner_of(request))
    return web.json_response({"id": session.id, "status": session.status}, status=201)


async def get_session(request: web.Request) -> web.Response:
    """``GET /sessions/{id}``: status and the whole conversation."""
    context, session = await session_of(request)
    return web.json_response(
        {
            "id": session.id,
            "status": session.status,
            "messages": dialects.jsonable(session.messages),
            "usage": dialects.usage_dict(session.usage),
            "last_event_id": await session.log.last_id(),
            "pending_approvals": approvals.pending(session),
        },
        dumps=dialects.dumps,
    )


async def delete_session(request: web.Request) -> web.Response:
    """``DELETE /sessions/{id}``: cancel its query if one runs, then forget it."""
    context, session = await session_of(request)
    await context.runs.cancel(session.id)
    await context.sessions.delete(session.id)
    return web.Response(status=204)


async def post_message(request: web.Request) -> web.Response:
    """``POST /sessions/{id}/messages``: start a query in the background (409 while one runs)."""
    context, session = await session_of(request)
    body = await read_json(request, MessageRequest)
    check_length(context.settings, body.content, "content")
    after = await session.log.last_id()
    run = await context.runs.start(session, body.content, body.max_turns)
    return web.json_response(
        {"id": session.id, "status": session.status, "run_id": run.id, "after_id": after}, status=202
    )


async def cancel(request: web.Request) -> web.Response:
    """``POST /sessions/{id}/cancel``: stop the running query; every subscriber sees it end."""
    context, session = await session_of(request)
    cancelled = await context.runs.cancel(session.id)
    return web.json_response({"id": session.id, "status": session.status, "cancelled": cancelled}, status=202)


async def poll_events(request: web.Request) -> web.Response:
    """``GET /sessions/{id}/events/poll?since_index=N``: the events after N and the next index."""
    context, session = await session_of(request)
    since = int_param(request, "since_index") or 0
    limit = int_param(request, "limit", minimum=1)
    try:
        body = await poll(context, session, since, limit)
    except IndexAhead as exc:
        raise json_error(400, str(exc)) from None
    context.metrics.events_delivered.labels("poll").inc(len(body["events"]))
    return web.json_response(body, dumps=dialects.dumps)


def add_routes(app: web.Application) -> None:
    """Register the session routes."""
    app.router.add_post("/sessions", create_session)
    app.router.add_get("/sessions/{session_id}", get_session)
    app.router.add_delete("/sessions/{session_id}", delete_session)
    app.router.add_post("/sessions/{session_id}/messages", post_message)
    app.router.add_post("/sessions/{session_id}/cancel", cancel)
    app.router.add_get("/sessions/{session_id}/events/poll", poll_events)
