"""Sessions that outlive the process: the live tier (memory or Redis) in front of the record.

:class:`DurableSessionStore` is a :class:`~service.core.sessions.SessionStore` made of two:

- the *live* store (memory or Redis) holds the sessions in use, with their event logs, and
  drops idle ones after ``AGENT_SESSION_TTL_S`` as before;
- the :class:`~service.core.records.SessionRecords` (the database) keeps every lasting session
  and its conversation, written when a query starts and when it ends, never per token.

A session the live store does not hold (a restart, a kill -9, an idle one dropped) is loaded
from the record on its next request and put back in the live store, its event log continuing
after the stored last id, so ids keep rising. A query that was running when its process died is
ended there and then with ``error`` ``interrupted``.

Its events were never stored, yet clients saw their ids. So that no id is handed out twice, a
query reserves ``ID_RESERVATION`` ids in the write that records its start, and reserves more in
one write whenever it comes near the end of its reservation (so a write per many events, never
per token); a session whose query never ended continues after the reservation. A client holding
an id of the lost query then finds it purged, and gets the snapshot built from the record. Short-lived sessions
(``POST /agent/stream``) are never recorded.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Callable, Sequence

from service.core.events import (
    Event,
    RunDone,
    RunError,
    StatusChange,
    ToolApprovalRequest,
    ToolApprovalResponse,
    is_terminal,
)
from service.core.log import LogEntry
from service.core.records import Page, RunEnd, SessionRecord, SessionRecords
from service.core.sessions import IDLE, RUNNING, Session, SessionStore, append_unless_closed
from service.errors import SessionNotFound

log = logging.getLogger(__name__)

INTERRUPTED_MESSAGE = "the query was interrupted: the service stopped while it ran"
DAY_S = 86_400.0
# Event ids a query reserves at its start, and again each time it comes within ``reserve_margin``
# of the end of its reservation.
ID_RESERVATION = 1_000_000
RESERVE_MARGIN = 4096


def run_end(events: list[Event]) -> RunEnd:
    """How a run ended, from the events that end it (the terminal one is last)."""
    terminal = next((event for event in reversed(events) if is_terminal(event)), None)
    if isinstance(terminal, RunDone):
        return RunEnd("cancelled" if terminal.cancelled else "done")
    if isinstance(terminal, RunError):
        return RunEnd("error", terminal.code or "error")
    return RunEnd("error", "not_started")


class DurableSessionStore(SessionStore):
    """The live store in front of the durable record (see the module docstring)."""

    def __init__(
        self,
        live: SessionStore,
        records: SessionRecords,
        *,
        retention_days: float = 30.0,
        clock: Callable[[], float] = time.time,
        id_reservation: int = ID_RESERVATION,
    ) -> None:
        self.live = live
        self.records = records
        self.retention_s = retention_days * DAY_S
        self.clock = clock
        self.id_reservation = id_reservation
        self.reserve_margin = min(RESERVE_MARGIN, id_reservation // 2)
        self._runs: dict[str, str] = {}  # session id -> the run this instance runs on it
        self._finishing: dict[str, asyncio.Future[None]] = {}  # runs whose end is being recorded
        self._loading: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    # -- the SessionStore interface ----------------------------------------------------------

    async def create(
        self, *, ephemeral: bool = False, owner: str = "", session_id: str | None = None
    ) -> Session:
        session = await self.live.create(ephemeral=ephemeral, owner=owner, session_id=session_id)
        if not ephemeral:
            try:
                await self.records.created(session.id, owner, self.clock())
            except BaseException:
                await self.live.delete(session.id)
                raise
        return session

    async def get(self, session_id: str) -> Session:
        try:
            return await self.live.get(session_id)
        except SessionNotFound:
            pass
        lock = self._loading.setdefault(session_id, asyncio.Lock())
        async with lock:
            try:
                return await self.live.get(session_id)  # loaded meanwhile by another request
            except SessionNotFound:
                record = await self.records.load(session_id)
                if record is None:
                    raise
                return await self._reload(record)

    async def _reload(self, record: SessionRecord) -> Session:
        session, fresh = await self.live.restore(record)
        if fresh and record.status == RUNNING:
            # Its process died mid-query: the query ends here, after the last stored id.
            await self._record_interrupted(session, record.run_id)
        log.info(
            "session %s loaded from the database (ids continue after %d)", record.id, record.resume_after
        )
        return session

    async def _record_interrupted(self, session: Session, run_id: str) -> None:
        error = RunError(error=INTERRUPTED_MESSAGE, code="interrupted", recoverable=True)
        await append_unless_closed(session.log, [StatusChange(status=IDLE), error])
        await self.records.run_finished(
            session.id,
            run_id,
            messages=session.messages,
            usage=session.usage,
            last_event_id=await session.log.last_id(),
            end=RunEnd("error", "interrupted"),
            now=self.clock(),
        )

    async def delete(self, session_id: str) -> None:
        held = True
        try:
            session = await self.live.get(session_id)
        except SessionNotFound:
            held = False
        else:
            await self.live.delete(session_id)
            if session.ephemeral:
                return  # never recorded: no round trip to the database
        if not await self.records.delete(session_id) and not held:
            raise SessionNotFound(session_id)

    async def count(self) -> int:
        return await self.live.count()

    async def expire_idle(self, now: float | None = None) -> list[str]:
        # The live tier drops idle state; the record keeps it, and the next request reloads it.
        return await self.live.expire_idle(now)

    async def restore(self, record: SessionRecord) -> tuple[Session, bool]:
        return await self.live.restore(record)

    async def claim_run(self, session: Session, run_id: str) -> str | None:
        finishing = self._finishing.get(session.id)
        if finishing is not None:
            # The last query's end is being recorded: its terminal event comes first in the log.
            await asyncio.shield(finishing)
        fence = await self.live.claim_run(session, run_id)
        if not session.ephemeral:
            self._runs[session.id] = run_id
            try:
                reserved = await session.log.last_id() + self.id_reservation
                await self.records.run_started(
                    session.id, run_id, session.run_message, self.clock(), ids_reserved_until=reserved
                )
                session.ids_renew_at = reserved - self.reserve_margin
            except BaseException:
                # Not recorded, so not run: the live claim is given up again at once.
                self._runs.pop(session.id, None)
                await self.live.finish_run(session, fence, [])
                raise
        return fence

    async def reserve_ids(self, session: Session, reached: int) -> None:
        reserved = reached + self.id_reservation
        await self.records.reserve_ids(session.id, reserved)
        session.ids_renew_at = reserved - self.reserve_margin

    async def finish_run(self, session: Session, fence: str | None, events: list[Event]) -> None:
        session.ids_renew_at = 0
        run_id = self._runs.pop(session.id, None)
        if run_id is None or session.ephemeral:
            await self.live.finish_run(session, fence, events)
            return
        # Recorded before the terminal event is logged: a client that has seen ``done`` finds the
        # turn kept whatever happens next. Only this run appends to the log until it ends, so its
        # last id is known now.
        finishing = asyncio.get_running_loop().create_future()
        self._finishing[session.id] = finishing
        try:
            await self.records.run_finished(
                session.id,
                run_id,
                messages=session.messages,
                usage=session.usage,
                last_event_id=await session.log.last_id() + len(events),
                end=run_end(events),
                now=self.clock(),
            )
        finally:
            try:
                await self.live.finish_run(session, fence, events)
            finally:
                del self._finishing[session.id]
                finishing.set_result(None)

    async def set_status(
        self, session: Session, fence: str | None, status: str, requests: Sequence[ToolApprovalRequest] = ()
    ) -> list[LogEntry]:
        # A query waiting for approval is still recorded as running: the record's status says a
        # query is in flight (a restart ends it as interrupted), not why it is paused.
        return await self.live.set_status(session, fence, status, requests)

    async def answer_approval(self, session: Session, response: ToolApprovalResponse) -> str | None:
        return await self.live.answer_approval(session, response)

    async def cancel_elsewhere(self, session_id: str) -> bool:
        return await self.live.cancel_elsewhere(session_id)

    # -- what only the record can answer -----------------------------------------------------

    async def list_owned(self, owner: str, limit: int, before: str | None = None) -> Page:
        """The owner's sessions, newest update first; a session the record says runs while no
        query runs on it any more (its instance died) is recorded as interrupted first."""
        page = await self.records.list(owner, limit, before)
        for record in page.sessions:
            if record.status != RUNNING:
                continue
            try:
                session = await self.get(record.id)
            except SessionNotFound:
                continue
            if not session.active and record.run_id not in self._runs.values():
                await self._record_interrupted_quietly(session, record)
            record.status = session.status
        return page

    async def _record_interrupted_quietly(self, session: Session, record: SessionRecord) -> None:
        # The live tier already ended that query (Redis does for an instance that died); only
        # the record still says it runs.
        await self.records.run_finished(
            session.id,
            record.run_id,
            messages=session.messages,
            usage=session.usage,
            last_event_id=await session.log.last_id(),
            end=RunEnd("error", "interrupted"),
            now=record.updated_at,
        )

    async def rename(self, session_id: str, owner: str, title: str) -> None:
        """Give the owner's session a title; :class:`SessionNotFound` if it has none such."""
        if not await self.records.rename(session_id, owner, title, self.clock()):
            raise SessionNotFound(session_id)

    async def record_of(self, session_id: str) -> SessionRecord | None:
        """The session as stored (without its messages' use: for its title and times)."""
        return await self.records.load(session_id)

    async def sweep(self, now: float | None = None) -> list[str]:
        """Delete the sessions not updated for ``AGENT_SESSION_RETENTION_DAYS`` (0: keep all)."""
        if not self.retention_s:
            return []
        swept = await self.records.sweep((self.clock() if now is None else now) - self.retention_s)
        for session_id in swept:
            try:
                await self.live.delete(session_id)
            except SessionNotFound:
                pass
        if swept:
            log.info(
                "retention: deleted %d session(s) not updated for %g days",
                len(swept),
                self.retention_s / DAY_S,
            )
        return swept
