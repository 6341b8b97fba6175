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

A query's end is recorded before its terminal event is logged, so a client that has seen ``done``
finds the turn kept whatever happens next; but a database that does not answer within its
deadline never holds a stream: the terminal event is logged, and the end is recorded in the
background, retried until the database answers again (the session's next query waits for that,
or is refused with a 503 meanwhile).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence

from service.core.events import (
    Event,
    RunDone,
    RunError,
    StatusChange,
    is_terminal,
)
from service.core.log import LogEntry
from service.core.records import Page, RunEnd, SessionRecord, SessionRecords
from service.core.sessions import (
    DEFAULT_AGENT,
    IDLE,
    RUNNING,
    Answer,
    Request,
    Session,
    SessionStore,
    append_unless_closed,
)
from service.errors import DatabaseUnavailable, SessionNotFound, StoreUnavailable

log = logging.getLogger(__name__)

INTERRUPTED_MESSAGE = "the query was interrupted: the service stopped while it ran"
DAY_S = 86_400.0
# Event ids a query reserves at its start, and again each time it comes within ``reserve_margin``
# of the end of its reservation.
ID_RESERVATION = 1_000_000
RESERVE_MARGIN = 4096
# Retries of a query's end that the database did not take: the first after RETRY_FIRST_S,
# doubling up to RETRY_MAX_S.
RETRY_FIRST_S = 0.1
RETRY_MAX_S = 2.0


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
        wait_s: float = 3.0,
    ) -> None:
        self.live = live
        self.records = records
        self.retention_s = retention_days * DAY_S
        self.clock = clock
        self.id_reservation = id_reservation
        self.reserve_margin = min(RESERVE_MARGIN, id_reservation // 2)
        self._runs: dict[str, str] = {}  # session id -> the run this instance runs on it
        self._finishing: dict[str, asyncio.Future[None]] = {}  # runs whose end is being recorded
        # The longest a query's start waits for the end of the one before to be recorded.
        self.wait_s = wait_s
        self._retries: set[asyncio.Task[None]] = set()  # ends the database did not take at once
        self._loading: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    # -- the SessionStore interface ----------------------------------------------------------

    async def create(
        self,
        *,
        ephemeral: bool = False,
        owner: str = "",
        session_id: str | None = None,
        agent: str = DEFAULT_AGENT,
    ) -> Session:
        session = await self.live.create(ephemeral=ephemeral, owner=owner, session_id=session_id, agent=agent)
        if not ephemeral:
            try:
                await self.records.created(session.id, owner, self.clock(), agent)
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
        try:
            session: Session | None = await self.live.get(session_id)
        except SessionNotFound:
            session = None
        if session is not None and session.ephemeral:
            await self.live.delete(session_id)  # never recorded: no round trip to the database
            return
        # The record first: a database that does not answer leaves the session whole (a 503).
        found = await self.records.delete(session_id)
        if session is not None:
            with contextlib.suppress(SessionNotFound):
                await self.live.delete(session_id)
        elif not found:
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
            # The last query's end is being recorded: its terminal event comes first in the log,
            # and its messages first in the record.
            try:
                await asyncio.wait_for(asyncio.shield(finishing), self.wait_s)
            except TimeoutError:
                raise DatabaseUnavailable(
                    "the session database has not yet recorded the end of the last query"
                ) from None
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
        # Recorded before the terminal event is logged (see the module docstring). Only this run
        # appends to the log until it ends, so its last id is known now.
        finishing = asyncio.get_running_loop().create_future()
        self._finishing[session.id] = finishing
        write = functools.partial(
            self.records.run_finished,
            session.id,
            run_id,
            messages=list(session.messages),
            usage=session.usage,
            last_event_id=await session.log.last_id() + len(events),
            end=run_end(events),
            now=self.clock(),
            cut=session.cut,
        )
        session.cut = None
        recorded = True
        try:
            await write()
        except StoreUnavailable as exc:
            recorded = False
            log.warning(
                "session %s: the end of query %s is not recorded yet (%s); retrying until the database answers",
                session.id,
                run_id,
                exc,
            )
        finally:
            try:
                await self.live.finish_run(session, fence, events)
            finally:
                if recorded:
                    self._finished(session.id, finishing)
                else:
                    task = asyncio.create_task(self._retry_end(session.id, write, finishing))
                    self._retries.add(task)
                    task.add_done_callback(self._retries.discard)

    def _finished(self, session_id: str, finishing: asyncio.Future[None]) -> None:
        if self._finishing.get(session_id) is finishing:
            del self._finishing[session_id]
        if not finishing.done():
            finishing.set_result(None)

    async def _retry_end(
        self, session_id: str, write: Callable[[], Awaitable[None]], finishing: asyncio.Future[None]
    ) -> None:
        """Record a query's end that the database did not take, once it answers again."""
        delay = RETRY_FIRST_S
        try:
            while True:
                await asyncio.sleep(delay)
                try:
                    await write()
                except StoreUnavailable:
                    delay = min(2 * delay, RETRY_MAX_S)
                    continue
                log.info("session %s: the end of its last query is recorded now", session_id)
                return
        except Exception:
            log.exception("session %s: the end of its last query could not be recorded", session_id)
        finally:
            self._finished(session_id, finishing)

    async def settle(self, timeout: float) -> None:
        """Give the query ends still to be recorded ``timeout`` seconds (at shutdown); the ones
        the database has not taken by then are lost, and said so."""
        pending = list(self._retries)
        if not pending:
            return
        _, left = await asyncio.wait(pending, timeout=timeout)
        for task in left:
            task.cancel()
        if left:
            log.warning(
                "%d query end(s) could not be recorded: the session database did not answer", len(left)
            )

    async def set_status(
        self, session: Session, fence: str | None, status: str, requests: Sequence[Request] = ()
    ) -> list[LogEntry]:
        # A query waiting for approval is still recorded as running: the record's status says a
        # query is in flight (a restart ends it as interrupted), not why it is paused.
        return await self.live.set_status(session, fence, status, requests)

    async def answer_approval(self, session: Session, response: Answer) -> str | None:
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
