"""Where a protocol face's stream of a query starts: a query it starts in the caller's chat, the
running query again after ``Last-Event-ID`` (``useChat``'s resume, AG-UI's events), or the rest
of a query that waited for approvals. The AI SDK and AG-UI faces share these; their projectors
keep state, so each is primed with what its client has already seen."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from aiohttp import web

from service.core.agents import check_bound, check_client_tools, chosen
from service.core.events import ClientToolRequest, StatusChange, ToolApprovalRequest, is_terminal
from service.core.log import LogEntry
from service.core.options import RunOptions
from service.core.sessions import WAITING, Session
from service.errors import SessionNotFound
from service.transports.edge.auth import owner_of
from service.transports.edge.context import Context
from service.transports.edge.inputs import check_length, last_event_id
from service.transports.edge.middleware import json_error

CLIENT_ID_RULE = "1 to 128 of A-Z, a-z, 0-9, _ and -"


class Primed(Protocol):
    """A stateful projector that can take in what its client has seen, writing nothing."""

    def prime(self, entries: list[LogEntry]) -> None: ...

    def paused(self) -> Any: ...


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


async def start_query(
    request: web.Request,
    context: Context,
    session_id: str,
    query: str,
    options: Callable[[Session], RunOptions] | None = None,
    strategy: str = "reject",
    agent: str | None = None,
    client_tools: int = 0,
) -> tuple[Session, int, list[dict[str, Any]]]:
    """The caller's session of that id (made on first use, of ``agent`` or the default one) with
    ``query`` started in it (its ``options`` made from the session as it stands), the id its
    events come after, and the conversation before it (ids are per owner: see
    :meth:`~service.core.sessions.SessionStore.open`). While a query runs, ``strategy`` decides
    (see :mod:`service.core.multitask`): a 409, or this one waits its turn, or the running one
    stops; the stream starts with the first event this query logs (a rewind's, if it makes one).

    Refused before any session is made or stream starts: an unknown ``agent`` (422 naming the
    known ones), one other than an existing session's (409: a session keeps its agent), and
    ``client_tools`` (how many the query brings) for an agent that takes none (422)."""
    if query:
        check_length(context.settings, query, "message")
    directory = context.agents
    wanted = chosen(directory, agent)
    owner = owner_of(request)
    if agent or client_tools:  # only then can the request be refused for its session's agent
        try:
            bound: str | None = (await context.sessions.get_owned(session_id, owner)).agent
        except SessionNotFound:
            bound = None
        if bound is not None:
            check_bound(directory, bound, agent)
        check_client_tools(directory, bound or wanted, client_tools)
    session = await context.sessions.open(session_id, owner, agent=wanted)
    check_bound(directory, session.agent, agent)  # made by another first use at the same moment
    history = list(session.messages)  # before the query adds to it
    sent = await context.multitask.send(
        session, query, None, options(session) if options is not None else None, strategy
    )
    run = sent.run or await sent.started
    return session, run.first_id - 1, history


async def resume_point(session: Session, request: web.Request, projector: Primed) -> int | None:
    """Where a resumed stream starts (``None``: no query runs, a 204): the running query's first
    event, or after ``Last-Event-ID``, with the projector primed on what the client has seen."""
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
    projector.prime(await log.read(start, after - start))
    return after


def query_start(session: Session) -> int:
    """The id after which the session's query in flight begins (read before answering it, since
    the query may end at once)."""
    return session.run_start_id - 1 if session.run_start_id else 0


async def continued_from(session: Session, start: int, approval_ids: set[str], projector: Primed) -> int:
    """Where the rest of a query that waited on ``approval_ids`` starts (approvals, or client
    tool calls by :func:`~service.core.events.client_tool_key`): after the status change that
    followed their requests, with the projector primed on the query up to there."""
    entries = await session.log.read(start, await session.log.last_id() - start)
    asked = False
    for n, entry in enumerate(entries):
        event = entry.event
        if isinstance(event, ToolApprovalRequest | ClientToolRequest) and event.approval_id in approval_ids:
            asked = True
        elif asked and isinstance(event, StatusChange) and event.status == WAITING:
            projector.prime(entries[: n + 1])
            projector.paused()  # as the stream that stopped there ended it (its open step closed)
            return entry.id
    raise json_error(409, "those approvals or tool calls belong to no query that runs in this session")
