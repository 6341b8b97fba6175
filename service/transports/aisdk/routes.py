"""The Vercel AI SDK's routes: ``useChat`` with ``DefaultChatTransport``, and its resume.

- ``POST /api/chat``: the chat ``id`` names the caller's session (made on first use), the last
  user message is the new query; the reply is the query's UI message stream
  (:mod:`service.transports.aisdk.projector`).
- ``GET /api/chat/{id}/stream``: ``useChat``'s resume; 204 when no query runs (a chat not posted
  yet included, and an id only another owner holds: the caller may make its own chat of it),
  else the running query from its first event (from after ``Last-Event-ID`` when one is sent).

A query that waits for tool approvals ends the stream as the SDK ends a step awaiting approval,
while it keeps waiting on the server; the client's next ``POST /api/chat`` carries the answers
(tool parts ``approval-responded``), answered together through
:mod:`service.transports.edge.approvals` (all of them or none: one that leaves some of the query's
pending approvals out is a 409 naming them), and gets the rest of the same query.

Stopping is ``POST /sessions/{id}/cancel``, whichever stream a client reads. A client that goes
away leaves its query running (a session's query is not the stream's), to be resumed or stopped.
"""

from __future__ import annotations

from aiohttp import web

from service.core.sessions import valid_client_id
from service.errors import SessionNotFound
from service.transports.aisdk.models import ChatRequest, approvals_of, query_of
from service.transports.aisdk.projector import HEADERS, UIMessageStream
from service.transports.edge.approvals import answer_all
from service.transports.edge.auth import owner_of
from service.transports.edge.context import Context, context_of
from service.transports.edge.inputs import ApprovalAnswer, last_event_id, read_json
from service.transports.edge.middleware import json_error
from service.transports.stream.resume import continued_from, query_start, resume_point, start_query
from service.transports.stream.sse import serve

TRANSPORT = "aisdk"


async def chat(request: web.Request) -> web.StreamResponse:
    """``POST /api/chat``: the query of the chat's last user message, as a UI message stream."""
    context = context_of(request)
    body = await read_json(request, ChatRequest)
    try:
        answers = approvals_of(body.messages)
    except ValueError as exc:
        raise json_error(422, f"invalid request: messages.{exc}") from None
    try:
        query = "" if answers else query_of(body.messages)
    except ValueError as exc:
        raise json_error(422, f"invalid request: messages: {exc}") from None
    async with context.stream_slot(TRANSPORT, owner_of(request)):
        if answers:
            return await _chat_approved(request, context, body.id, answers)
        session, after, _ = await start_query(request, context, body.id, query)
        return await serve(
            request,
            UIMessageStream(),
            session.log,
            after,
            transport=TRANSPORT,
            headers=HEADERS,
            allow_all_methods=True,
        )


async def _chat_approved(
    request: web.Request, context: Context, chat_id: str, replies: list[tuple[str, ApprovalAnswer]]
) -> web.StreamResponse:
    """The chat's approval answers (``addToolApprovalResponse``): answered, then the rest of the
    query that waited for them."""
    session = await context.sessions.get_owned(chat_id, owner_of(request))
    start = query_start(session)
    await answer_all(context, session, replies, "ai-sdk")
    projector = UIMessageStream()
    after = await continued_from(session, start, {approval_id for approval_id, _ in replies}, projector)
    return await serve(
        request,
        projector,
        session.log,
        after,
        transport=TRANSPORT,
        headers=HEADERS,
        allow_all_methods=True,
    )


async def chat_stream(request: web.Request) -> web.StreamResponse:
    """``GET /api/chat/{id}/stream``: the running query again (``useChat``'s resume); 204 when none
    runs, also for a chat not posted yet, since ``useChat({resume: true})`` asks on every mount,
    a new chat's included (an id another owner holds is one: ids are per owner); 404 for an id
    no chat can have."""
    context = context_of(request)
    chat_id = request.match_info["session_id"]
    if not valid_client_id(chat_id):
        raise SessionNotFound(chat_id)
    try:
        session = await context.sessions.get_owned(chat_id, owner_of(request))
    except SessionNotFound:
        last_event_id(request)  # a bad one is a 400 here too
        return web.Response(status=204)
    projector = UIMessageStream()
    after = await resume_point(session, request, projector)
    if after is None:
        return web.Response(status=204)
    async with context.stream_slot(TRANSPORT, owner_of(request)):
        return await serve(request, projector, session.log, after, transport=TRANSPORT, headers=HEADERS)


def add_routes(app: web.Application) -> None:
    """Register the AI SDK's routes."""
    app.router.add_post("/api/chat", chat)
    app.router.add_get("/api/chat/{session_id}/stream", chat_stream)
