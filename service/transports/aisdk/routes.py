"""The Vercel AI SDK's routes: ``useChat`` with ``DefaultChatTransport``, its resume, and the chat
to show again.

- ``POST /api/chat``: the chat ``id`` names the caller's session (made on first use, of the
  body's ``agent``: an existing chat keeps its own, and naming another is a 409), the last
  user message is the new query and keeps its id; the reply is the query's UI message stream
  (:mod:`service.transports.aisdk.projector`), whose ``start`` carries the id the server keeps
  the answer by. ``trigger`` and ``messageId`` say what the message does (see :func:`_actions`):
  a new message, an edit of an earlier one of the user's, or the answer to a question again.
  ``multitask_strategy`` says what it does while a query runs (a 409 by default).
- ``GET /api/chat/{id}/stream``: ``useChat``'s resume; 204 when no query runs (a chat not posted
  yet included, and an id only another owner holds: the caller may make its own chat of it),
  else the running query from its first event (from after ``Last-Event-ID`` when one is sent).
- ``GET /api/chat/{id}``: the chat as ``UIMessage[]`` (:mod:`service.transports.aisdk.history`).

A query that waits (for tool approvals, or for the results of the browser's own tools, declared
in the body's ``tools``) ends the stream as the SDK ends a step awaiting them, while it keeps
waiting on the server. The client's next ``POST /api/chat`` carries the answers (tool parts
``approval-responded``; browser tool parts ``output-available`` / ``output-error``), answered
together through the edge (all of them or none: leaving some of the query's pending ones out
is a 409 naming them; one the session does not wait on is a 404 or 409), and gets the rest of
the same query.

Stopping is ``POST /sessions/{id}/cancel``, whichever stream a client reads. A client that goes
away leaves its query running (a session's query is not the stream's), to be resumed or stopped.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from service import jsonsafe
from service.core import conversation
from service.core.agents import check_bound
from service.core.events import client_tool_key
from service.core.options import RunOptions
from service.core.sessions import Session, valid_client_id
from service.errors import MessageNotFound, SessionNotFound
from service.transports.aisdk.history import ui_messages
from service.transports.aisdk.models import (
    ChatRequest,
    approvals_of,
    client_tools_of,
    new_message_id,
    query_of,
    tool_results_of,
)
from service.transports.aisdk.projector import HEADERS, UIMessageStream
from service.transports.edge.actions import answer_tool_results, client_tool_specs, options_for
from service.transports.edge.approvals import answer_all
from service.transports.edge.auth import owner_of
from service.transports.edge.context import Context, context_of
from service.transports.edge.inputs import ClientTool, last_event_id, read_json
from service.transports.edge.middleware import json_error
from service.transports.stream.resume import continued_from, query_start, resume_point, start_query
from service.transports.stream.sse import serve

TRANSPORT = "aisdk"
BY = "ai-sdk"


def _server_tool(context: Context) -> Callable[[str], bool]:
    """Tells the service's own tools (dynamic tool parts) from the browser's (static ones)."""
    return lambda name: context.tool_schema(name) is not None


def _projector(context: Context) -> UIMessageStream:
    return UIMessageStream(_server_tool(context))


async def chat(request: web.Request) -> web.StreamResponse:
    """``POST /api/chat``: the chat's new query (or the rest of one that waited on the browser),
    as a UI message stream."""
    context = context_of(request)
    body = await read_json(request, ChatRequest)
    try:
        tools = client_tools_of(body)
    except ValueError as exc:
        raise json_error(422, f"invalid request: {exc}") from None
    client_tool_specs(context, tools)  # a clash with a service tool is a 422 on every request
    submitted = body.trigger == "submit-message"
    try:
        answers = approvals_of(body.messages)
        results = tool_results_of(body.messages) if submitted and not answers else []
        query = "" if answers or results else query_of(body.messages)
    except ValueError as exc:
        raise json_error(422, f"invalid request: messages.{exc}") from None
    async with context.stream_slot(TRANSPORT, owner_of(request)):
        if answers:
            session = await context.sessions.get_owned(body.id, owner_of(request))
            check_bound(context.agents, session.agent, body.agent)
            start = query_start(session)
            await answer_all(context, session, answers, BY)
            return await _rest_of_query(request, context, session, start, {key for key, _ in answers})
        if results:
            session = await context.sessions.get_owned(body.id, owner_of(request))
            check_bound(context.agents, session.agent, body.agent)
            start = query_start(session)
            await answer_tool_results(context, session, results, BY)
            keys = {client_tool_key(call) for call, _ in results}
            return await _rest_of_query(request, context, session, start, keys)
        session, after, _ = await start_query(
            request,
            context,
            body.id,
            query,
            options=lambda session: _options(context, session, body, tools),
            strategy=body.multitask_strategy,
            agent=body.agent,
            client_tools=len(tools),
        )
        return await serve(
            request,
            _projector(context),
            session.log,
            after,
            transport=TRANSPORT,
            headers=HEADERS,
            allow_all_methods=True,
        )


def _options(context: Context, session: Session, body: ChatRequest, tools: list[ClientTool]) -> RunOptions:
    """The query's options, from ``trigger`` and ``messageId``:

    - ``submit-message`` without ``messageId``: a new message, with the id of the last one sent
      (unless the conversation holds that id already: then the service makes one);
    - ``submit-message`` naming an earlier message of the user's: an edit (the conversation cut
      back to before it, the edited text asked, the id kept);
    - ``regenerate-message``: the answer ``messageId`` names (or the last) given again, to the
      question as the server holds it; naming a question instead answers it again (an edit with
      the text sent).

    An id the conversation does not hold (as the kind asked) is a 404, which the core checks
    again once the query holds the session.
    """
    wanted = body.messageId
    messages = session.messages
    if body.trigger == "regenerate-message":
        if wanted is None:
            return options_for(context, session, regenerate=True, tools=tools)
        index = conversation.find(messages, wanted)
        if index is None:
            raise MessageNotFound(f"this chat holds no message with the id {wanted!r} to regenerate")
        if conversation.is_user_text(messages[index]):
            return options_for(context, session, edit=wanted, tools=tools)
        return options_for(context, session, regenerate=wanted, tools=tools)
    if wanted is not None:
        return options_for(context, session, edit=wanted, tools=tools)
    held = new_message_id(body.messages)
    if held is not None and conversation.find(messages, held) is not None:
        held = None
    return options_for(context, session, message_id=held, tools=tools)


async def _rest_of_query(
    request: web.Request, context: Context, session: Session, start: int, keys: set[str]
) -> web.StreamResponse:
    """The rest of the query that waited on ``keys`` (approvals, or browser tool calls), once
    they are answered."""
    projector = _projector(context)
    after = await continued_from(session, start, keys, projector)
    return await serve(
        request,
        projector,
        session.log,
        after,
        transport=TRANSPORT,
        headers=HEADERS,
        allow_all_methods=True,
    )


def _owned_chat_id(request: web.Request) -> str:
    chat_id = request.match_info["session_id"]
    if not valid_client_id(chat_id):
        raise SessionNotFound(chat_id)
    return chat_id


async def chat_stream(request: web.Request) -> web.StreamResponse:
    """``GET /api/chat/{id}/stream``: the running query again (``useChat``'s resume); 204 when none
    runs, also for a chat not posted yet, since ``useChat({resume: true})`` asks on every mount,
    a new chat's included (an id another owner holds is one: ids are per owner); 404 for an id
    no chat can have."""
    context = context_of(request)
    chat_id = _owned_chat_id(request)
    try:
        session = await context.sessions.get_owned(chat_id, owner_of(request))
    except SessionNotFound:
        last_event_id(request)  # a bad one is a 400 here too
        return web.Response(status=204)
    projector = _projector(context)
    after = await resume_point(session, request, projector)
    if after is None:
        return web.Response(status=204)
    async with context.stream_slot(TRANSPORT, owner_of(request)):
        return await serve(request, projector, session.log, after, transport=TRANSPORT, headers=HEADERS)


async def chat_messages(request: web.Request) -> web.Response:
    """``GET /api/chat/{id}``: the chat as the AI SDK's ``UIMessage[]``; 404 for a chat the caller
    has not made."""
    context = context_of(request)
    session = await context.sessions.get_owned(_owned_chat_id(request), owner_of(request))
    return web.json_response(ui_messages(session.messages, _server_tool(context)), dumps=jsonsafe.dumps)


def add_routes(app: web.Application) -> None:
    """Register the AI SDK's routes."""
    app.router.add_post("/api/chat", chat)
    app.router.add_get("/api/chat/{session_id}/stream", chat_stream)
    app.router.add_get("/api/chat/{session_id}", chat_messages)
