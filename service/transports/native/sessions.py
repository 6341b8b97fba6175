"""Session routes over JSON HTTP: create, read, rename, delete, send a message, cancel, answer an
approval, and poll events.

Polling (seed 004's ``session_events``) reads the same log as the SSE stream, with the same ids,
so a client may mix the two and see nothing lost and nothing twice.
"""

from __future__ import annotations

from aiohttp import web

from service import jsonsafe
from service.core.agents import chosen
from service.core.durable import DurableSessionStore
from service.errors import ApprovalError, StoreUnavailable
from service.transports.edge import actions, approvals
from service.transports.edge.auth import owner_of
from service.transports.edge.context import Context, context_of, session_of
from service.transports.edge.inputs import (
    ApprovalAnswer,
    MessageRequest,
    SessionRequest,
    TitleRequest,
    ToolResultRequest,
    check_text_param,
    int_param,
    read_json,
)
from service.transports.edge.middleware import json_error
from service.transports.stream.reading import IndexAhead, poll
from service.transports.stream.session import pending_approvals, pending_client_tools, usage_dict


async def create_session(request: web.Request) -> web.Response:
    """``POST /sessions``: a new idle session of the agent the body names (the default one
    without a body or an ``agent``; 422 naming the agents there are for one that is not)."""
    context = context_of(request)
    body = await read_json(request, SessionRequest, allow_empty=True)
    agent = chosen(context.agents, body.agent)
    session = await context.sessions.create(owner=owner_of(request), agent=agent)
    return web.json_response({"id": session.id, "status": session.status, "agent": session.agent}, status=201)


async def list_agents(request: web.Request) -> web.Response:
    """``GET /agents``: the agents a session may be made for, and the default one."""
    directory = context_of(request).agents
    return web.json_response(
        {
            "agents": [
                {
                    "name": info.name,
                    "description": info.description,
                    "provider": info.provider,
                    "model": info.model,
                    "tools": list(info.tools),
                    "client_tools": info.client_tools,
                }
                for info in directory.agents()
            ],
            "default": directory.default,
        }
    )


LIST_LIMIT = 20
LIST_LIMIT_MAX = 100


def durable(context: Context) -> DurableSessionStore:
    """The store with the database behind it; 501 when ``AGENT_DATABASE_URL`` is empty."""
    if not isinstance(context.sessions, DurableSessionStore):
        raise json_error(
            501,
            "listing and renaming sessions need the session database; AGENT_DATABASE_URL is empty",
            code="no_database",
        )
    return context.sessions


async def list_sessions(request: web.Request) -> web.Response:
    """``GET /sessions?limit=&before=``: the caller's sessions, newest update first."""
    store = durable(context_of(request))
    limit = min(int_param(request, "limit", minimum=1) or LIST_LIMIT, LIST_LIMIT_MAX)
    before = check_text_param(request, "before") or None
    try:
        page = await store.list_owned(owner_of(request), limit, before)
    except ValueError:
        raise json_error(400, "before must be a next_before cursor from an earlier page") from None
    body = {"sessions": [record.summary() for record in page.sessions], "next_before": page.next_before}
    return web.json_response(body, dumps=jsonsafe.dumps)


async def get_session(request: web.Request) -> web.Response:
    """``GET /sessions/{id}``: status and the whole conversation (and, with the database, its
    title and times)."""
    context, session = await session_of(request)
    body = {
        "id": session.id,
        "status": session.status,
        "messages": jsonsafe.jsonable(session.messages),
        "usage": usage_dict(session.usage),
        "last_event_id": await session.log.last_id(),
        "agent": session.agent,
        "pending_approvals": pending_approvals(session),
        "pending_tool_calls": pending_client_tools(session),
    }
    if isinstance(context.sessions, DurableSessionStore) and not session.ephemeral:
        try:
            record = await context.sessions.record_of(session.id)
        except StoreUnavailable:
            record = None  # what this instance holds still answers, without the record's fields
        if record is not None:
            body.update(title=record.title, created_at=record.created_at, updated_at=record.updated_at)
    return web.json_response(body, dumps=jsonsafe.dumps)


async def rename_session(request: web.Request) -> web.Response:
    """``PATCH /sessions/{id}`` ``{"title"}``: rename the caller's session."""
    context, session = await session_of(request)
    store = durable(context)
    body = await read_json(request, TitleRequest)
    title = " ".join(body.title.split())
    await store.rename(session.id, owner_of(request), title)
    return web.json_response({"id": session.id, "title": title, "status": session.status})


async def delete_session(request: web.Request) -> web.Response:
    """``DELETE /sessions/{id}``: cancel its query if one runs, then forget it."""
    context, session = await session_of(request)
    context.multitask.drop(session.id)  # before the cancel, which would start the next queued
    await context.runs.cancel(session.id)
    await context.sessions.delete(session.id)
    return web.Response(status=204)


async def post_message(request: web.Request) -> web.Response:
    """``POST /sessions/{id}/messages``: start a query in the background. While one runs,
    ``multitask_strategy`` decides: 409 (``reject``), queued (``enqueue``: 202 with ``queued``, its
    place), or the running one stopped first (``interrupt``, ``rollback``). ``edit`` and
    ``regenerate`` cut the conversation back first (see :mod:`service.transports.edge.actions`)."""
    context, session = await session_of(request)
    body = await read_json(request, MessageRequest)
    after = await session.log.last_id()
    sent = await actions.send(context, session, body)
    reply: dict[str, object] = {"id": session.id, "status": session.status, "after_id": after}
    if sent.run is not None:
        reply.update(run_id=sent.run.id, after_id=sent.run.first_id - 1)
    else:
        reply.update(status="queued", queued=sent.queued)
    return web.json_response(reply, status=202)


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
    context.metrics.delivered("poll").inc(len(body["events"]))
    return web.json_response(body, dumps=jsonsafe.dumps)


async def post_approval(request: web.Request) -> web.Response:
    """``POST /sessions/{id}/approvals/{approval_id}``: approve or deny a tool call that waits."""
    context, session = await session_of(request)
    body = await read_json(request, ApprovalAnswer)
    try:
        reply = await approvals.answer(context, session, request.match_info["approval_id"], body, "http")
    except ApprovalError as exc:
        raise json_error(exc.status, str(exc)) from None
    return web.json_response(reply, dumps=jsonsafe.dumps)


async def post_tool_result(request: web.Request) -> web.Response:
    """``POST /sessions/{id}/tool-results/{tool_call_id}``: the result of a call of a tool the
    client runs itself; the query that waits on it goes on."""
    context, session = await session_of(request)
    body = await read_json(request, ToolResultRequest)
    reply = await actions.answer_tool_result(
        context, session, request.match_info["tool_call_id"], body, "http"
    )
    return web.json_response(reply, dumps=jsonsafe.dumps)


def add_routes(app: web.Application) -> None:
    """Register the session routes."""
    app.router.add_post("/sessions", create_session)
    app.router.add_get("/sessions", list_sessions)
    app.router.add_get("/sessions/{session_id}", get_session)
    app.router.add_patch("/sessions/{session_id}", rename_session)
    app.router.add_delete("/sessions/{session_id}", delete_session)
    app.router.add_post("/sessions/{session_id}/messages", post_message)
    app.router.add_post("/sessions/{session_id}/cancel", cancel)
    app.router.add_get("/agents", list_agents)
    app.router.add_get("/sessions/{session_id}/events/poll", poll_events)
    app.router.add_post("/sessions/{session_id}/approvals/{approval_id}", post_approval)
    app.router.add_post("/sessions/{session_id}/tool-results/{tool_call_id}", post_tool_result)
