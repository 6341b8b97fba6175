"""Sessions: a conversation, its event log and its status.

Every run belongs to a session; ``POST /agent/stream`` uses a short-lived (ephemeral) one, so
there is one path for all. The store is an interface with two implementations: in this
process's memory (:class:`MemorySessionStore`) and on Redis, shared by several instances
(:mod:`service.store.redis`). Besides keeping sessions, a store is where a run claims its
session, so that one query runs per session however many instances serve it.
"""

from __future__ import annotations

import abc
import hashlib
import re
import secrets
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from service.core.events import (
    ClientToolRequest,
    ClientToolResult,
    Event,
    StatusChange,
    ToolApprovalRequest,
    ToolApprovalResponse,
    Usage,
)
from service.core.log import EventLog, LogEntry, MemoryEventLog
from service.core.records import DEFAULT_AGENT, SessionRecord
from service.errors import QuotaExceeded, SessionExists, SessionLimitReached, SessionNotFound

IDLE = "idle"
RUNNING = "running"
WAITING = "waiting"  # the query waits for a person to approve a tool call
# The statuses of a session whose query is in flight (on whichever instance).
ACTIVE = frozenset({RUNNING, WAITING})

# The states of a tool approval, as the stores keep them (short: Redis keeps one per approval).
PENDING, APPROVED, DENIED, CLOSED, EXPIRED = "p", "1", "0", "x", "e"
# Who answers an approval nobody answered in time (the answer is a denial).
BY_TIMEOUT = "timeout"

# What a query waits on, held alike: a person's approval, or a client tool's result.
Request = ToolApprovalRequest | ClientToolRequest
Answer = ToolApprovalResponse | ClientToolResult


def answered_state(response: Answer) -> str:
    """The state an answer leaves its approval in: an expiry's denial is kept apart from a
    person's, so that a late answer is told it came too late rather than taken as a repeat."""
    if response.by == BY_TIMEOUT:
        return EXPIRED
    return APPROVED if response.approved else DENIED


@dataclass
class Session:
    """One conversation: its messages (Bedrock's format), its event log and its status; ``agent``
    names the agent it was made for, which answers every query in it (see :mod:`service.agents`)."""

    id: str
    log: EventLog
    messages: list[dict[str, Any]] = field(default_factory=list)
    status: str = IDLE
    ephemeral: bool = False
    owner: str = ""
    usage: Usage = field(default_factory=Usage)
    created_at: float = field(default_factory=time.time)
    last_active: float = field(default_factory=time.monotonic)
    # The query in flight, on whichever instance runs it ("" and 0 while idle).
    run_id: str = ""
    run_message: str = ""
    run_start_id: int = 0
    # Once the query in flight has logged this id, it reserves more ids (0: it need not; see
    # SessionStore.reserve_ids).
    ids_renew_at: int = 0
    # Tool approvals by id: their state (PENDING, APPROVED, DENIED, EXPIRED, or CLOSED once the query that
    # asked ended unanswered), and the requests still pending.
    approvals: dict[str, str] = field(default_factory=dict)
    approval_requests: dict[str, Request] = field(default_factory=dict)
    # The fewest messages the conversation was cut back to since it was last recorded (None: not
    # cut), so the durable record replaces what it stored from there (see core/conversation.py).
    cut: int | None = None
    agent: str = DEFAULT_AGENT

    def touch(self) -> None:
        """Note activity, for the idle time-to-live."""
        self.last_active = time.monotonic()

    @property
    def active(self) -> bool:
        """True while a query is in flight (running, or waiting for an approval)."""
        return self.status in ACTIVE

    def pending_approvals(self) -> list[ToolApprovalRequest]:
        """The approval requests nobody has answered yet, oldest first."""
        return [
            request
            for approval_id, request in self.approval_requests.items()
            if type(request) is ToolApprovalRequest and self.approvals.get(approval_id) == PENDING
        ]

    def pending_client_tools(self) -> list[ClientToolRequest]:
        """The client tool calls whose results have not come yet, oldest first."""
        return [
            request
            for approval_id, request in self.approval_requests.items()
            if type(request) is ClientToolRequest and self.approvals.get(approval_id) == PENDING
        ]


async def open_locally(
    session: Session, fence: str | None, status: str, requests: Sequence[Request]
) -> list[LogEntry]:
    """Mark ``requests`` pending, set the status, and log the requests and the status change:
    the default of :meth:`SessionStore.set_waiting`, for a store one process owns."""
    for request in requests:
        session.approvals[request.approval_id] = PENDING
        session.approval_requests[request.approval_id] = request
    session.status = status
    return await session.log.append_many([*requests, StatusChange(status=status)], fence=fence)


def answer_locally(session: Session, response: Answer) -> str | None:
    """Take ``response`` if its approval is pending (then None, and the caller logs it); else the
    approval's state as it stands (APPROVED, DENIED, EXPIRED, CLOSED), or "" with nothing known of it."""
    state = session.approvals.get(response.approval_id)
    if state != PENDING:
        return state or ""
    session.approvals[response.approval_id] = answered_state(response)
    session.approval_requests.pop(response.approval_id, None)
    return None


def close_approvals(session: Session) -> None:
    """The query ended: the approvals it left unanswered can no longer be answered."""
    for approval_id in list(session.approval_requests):
        if session.approvals.get(approval_id) == PENDING:
            session.approvals[approval_id] = CLOSED
    session.approval_requests.clear()


async def append_unless_closed(log: EventLog, events: list[Event]) -> None:
    """Append ``events`` in order, stopping if the log was closed (its session deleted)."""
    for event in events:
        if log.closed:
            return
        await log.append(event)


def new_session_id() -> str:
    """A random, URL-safe session id that cannot be guessed."""
    return secrets.token_urlsafe(16)


# A session id a client may choose (an AI SDK chat id, an AG-UI thread id): the alphabet of
# new_session_id's, so a chosen id and a made one live side by side.
CLIENT_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")


def valid_client_id(session_id: str) -> bool:
    """True for an id a client may choose for a session of its own."""
    return CLIENT_ID.fullmatch(session_id) is not None


# What :func:`scoped_id` makes.
SCOPED_ID = re.compile(r"[A-Za-z0-9_-]{1,115}~[0-9a-f]{12}")


def valid_session_id(session_id: str) -> bool:
    """True for any id a session can have: made, chosen by a client, or a chosen one scoped."""
    return valid_client_id(session_id) or SCOPED_ID.fullmatch(session_id) is not None


def scoped_id(client_id: str, owner: str) -> str:
    """The id ``owner``'s session of ``client_id`` is kept under when another owner holds that
    id: the id (cut to leave room) and a digest of both, within the 128 characters of a client
    id. ``~`` is in no client's id, so no client can choose one of these."""
    digest = hashlib.sha256(f"{owner}\0{client_id}".encode()).hexdigest()[:12]
    return f"{client_id[:115]}~{digest}"


class SessionStore(abc.ABC):
    """Where sessions live."""

    @abc.abstractmethod
    async def create(
        self,
        *,
        ephemeral: bool = False,
        owner: str = "",
        session_id: str | None = None,
        agent: str = DEFAULT_AGENT,
    ) -> Session:
        """Make a new, idle session belonging to ``owner`` and bound to ``agent``, with a new id
        or ``session_id`` (a client's choice, see :func:`valid_client_id`); :class:`SessionExists`
        if that one is taken."""

    @abc.abstractmethod
    async def get(self, session_id: str) -> Session:
        """The session with that id; :class:`SessionNotFound` if there is none."""

    async def get_owned(self, session_id: str, owner: str) -> Session:
        """The session if ``owner`` made it; :class:`SessionNotFound` otherwise, so that a
        session's existence does not leak to other keys. A client-chosen id another owner held
        first names ``owner``'s own session of it (see :meth:`open`)."""
        try:
            session = await self.get(session_id)
        except SessionNotFound:
            session = None
        if session is not None and session.owner == owner:
            return session
        if owner and valid_client_id(session_id):
            session = await self.get(scoped_id(session_id, owner))
            if session.owner == owner:
                return session
        raise SessionNotFound(session_id)

    async def open(self, session_id: str, owner: str, agent: str = DEFAULT_AGENT) -> Session:
        """``owner``'s session of that (client-chosen) id, made on first use (bound to ``agent``;
        a session that exists keeps the agent it was made for).

        Client-chosen ids are per owner: when another owner holds the id, ``owner`` gets a
        session of its own under :func:`scoped_id`, so nobody can take an id before its owner
        uses it, and an id another key holds answers as a free one would. Two first uses at once
        make one session; the second reads the first's.
        """
        try:
            return await self.get_owned(session_id, owner)
        except SessionNotFound:
            pass
        try:
            return await self.create(owner=owner, session_id=session_id, agent=agent)
        except SessionExists:
            pass
        try:
            return await self.get_owned(session_id, owner)  # made by a first use at the same moment
        except SessionNotFound:
            if not owner:
                raise  # held by a key's owner while keys were on: not the anonymous caller's
        scoped = scoped_id(session_id, owner)
        try:
            return await self.create(owner=owner, session_id=scoped, agent=agent)
        except SessionExists:
            return await self.get_owned(scoped, owner)

    @abc.abstractmethod
    async def delete(self, session_id: str) -> None:
        """Forget the session and close its log; :class:`SessionNotFound` if there is none."""

    @abc.abstractmethod
    async def count(self) -> int:
        """How many sessions are held."""

    @abc.abstractmethod
    async def expire_idle(self, now: float | None = None) -> list[str]:
        """Drop sessions idle past the time-to-live; returns their ids."""

    async def restore(self, record: SessionRecord) -> tuple[Session, bool]:
        """Hold again a session loaded from the durable record, its log continuing after the
        stored last id; returns it and whether this call put it back (False: it was held)."""
        raise NotImplementedError(f"{type(self).__name__} cannot restore sessions")

    # -- run coordination: the defaults suit a store that one process owns ------------------

    async def claim_run(self, session: Session, run_id: str) -> str | None:
        """Make ``run_id`` the session's one running query.

        Returns the fence its appends must carry (``None`` where the store needs none), or
        raises :class:`~service.errors.RunInProgress` when another instance runs one. In one
        process the run manager's own table is the claim, so there is nothing to do here.
        """
        return None

    async def finish_run(self, session: Session, fence: str | None, events: list[Event]) -> None:
        """End the run in one step: keep the conversation and usage, append ``events`` (the
        status change and the terminal event), close the approvals it left unanswered, and give
        up the claim."""
        close_approvals(session)
        await append_unless_closed(session.log, events)

    async def reserve_ids(self, session: Session, reached: int) -> None:
        """The query in flight has logged ids up to ``reached`` (past ``session.ids_renew_at``):
        reserve more of them where a store keeps reservations (the durable one does)."""
        session.ids_renew_at = 0

    async def set_status(
        self, session: Session, fence: str | None, status: str, requests: Sequence[Request] = ()
    ) -> list[LogEntry]:
        """In one step: record ``requests`` as pending (approvals or client tool calls), make ``status`` the session's,
        and log the requests then a ``status_change``; the run's claim is the fence."""
        return await open_locally(session, fence, status, requests)

    async def answer_approval(self, session: Session, response: Answer) -> str | None:
        """Log ``response`` if its approval is still pending, checked and logged in one step
        whichever instance answers, so an approval is answered once. Returns None when it was
        taken; otherwise the approval's state (APPROVED, DENIED, EXPIRED, CLOSED), or "" for an
        unknown id."""
        state = answer_locally(session, response)
        if state is None:
            await session.log.append(response)
        return state

    async def cancel_elsewhere(self, session_id: str) -> bool:
        """Ask the instance running the session's query to cancel it; False when none runs."""
        return False


def session_quota_exceeded(limit: int) -> QuotaExceeded:
    """The refusal of a session past its owner's ``AGENT_QUOTA_SESSIONS`` (a 429)."""
    return QuotaExceeded(
        f"too many sessions for this API key: at most {limit} at once; delete one and retry",
        quota="sessions",
        limit=limit,
        retry_after=1,
    )


class MemorySessionStore(SessionStore):
    """Sessions in this process's memory, each with a :class:`MemoryEventLog`.

    Bounded three times: at most ``max_sessions`` at once, at most ``max_per_owner`` of them one
    owner's (short-lived ones aside; 0: no such bound), and an idle session whose last activity is
    older than ``ttl_s`` is dropped by :meth:`expire_idle` (the app calls it periodically).
    """

    def __init__(
        self,
        log_factory: Callable[[], EventLog] | None = None,
        *,
        max_sessions: int = 10_000,
        ttl_s: float = 3600.0,
        max_per_owner: int = 0,
    ) -> None:
        self._log_factory = log_factory or MemoryEventLog
        self._sessions: dict[str, Session] = {}
        self._owned: Counter[str] = Counter()  # each owner's lasting sessions
        self.max_sessions = max_sessions
        self.max_per_owner = max_per_owner
        self.ttl_s = ttl_s

    async def create(
        self,
        *,
        ephemeral: bool = False,
        owner: str = "",
        session_id: str | None = None,
        agent: str = DEFAULT_AGENT,
    ) -> Session:
        if session_id is not None and session_id in self._sessions:
            raise SessionExists(session_id)
        if len(self._sessions) >= self.max_sessions:
            await self.expire_idle()
            if len(self._sessions) >= self.max_sessions:
                raise SessionLimitReached(f"{self.max_sessions} sessions are open")
        limit = self.max_per_owner
        if limit and not ephemeral and self._owned[owner] >= limit:
            await self.expire_idle()
            if self._owned[owner] >= limit:
                raise session_quota_exceeded(limit)
        session = Session(
            id=session_id or new_session_id(),
            log=self._log_factory(),
            ephemeral=ephemeral,
            owner=owner,
            agent=agent,
        )
        self._sessions[session.id] = session
        if not ephemeral:
            self._owned[owner] += 1
        return session

    async def restore(self, record: SessionRecord) -> tuple[Session, bool]:
        held = self._sessions.get(record.id)
        if held is not None:
            return held, False
        log = self._log_factory()
        log.resume_after(record.resume_after)
        session = Session(
            id=record.id,
            log=log,
            messages=list(record.messages),
            owner=record.owner,
            usage=record.usage,
            created_at=record.created_at,
            agent=record.agent,
        )
        self._sessions[session.id] = session
        self._owned[session.owner] += 1
        return session, True

    async def get(self, session_id: str) -> Session:
        try:
            return self._sessions[session_id]
        except KeyError:
            raise SessionNotFound(session_id) from None

    async def delete(self, session_id: str) -> None:
        session = self._sessions.pop(session_id, None)
        if session is None:
            raise SessionNotFound(session_id)
        if not session.ephemeral:
            self._owned[session.owner] -= 1
            if not self._owned[session.owner]:
                del self._owned[session.owner]
        await session.log.close()

    async def count(self) -> int:
        return len(self._sessions)

    def held(self) -> list[Session]:
        """The sessions held now (for the metrics read at scrape time)."""
        return list(self._sessions.values())

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._sessions

    async def expire_idle(self, now: float | None = None) -> list[str]:
        """Drop the idle sessions not active for ``ttl_s``; returns their ids."""
        now = time.monotonic() if now is None else now
        expired = [
            session.id
            for session in self._sessions.values()
            if session.status not in ACTIVE and now - session.last_active > self.ttl_s
        ]
        for session_id in expired:
            await self.delete(session_id)
        return expired
