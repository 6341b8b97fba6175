"""AG-UI's routes: an ``HttpAgent`` run, and the running query's events again.

- ``POST /ag-ui``: a ``RunAgentInput``; ``threadId`` names the caller's session (made on first
  use); the reply is the query's AG-UI events (:mod:`service.transports.agui.projector`).
- ``GET /ag-ui/{threadId}/events``: the running query's AG-UI events again, after
  ``Last-Event-ID``; 204 when no query runs.

A query that waits for tool approvals ends the run with AG-UI's interrupt outcome while it keeps
waiting on the server; the next ``RunAgentInput`` whose ``resume`` answers the interrupts (all of
them, or a 409 naming those left out) gets the rest of the same query.
"""

from __future__ import annotations

from ag_ui.core import RunAgentInput, RunStartedEvent
from aiohttp import web
from pydantic import ValidationError

from service.core.sessions import valid_client_id
from service.transports.agui.models import history_before, query_of
from service.transports.agui.projector import AgUiStream, encode
from service.transports.edge.approvals import answer_all
from service.transports.edge.auth import owner_of
from service.transports.edge.context import Context, context_of, session_of
from service.transports.edge.inputs import ApprovalAnswer, read_json
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
    """``POST /ag-ui``: a ``RunAgentInput``'s last user message as a query, streamed as AG-UI events."""
    context = context_of(request)
    body = await read_json(request, RunAgentInput)
    if not valid_client_id(body.thread_id):
        raise json_error(422, f"invalid request: threadId: {CLIENT_ID_RULE}")
    try:
        body.run_id.encode("utf-8")  # echoed in RUN_STARTED / RUN_FINISHED: refused before any stream
    except UnicodeEncodeError:
        raise json_error(
            422, "invalid request: runId: must be valid Unicode text (no lone surrogates)"
        ) from None
    if body.resume:
        answers = _resume_answers(body)
        async with context.stream_slot(TRANSPORT, owner_of(request)):
            return await _ag_ui_resumed(request, context, body, answers)
    try:
        query = query_of(body)
    except ValueError as exc:
        raise json_error(422, f"invalid request: messages: {exc}") from None
    async with context.stream_slot(TRANSPORT, owner_of(request)):
        session, after, history = await start_query(request, context, body.thread_id, query)
        projector = AgUiStream(body.thread_id, history, body.run_id)
        return await serve(
            request, projector, session.log, after, transport=TRANSPORT, sep=SEP, allow_all_methods=True
        )


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
    request: web.Request, context: Context, body: RunAgentInput, answers: list[tuple[str, ApprovalAnswer]]
) -> web.StreamResponse:
    """A run that answers the interrupts that ended the thread's last one: the rest of its query."""
    session = await context.sessions.get_owned(body.thread_id, owner_of(request))
    start = query_start(session)
    history = history_before(session.messages, session.run_message)
    await answer_all(context, session, answers, "ag-ui")
    head = encode(RunStartedEvent(thread_id=body.thread_id, run_id=body.run_id))
    projector = AgUiStream(body.thread_id, history, body.run_id, head)
    after = await continued_from(session, start, {approval_id for approval_id, _ in answers}, projector)
    return await serve(
        request, projector, session.log, after, transport=TRANSPORT, sep=SEP, allow_all_methods=True
    )


async def ag_ui_events(request: web.Request) -> web.StreamResponse:
    """``GET /ag-ui/{threadId}/events``: the running query's events (after ``Last-Event-ID``)."""
    context, session = await session_of(request)
    history = history_before(session.messages, session.run_message)
    projector = AgUiStream(request.match_info["session_id"], history)
    after = await resume_point(session, request, projector)
    if after is None:
        return web.Response(status=204)
    async with context.stream_slot(TRANSPORT, owner_of(request)):
        return await serve(request, projector, session.log, after, transport=TRANSPORT, sep=SEP)


def add_routes(app: web.Application) -> None:
    """Register AG-UI's routes."""
    app.router.add_post("/ag-ui", ag_ui_run)
    app.router.add_get("/ag-ui/{session_id}/events", ag_ui_events)
