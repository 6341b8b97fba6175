"""The ecosystem's streaming protocols over HTTP: the AI SDK's UI message stream and AG-UI.

- ``POST /api/chat``: ``DefaultChatTransport``'s body; the chat ``id`` names the caller's
  session (made on first use), the last user message is the new query; the reply is the query's
  UI message stream (:mod:`service.transports.aisdk`).
- ``GET /api/chat/{id}/stream``: ``useChat``'s resume; 204 when no query runs, else the running
  query from its first event (from after ``Last-Event-ID`` when one is sent).
- ``POST /ag-ui``: a ``RunAgentInput``; ``threadId`` names the session as above; the reply is the
  query's AG-UI events (:mod:`service.transports.agui`).
- ``GET /ag-ui/{threadId}/events``: the running query's AG-UI events again, after
  ``Last-Event-ID``; 204 when no query runs.

Stopping is ``POST /sessions/{id}/cancel``, whichever stream (first or resumed) a client reads.
Each route reads the log through the one :class:`~service.transports.follow.Follower` path, as
the session routes do, under the same access rules, quotas and error replies; a client that goes
away leaves its query running (a session's query is not the stream's), to be resumed or stopped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ag_ui.core import RunAgentInput
from aiohttp import web

from service.core.log import LogEntry
from service.core.sessions import RUNNING, Session, valid_client_id
from service.transports import agui, aisdk, dialects
from service.transports.auth import owner_of
from service.transports.context import Context, context_of, session_of
from service.transports.follow import Ending, Follower, Stop
from service.transports.inputs import check_length, read_json
from service.transports.middleware import json_error
from service.transports.sse import event_stream, last_event_id, write_blocks

CLIENT_ID_RULE = "1 to 128 of A-Z, a-z, 0-9, _ and -"


class Wire:
    """One protocol's writer for one stream: the entry's blocks, how a cut stream ends, the end."""

    def __init__(
        self,
        blocks: Callable[[LogEntry], str],
        prime: Callable[[list[LogEntry]], None],
        ended: Callable[[Ending], str],
        trailer: str = "",
    ) -> None:
        self.blocks = blocks
        self.prime = prime
        self.ended = ended
        self.trailer = trailer


def ai_sdk_wire() -> Wire:
    """A fresh AI SDK UI message stream."""
    stream = aisdk.UIMessageStream()

    def ended(ending: Ending) -> str:
        parts = stream.ended(ending.as_error())
        return "".join(dialects.sse_block(dialects.dumps(part)) for part in parts)

    return Wire(lambda entry: aisdk.blocks(stream, entry), stream.prime, ended, aisdk.DONE_BLOCK)


def ag_ui_wire(thread_id: str, history: list[dict[str, Any]], run_id: str | None = None) -> Wire:
    """A fresh AG-UI event stream."""
    stream = agui.AgUiStream(thread_id, history, run_id)

    def ended(ending: Ending) -> str:
        return "".join(agui.encode(event) for event in stream.ended(ending.as_error()))

    return Wire(lambda entry: agui.blocks(stream, entry), stream.prime, ended)


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
    delivered = context.metrics.events_delivered.labels(transport)
    async with event_stream(request, context, **options) as response:
        follower = Follower(session.log, after, stop=Stop.AT_TERMINAL)
        async with follower as batches:
            async for batch in batches:
                payload = "".join([wire.blocks(entry) for entry in batch])
                if payload:
                    await write_blocks(request, response, payload.encode(), timeout)
                delivered.inc(len(batch))
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
    its events come after, and the conversation before it. 404 for another key's id, 409 while a
    query runs."""
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
    if session.status != RUNNING:
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


# -- the AI SDK ---------------------------------------------------------------------------------


async def chat(request: web.Request) -> web.StreamResponse:
    """``POST /api/chat``: the query of the chat's last user message, as a UI message stream."""
    context = context_of(request)
    body = await read_json(request, aisdk.ChatRequest)
    try:
        query = aisdk.query_of(body.messages)
    except ValueError as exc:
        raise json_error(422, f"invalid request: messages: {exc}") from None
    async with context.stream_slot("aisdk", owner_of(request)):
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


async def chat_stream(request: web.Request) -> web.StreamResponse:
    """``GET /api/chat/{id}/stream``: the running query again (``useChat``'s resume); 204 when none runs."""
    context, session = await session_of(request)
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
    try:
        query = agui.query_of(body)
    except ValueError as exc:
        raise json_error(422, f"invalid request: messages: {exc}") from None
    if not valid_client_id(body.thread_id):
        raise json_error(422, f"invalid request: threadId: {CLIENT_ID_RULE}")
    async with context.stream_slot("ag-ui", owner_of(request)):
        session, after, history = await _start(request, context, body.thread_id, query)
        wire = ag_ui_wire(session.id, history, body.run_id)
        return await _stream(
            request, context, session, after, wire, "ag-ui", sep="\n", allow_all_methods=True
        )


async def ag_ui_events(request: web.Request) -> web.StreamResponse:
    """``GET /ag-ui/{threadId}/events``: the running query's events (after ``Last-Event-ID``)."""
    context, session = await session_of(request)
    wire = ag_ui_wire(session.id, agui.history_before(session.messages, session.run_message))
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
