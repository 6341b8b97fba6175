"""The ecosystem's streaming protocols over HTTP: the AI SDK's UI message stream and AG-UI.

- ``POST /api/chat``: ``DefaultChatTransport``'s body; the chat ``id`` names the caller's
  session (made on first use), the last user message is the new query; the reply is the query's
  UI message stream (:mod:`service.transports.aisdk`).
- ``GET /api/chat/{id}/stream``: ``useChat``'s resume; 204 when no query runs (a chat not posted
  yet included, and an id only another owner holds: the caller may make its own chat of it),
  else the running query from its first event (from after ``Last-Event-ID`` when one is sent).
- ``POST /ag-ui``: a ``RunAgentInput``; ``threadId`` names the session as above; the reply is the
  query's AG-UI events (:mod:`service.transports.agui`).
- ``GET /ag-ui/{threadId}/events``: the running query's AG-UI events again, after
  ``Last-Event-ID``; 204 when no query runs.

A query that waits for tool approvals ends either stream the protocol's way (the AI SDK's step
awaiting approval, AG-UI's interrupt outcome) while it keeps waiting on the server; the client's
next request carries the answers (AI SDK: tool parts ``approval-responded``; AG-UI: ``resume``),
which are answered through :mod:`service.transports.approvals` like every other transport's, and
gets the rest of the same query rather than starting a new one. Such a request answers the turn
whole or not at all: every answer is checked before any is applied, and one that leaves some of
the query's pending approvals out is a 409 naming them (the query could not go on with it).

Stopping is ``POST /sessions/{id}/cancel``, whichever stream (first or resumed) a client reads.
Each route reads the log through the one :class:`~service.transports.follow.Follower` path, as
the session routes do, under the same access rules, quotas and error replies; a client that goes
away leaves its query running (a session's query is not the stream's), to be resumed or stopped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ag_ui.core import RunAgentInput, RunStartedEvent
from aiohttp import web
from pydantic import ValidationError

from service import jsonsafe
from service.core.events import StatusChange, ToolApprovalRequest, is_terminal
from service.core.log import LogEntry
from service.core.sessions import WAITING, Session, valid_client_id
from service.errors import ApprovalError, ApprovalsUnanswered, SessionNotFound
from service.transports import agui, aisdk, approvals, dialects
from service.transports.auth import owner_of
from service.transports.context import Context, context_of, session_of
from service.transports.follow import Ending, Follower, Stop
from service.transports.inputs import ApprovalAnswer, check_length, read_json
from service.transports.middleware import json_error
from service.transports.sse import event_stream, last_event_id
from service.transports.sse_writes import write_blocks

CLIENT_ID_RULE = "1 to 128 of A-Z, a-z, 0-9, _ and -"


class Wire:
    """One protocol's writer for one stream: the entry's blocks, how a cut stream ends, the end."""

    def __init__(
        self,
        blocks: Callable[[LogEntry], str],
        prime: Callable[[list[LogEntry]], None],
        ended: Callable[[Ending], str],
        paused: Callable[[], str],
        trailer: str = "",
    ) -> None:
        self.blocks = blocks
        self.prime = prime
        self.ended = ended
        self.paused = paused  # how a stream ends while its query waits for approvals
        self.trailer = trailer
        self.head = ""  # written first (a continued AG-UI run's RUN_STARTED)


def ai_sdk_wire() -> Wire:
    """A fresh AI SDK UI message stream."""
    stream = aisdk.UIMessageStream()

    def ended(ending: Ending) -> str:
        parts = stream.ended(ending.as_error())
        return "".join(dialects.sse_block(jsonsafe.dumps(part)) for part in parts)

    def paused() -> str:
        return "".join(dialects.sse_block(jsonsafe.dumps(part)) for part in stream.paused())

    return Wire(lambda entry: aisdk.blocks(stream, entry), stream.prime, ended, paused, aisdk.DONE_BLOCK)


def ag_ui_wire(thread_id: str, history: list[dict[str, Any]], run_id: str | None = None) -> Wire:
    """A fresh AG-UI event stream."""
    stream = agui.AgUiStream(thread_id, history, run_id)

    def ended(ending: Ending) -> str:
        return "".join(agui.encode(event) for event in stream.ended(ending.as_error()))

    def paused() -> str:
        return "".join(agui.encode(event) for event in stream.paused())

    return Wire(lambda entry: agui.blocks(stream, entry), stream.prime, ended, paused)


def waits_after(batch: list[LogEntry]) -> bool:
    """True when the batch leaves the query waiting for approvals (its last status change says so)."""
    waiting = False
    for entry in batch:
        event = entry.event
        if isinstance(event, StatusChange):
            waiting = event.status == WAITING
        elif is_terminal(event):
            waiting = False
    return waiting


async def _stream(
    request: web.Request,
    context: Context,
    session: Session,
    after: int,
    wire: Wire,
    transport: str,
    **options: Any,
) -> web.StreamResponse:
    """Write the query's entries after ``after`` through ``wire`` until its terminal event."""
    timeout = context.settings.sse_send_timeout_s
    delivered = context.metrics.delivered(transport)
    async with event_stream(request, context, **options) as response:
        if wire.head:
            await write_blocks(request, response, wire.head.encode(), timeout)
        follower = Follower(session.log, after, stop=Stop.AT_TERMINAL)
        async with follower as batches:
            async for batch in batches:
                payload = "".join([wire.blocks(entry) for entry in batch])
                pause = waits_after(batch)
                if pause:
                    payload += wire.paused()
                if payload:
                    await write_blocks(request, response, payload.encode(), timeout)
                delivered.inc(len(batch))
                if pause:
                    break  # the query waits for its approvals: this stream's part of it is told
        ending = follower.ending
        tail = wire.trailer
        if ending is not None and not ending.clean:
            # Purged past this reader, the store gone, or the log closed under it: say so in the
            # protocol's own error shape rather than hang up.
            tail = wire.ended(ending) + tail
        if tail:
            await write_blocks(request, response, tail.encode(), timeout)
    return response


async def _start(
    request: web.Request, context: Context, session_id: str, query: str
) -> tuple[Session, int, list[dict[str, Any]]]:
    """The caller's session of that id (made on first use) with ``query`` started in it, the id
    its events come after, and the conversation before it (ids are per owner: see
    :meth:`~service.core.sessions.SessionStore.open`). 409 while a query runs."""
    check_length(context.settings, query, "message")
    session = await context.sessions.open(session_id, owner_of(request))
    history = list(session.messages)  # before the query adds to it
    after = await session.log.last_id()
    await context.runs.start(session, query)
    return session, after, history


async def _resume_from(session: Session, request: web.Request, wire: Wire) -> int | None:
    """Where a resumed stream starts (``None``: no query runs, a 204): the running query's first
    event, or after ``Last-Event-ID``, with the wire primed on what the client has seen."""
    after = last_event_id(request)  # a bad one is a 400 whether or not a query runs
    if not session.active:
        return None
    log = session.log
    last = await log.last_id()
    start = session.run_start_id - 1 if session.run_start_id else last
    if after is None or after <= start:
        return start
    if after > last:
        raise json_error(400, f"Last-Event-ID {after} is ahead of the session's last event id {last}")
    # EventsPurged (a 410 naming the oldest id kept) when the query's start is gone.
    wire.prime(await log.read(start, after - start))
    return after


async def _answer_all(
    context: Context, session: Session, answers: list[tuple[str, ApprovalAnswer]], by: str
) -> None:
    """Answer the turn's approvals together, as every transport checks one; a refusal (404, 409,
    422) is the reply, and then none of them is answered."""
    try:
        await approvals.answer_turn(context, session, answers, by)
    except ApprovalsUnanswered as exc:
        raise json_error(exc.status, str(exc), code=exc.code, unanswered=exc.unanswered) from None
    except ApprovalError as exc:
        raise json_error(exc.status, str(exc)) from None


def _query_start(session: Session) -> int:
    """The id after which the session's query in flight begins (read before answering it, since
    the query may end at once)."""
    return session.run_start_id - 1 if session.run_start_id else 0


async def _continued(session: Session, start: int, approval_ids: set[str], wire: Wire) -> int:
    """Where the rest of a query that waited on ``approval_ids`` starts: after the status change
    that followed their requests, with the wire primed on the query up to there."""
    entries = await session.log.read(start, await session.log.last_id() - start)
    asked = False
    for n, entry in enumerate(entries):
        event = entry.event
        if isinstance(event, ToolApprovalRequest) and event.approval_id in approval_ids:
            asked = True
        elif asked and isinstance(event, StatusChange) and event.status == WAITING:
            wire.prime(entries[: n + 1])
            wire.paused()  # as the stream that stopped there ended it (its open step closed)
            return entry.id
    raise json_error(409, "those approvals belong to no query that runs in this session")


# -- the AI SDK ---------------------------------------------------------------------------------


async def chat(request: web.Request) -> web.StreamResponse:
    """``POST /api/chat``: the query of the chat's last user message, as a UI message stream."""
    context = context_of(request)
    body = await read_json(request, aisdk.ChatRequest)
    try:
        answers = aisdk.approvals_of(body.messages)
    except ValueError as exc:
        raise json_error(422, f"invalid request: messages.{exc}") from None
    try:
        query = "" if answers else aisdk.query_of(body.messages)
    except ValueError as exc:
        raise json_error(422, f"invalid request: messages: {exc}") from None
    async with context.stream_slot("aisdk", owner_of(request)):
        if answers:
            return await _chat_approved(request, context, body.id, answers)
        session, after, _ = await _start(request, context, body.id, query)
        return await _stream(
            request,
            context,
            session,
            after,
            ai_sdk_wire(),
            "aisdk",
            headers=aisdk.HEADERS,
            allow_all_methods=True,
        )


async def _chat_approved(
    request: web.Request, context: Context, chat_id: str, replies: list[tuple[str, ApprovalAnswer]]
) -> web.StreamResponse:
    """The chat's approval answers (``addToolApprovalResponse``): answered, then the rest of the
    query that waited for them."""
    session = await context.sessions.get_owned(chat_id, owner_of(request))
    start = _query_start(session)
    await _answer_all(context, session, replies, "ai-sdk")
    wire = ai_sdk_wire()
    after = await _continued(session, start, {approval_id for approval_id, _ in replies}, wire)
    return await _stream(
        request, context, session, after, wire, "aisdk", headers=aisdk.HEADERS, allow_all_methods=True
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
    wire = ai_sdk_wire()
    after = await _resume_from(session, request, wire)
    if after is None:
        return web.Response(status=204)
    async with context.stream_slot("aisdk", owner_of(request)):
        return await _stream(request, context, session, after, wire, "aisdk", headers=aisdk.HEADERS)


# -- AG-UI --------------------------------------------------------------------------------------


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
        async with context.stream_slot("ag-ui", owner_of(request)):
            return await _ag_ui_resumed(request, context, body, answers)
    try:
        query = agui.query_of(body)
    except ValueError as exc:
        raise json_error(422, f"invalid request: messages: {exc}") from None
    async with context.stream_slot("ag-ui", owner_of(request)):
        session, after, history = await _start(request, context, body.thread_id, query)
        wire = ag_ui_wire(body.thread_id, history, body.run_id)
        return await _stream(
            request, context, session, after, wire, "ag-ui", sep="\n", allow_all_methods=True
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
    start = _query_start(session)
    history = agui.history_before(session.messages, session.run_message)
    await _answer_all(context, session, answers, "ag-ui")
    wire = ag_ui_wire(body.thread_id, history, body.run_id)
    after = await _continued(session, start, {approval_id for approval_id, _ in answers}, wire)
    wire.head = agui.encode(RunStartedEvent(thread_id=body.thread_id, run_id=body.run_id))
    return await _stream(request, context, session, after, wire, "ag-ui", sep="\n", allow_all_methods=True)


async def ag_ui_events(request: web.Request) -> web.StreamResponse:
    """``GET /ag-ui/{threadId}/events``: the running query's events (after ``Last-Event-ID``)."""
    context, session = await session_of(request)
    wire = ag_ui_wire(
        request.match_info["session_id"], agui.history_before(session.messages, session.run_message)
    )
    after = await _resume_from(session, request, wire)
    if after is None:
        return web.Response(status=204)
    async with context.stream_slot("ag-ui", owner_of(request)):
        return await _stream(request, context, session, after, wire, "ag-ui", sep="\n")


def add_routes(app: web.Application) -> None:
    """Register the AI SDK and AG-UI routes."""
    app.router.add_post("/api/chat", chat)
    app.router.add_get("/api/chat/{session_id}/stream", chat_stream)
    app.router.add_post("/ag-ui", ag_ui_run)
    app.router.add_get("/ag-ui/{session_id}/events", ag_ui_events)
