"""AG-UI's routes: an ``HttpAgent`` run, and the running query's events again.

- ``POST /ag-ui``: a ``RunAgentInput``; ``threadId`` names the caller's session (made on first
  use, of the default agent); the reply is the query's AG-UI events
  (:mod:`service.transports.agui.projector`). ``POST /ag-ui/{agent}`` is the same with the
  thread made for that agent (an ``HttpAgent`` per agent URL): an unknown one is a 422 naming
  the agents there are, and a thread made for another a 409, since a thread keeps its agent. Its
  ``tools`` are the client's own (their calls wait for the client's results), and
  ``forwardedProps.multitask_strategy`` says what it does while a query runs.
- ``GET /ag-ui/{threadId}/events``: the running query's AG-UI events again, after
  ``Last-Event-ID``; 204 when none runs.

A query that waits ends the run while it keeps waiting on the server: the next ``RunAgentInput``
whose ``resume`` answers its approval interrupts, or whose last messages are the ``role: "tool"``
results of its calls of the client's tools (all of them, or a 409 naming those left out), gets
the rest of the same query.
"""

from __future__ import annotations

from ag_ui.core import RunAgentInput
from aiohttp import web
from pydantic import ValidationError

from service.core import conversation
from service.core.agents import check_bound, chosen
from service.core.events import client_tool_key
from service.core.options import RunOptions
from service.core.sessions import Session, valid_client_id
from service.transports.agui.models import InputError, client_tools, new_message, strategy_of, tool_results
from service.transports.agui.projector import AgUiStream
from service.transports.edge.actions import answer_tool_results, client_tool_specs, options_for
from service.transports.edge.approvals import answer_all
from service.transports.edge.auth import owner_of
from service.transports.edge.context import Context, context_of, session_of
from service.transports.edge.inputs import ApprovalAnswer, ClientTool, ToolResultRequest, read_json
from service.transports.edge.middleware import json_error
from service.transports.stream.resume import (
    CLIENT_ID_RULE,
    continued_from,
    query_start,
    resume_point,
    start_query,
)
from service.transports.stream.sse import serve

TRANSPORT = "ag-ui"
SEP = "\n"  # AG-UI's client splits events on a bare "\n\n": pings too


async def ag_ui_run(request: web.Request) -> web.StreamResponse:
    """``POST /ag-ui`` (``/ag-ui/{agent}``): a ``RunAgentInput``'s last user message as a query (or
    its tool messages as the results the thread's query waits on), streamed as AG-UI events."""
    context = context_of(request)
    agent = request.match_info.get("agent")
    if agent is not None:
        chosen(context.agents, agent)  # an unknown agent: a 422 before the body is read
    body = await read_json(request, RunAgentInput)
    if not valid_client_id(body.thread_id):
        raise json_error(422, f"invalid request: threadId: {CLIENT_ID_RULE}")
    try:
        body.run_id.encode("utf-8")  # echoed in RUN_STARTED / RUN_FINISHED: refused before any stream
    except UnicodeEncodeError:
        raise json_error(
            422, "invalid request: runId: must be valid Unicode text (no lone surrogates)"
        ) from None
    try:
        strategy = strategy_of(body)
        tools = client_tools(body)
        results = [] if body.resume else tool_results(body)
        query = None if body.resume or results else new_message(body)
    except InputError as exc:
        raise json_error(422, f"invalid request: {exc}") from None
    client_tool_specs(context, tools)  # a clash with a service tool: a 422 before the thread is made
    answers = _resume_answers(body)
    async with context.stream_slot(TRANSPORT, owner_of(request)):
        if answers:
            return await _ag_ui_resumed(request, context, body, answers, agent)
        if results:
            return await _ag_ui_answered(request, context, body, results, agent)
        assert query is not None
        text, message_id = query
        session, after, _ = await start_query(
            request,
            context,
            body.thread_id,
            text,
            options=lambda session: _options(context, session, message_id, tools),
            strategy=strategy,
            agent=agent,
            client_tools=len(tools),
        )
        projector = AgUiStream(body.thread_id, session.messages, body.run_id)
        return await serve(
            request, projector, session.log, after, transport=TRANSPORT, sep=SEP, allow_all_methods=True
        )


def _options(context: Context, session: Session, message_id: str, tools: list[ClientTool]) -> RunOptions:
    """A new query's options. A user message whose id the thread holds already is an edit (a
    client that edits or retries a message sends it again under its id): the conversation is cut
    back to before it and it is asked again, so every id stays one message's."""
    index = conversation.find(session.messages, message_id)
    if index is None:
        return options_for(context, session, message_id=message_id, tools=tools)
    if not conversation.is_user_text(session.messages[index]):
        raise json_error(
            409,
            f"the last message's id {message_id!r} is that of another message in this thread, not the user's",
        )
    return options_for(context, session, message_id=message_id, edit=message_id, tools=tools)


def _resume_answers(body: RunAgentInput) -> list[tuple[str, ApprovalAnswer]]:
    """The approval answers a ``resume`` carries: a resolved entry's payload is
    ``{approved, reason?, input?}``; a cancelled one denies the call."""
    answers = []
    for n, entry in enumerate(body.resume or []):
        if entry.status == "cancelled":
            answers.append((entry.interrupt_id, ApprovalAnswer(approved=False, reason="cancelled")))
            continue
        try:
            answers.append((entry.interrupt_id, ApprovalAnswer.model_validate(entry.payload)))
        except ValidationError as exc:
            problem = exc.errors()[0]
            where = ".".join(str(part) for part in problem["loc"]) or "payload"
            raise json_error(422, f"invalid request: resume.{n}.payload: {where}: {problem['msg']}") from None
    return answers


async def _ag_ui_resumed(
    request: web.Request,
    context: Context,
    body: RunAgentInput,
    answers: list[tuple[str, ApprovalAnswer]],
    agent: str | None,
) -> web.StreamResponse:
    """A run that answers the interrupts that ended the thread's last one: the rest of its query."""
    session = await context.sessions.get_owned(body.thread_id, owner_of(request))
    check_bound(context.agents, session.agent, agent)
    start = query_start(session)
    await answer_all(context, session, answers, "ag-ui")
    return await _continued(request, session, body, start, {approval_id for approval_id, _ in answers})


async def _ag_ui_answered(
    request: web.Request,
    context: Context,
    body: RunAgentInput,
    results: list[tuple[str, ToolResultRequest]],
    agent: str | None,
) -> web.StreamResponse:
    """A run whose tool messages answer the client tool calls the thread's query waits on: the
    rest of that query."""
    session = await context.sessions.get_owned(body.thread_id, owner_of(request))
    check_bound(context.agents, session.agent, agent)
    start = query_start(session)
    await answer_tool_results(context, session, results, "ag-ui")
    return await _continued(request, session, body, start, {client_tool_key(call) for call, _ in results})


async def _continued(
    request: web.Request, session: Session, body: RunAgentInput, start: int, keys: set[str]
) -> web.StreamResponse:
    projector = AgUiStream(body.thread_id, session.messages, body.run_id, continued=True)
    after = await continued_from(session, start, keys, projector)
    return await serve(
        request, projector, session.log, after, transport=TRANSPORT, sep=SEP, allow_all_methods=True
    )


async def ag_ui_events(request: web.Request) -> web.StreamResponse:
    """``GET /ag-ui/{threadId}/events``: the running query's events (after ``Last-Event-ID``)."""
    context, session = await session_of(request)
    projector = AgUiStream(request.match_info["session_id"], session.messages)
    after = await resume_point(session, request, projector)
    if after is None:
        return web.Response(status=204)
    async with context.stream_slot(TRANSPORT, owner_of(request)):
        return await serve(request, projector, session.log, after, transport=TRANSPORT, sep=SEP)


def add_routes(app: web.Application) -> None:
    """Register AG-UI's routes."""
    app.router.add_post("/ag-ui", ag_ui_run)
    # One segment, POST only: it cannot meet the events' two-segment GET, whatever the order.
    app.router.add_post("/ag-ui/{agent}", ag_ui_run)
    app.router.add_get("/ag-ui/{session_id}/events", ag_ui_events)
