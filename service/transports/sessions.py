"""Session routes over JSON HTTP: create, read, delete, send a message, cancel, and poll events.

Polling (seed 004's ``session_events``) reads the same log as the SSE stream, with the same ids,
so a client may mix the two and see nothing lost and nothing twice.
"""

from __future__ import annotations

import re
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict

from service.app import SERVICES, Services
from service.core.sessions import Session
from service.transports import dialects
from service.transports.auth import owner_of
from service.transports.http import MaxTurns, Text, check_length, json_error, read_json, read_object


class MessageRequest(BaseModel):
    """Body of ``POST /sessions/{id}/messages``."""

    model_config = ConfigDict(extra="ignore")

    content: Text
    max_turns: MaxTurns = None


async def session_of(request: web.Request) -> tuple[Services, Session]:
    """The services and the session named in the path; 404 ``Session not found`` otherwise."""
    services = request.app[SERVICES]
    session = await services.sessions.get_owned(request.match_info["session_id"], owner_of(request))
    return services, session


DECIMAL = re.compile(r"-?[0-9]+")


def decimal(raw: str) -> int:
    """``raw`` as an integer, written in ASCII digits; ``ValueError`` otherwise (``int()`` alone
    would also take ``" 5"``, ``"+5"``, ``"1_0"`` and other scripts' digits)."""
    if not DECIMAL.fullmatch(raw):
        raise ValueError(raw)
    return int(raw)


def int_param(request: web.Request, *names: str, minimum: int = 0) -> int | None:
    """The first of ``names`` present in the query string as an integer; 400 if it is not one."""
    for name in names:
        raw = request.query.get(name)
        if raw is None:
            continue
        try:
            value = decimal(raw)
        except ValueError:
            raise json_error(400, f"{name} must be an integer, got {raw!r}") from None
        if value < minimum:
            raise json_error(400, f"{name} must be at least {minimum}")
        return value
    return None


async def purged_body(services: Services, session: Session, after_id: int, oldest_id: int) -> dict[str, Any]:
    """The 410 body: which ids are gone, and a snapshot to rebuild from."""
    return {
        "error": f"events after id {after_id} were purged; the oldest kept is {oldest_id}",
        "oldest_id": oldest_id,
        "last_id": await session.log.last_id(),
        "snapshot": dialects.jsonable(await services.runs.snapshot(session)),
    }


async def create_session(request: web.Request) -> web.Response:
    """``POST /sessions``: a new idle session (the body, if any, must be a JSON object)."""
    services = request.app[SERVICES]
    await read_object(request, allow_empty=True)
    session = await services.sessions.create(owner=owner_of(request))
    return web.json_response({"id": session.id, "status": session.status}, status=201)


async def get_session(request: web.Request) -> web.Response:
    """``GET /sessions/{id}``: status and the whole conversation."""
    services, session = await session_of(request)
    return web.json_response(
        {
            "id": session.id,
            "status": session.status,
            "messages": dialects.jsonable(session.messages),
            "usage": dialects.usage_dict(session.usage),
            "last_event_id": await session.log.last_id(),
        },
        dumps=dialects.dumps,
    )


async def delete_session(request: web.Request) -> web.Response:
    """``DELETE /sessions/{id}``: cancel its query if one runs, then forget it."""
    services, session = await session_of(request)
    await services.runs.cancel(session.id)
    await services.sessions.delete(session.id)
    return web.Response(status=204)


async def post_message(request: web.Request) -> web.Response:
    """``POST /sessions/{id}/messages``: start a query in the background (409 while one runs)."""
    services, session = await session_of(request)
    body = await read_json(request, MessageRequest)
    check_length(services, body.content, "content")
    after = await session.log.last_id()
    run = await services.runs.start(session, body.content, body.max_turns)
    return web.json_response(
        {"id": session.id, "status": session.status, "run_id": run.id, "after_id": after}, status=202
    )


async def cancel(request: web.Request) -> web.Response:
    """``POST /sessions/{id}/cancel``: stop the running query; every subscriber sees it end."""
    services, session = await session_of(request)
    cancelled = await services.runs.cancel(session.id)
    return web.json_response({"id": session.id, "status": session.status, "cancelled": cancelled}, status=202)


class IndexAhead(ValueError):
    """A polling index past the session's last event id."""


async def poll(services: Services, session: Session, since: int, limit: int | None = None) -> dict[str, Any]:
    """Seed 004's polling: the events after ``since`` (at most ``limit``) and the next index.

    Shared by ``GET /sessions/{id}/events/poll`` and the MCP ``session_events`` tool. A
    ``since`` older than the oldest kept event starts at the oldest kept one, says so
    (``purged``) and adds a snapshot of what was lost.
    """
    limit = min(limit or services.settings.poll_max_events, services.settings.poll_max_events)
    log = session.log
    last = await log.last_id()
    if since > last:
        raise IndexAhead(f"since_index {since} is ahead of the session's last event id {last}")
    oldest = await log.first_id()
    entries = await log.read(since, limit, strict=False)
    body: dict[str, Any] = {
        "events": [dialects.session_payload(entry) for entry in entries],
        "next_index": entries[-1].id if entries else since,
        "status": session.status,
        "last_id": last,
        "oldest_id": oldest,
        "purged": since < oldest - 1,
    }
    if body["purged"]:
        body["snapshot"] = dialects.jsonable(await services.runs.snapshot(session))
    return body


async def poll_events(request: web.Request) -> web.Response:
    """``GET /sessions/{id}/events/poll?since_index=N``: the events after N and the next index."""
    services, session = await session_of(request)
    since = int_param(request, "since_index") or 0
    limit = int_param(request, "limit", minimum=1)
    try:
        body = await poll(services, session, since, limit)
    except IndexAhead as exc:
        raise json_error(400, str(exc)) from None
    services.metrics.events_delivered.labels("poll").inc(len(body["events"]))
    return web.json_response(body, dumps=dialects.dumps)


def add_routes(app: web.Application) -> None:
    """Register the session routes."""
    app.router.add_post("/sessions", create_session)
    app.router.add_get("/sessions/{session_id}", get_session)
    app.router.add_delete("/sessions/{session_id}", delete_session)
    app.router.add_post("/sessions/{session_id}/messages", post_message)
    app.router.add_post("/sessions/{session_id}/cancel", cancel)
    app.router.add_get("/sessions/{session_id}/events/poll", poll_events)
