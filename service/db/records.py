"""The session record on a SQL database (SQLite or PostgreSQL) through SQLAlchemy's async engine.

Every method is one transaction and a few statements, written once for both databases; the
engine's dialect does the rest. See :mod:`service.core.records` for the contract.

Every call keeps a deadline (``AGENT_DATABASE_DEADLINE_S``), as every Redis call does: a database
that is down or stalled (a server that stops answering without closing its connections) gives
:class:`~service.errors.DatabaseUnavailable`, a 503, within the deadline, instead of holding the
request until a TCP or pool timeout a minute later.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import re
from collections.abc import Callable, Coroutine
from decimal import Decimal
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from service.core.events import Usage
from service.core.records import DEFAULT_AGENT, Page, RunEnd, SessionRecord, SessionRecords, title_of
from service.core.sessions import valid_session_id
from service.db import migrate, tables
from service.db.tables import runs, sessions
from service.errors import DatabaseUnavailable, SessionExists

log = logging.getLogger(__name__)

IDLE = "idle"
RUNNING = "running"
SWEEP_BATCH = 500
ERROR_CHARS = 64  # runs.error: a run's error code
# What a database that is down or unreachable raises (a 503 for new work, as Redis's outages are);
# sa.exc.TimeoutError is the pool's, when every connection is held by calls that hang.
_DOWN = (
    sa.exc.OperationalError,
    sa.exc.InterfaceError,
    sa.exc.DisconnectionError,
    sa.exc.TimeoutError,
    OSError,
)
T = TypeVar("T")


def _down(exc: BaseException) -> bool:
    """Whether ``exc`` says the database went away. A connection dropped mid-commit comes from
    asyncpg as an error SQLAlchemy cannot classify (a bare ``DBAPIError``), not as one of
    :data:`_DOWN`; a classified one (an integrity error, say) is a fault of the code's."""
    if isinstance(exc, _DOWN):
        return True
    return isinstance(exc, sa.exc.DBAPIError) and (
        exc.connection_invalidated or type(exc) is sa.exc.DBAPIError
    )


def _record(row: Any) -> SessionRecord:
    return SessionRecord(
        id=row.id,
        owner=row.owner,
        title=row.title,
        created_at=row.created_at,
        updated_at=row.updated_at,
        status=row.status,
        usage=Usage(
            input_tokens=row.input_tokens, output_tokens=row.output_tokens, total_tokens=row.total_tokens
        ),
        last_event_id=row.last_event_id,
        ids_reserved_until=row.ids_reserved_until,
        run_id=row.run_id,
        agent=row.agent,
    )


# A cursor's time: a plain decimal in ASCII digits. ``float()`` alone would also take "nan",
# "inf", "1_000", " 5" and other scripts' digits, none of which this service writes.
_STAMP = re.compile(r"-?[0-9]+(?:\.[0-9]+)?")


def _text(value: str, limit: int | None = None) -> str:
    """``value`` as a text column keeps it. PostgreSQL's text refuses U+0000, so it is kept as
    U+FFFD: the edge refuses NUL in what clients send, and this is the net under anything else
    (the conversation itself is JSON, where ``\\u0000`` is kept exactly)."""
    value = value.replace("\x00", "\ufffd")
    return value if limit is None else value[:limit]


def _storable(session_id: str) -> bool:
    """Whether a session of that id can be on record: every id made, taken or scoped has the
    form :func:`valid_session_id` checks, so another (a NUL in a path, too long for the column)
    is looked up nowhere."""
    return valid_session_id(session_id)


def cursor_of(record: SessionRecord) -> str:
    """The ``before`` cursor that pages on after ``record`` (its update time, then its id)."""
    # The shortest repr, written without an exponent (1e-05 as 0.00001): the same float back.
    return f"{Decimal(repr(record.updated_at)):f}~{record.id}"


def parse_cursor(cursor: str) -> tuple[float, str]:
    """``(updated_at, id)`` of a cursor; ValueError for one this service did not make."""
    stamp, sep, session_id = cursor.partition("~")
    if not sep or not _STAMP.fullmatch(stamp) or not _storable(session_id):
        raise ValueError("not a cursor from this service")
    value = float(stamp)
    if not math.isfinite(value):  # four hundred digits make an infinity
        raise ValueError("not a cursor from this service")
    return value, session_id


def _bounded(method: Callable[..., Coroutine[Any, Any, T]]) -> Callable[..., Coroutine[Any, Any, T]]:
    """The method, run within the records' deadline (see :meth:`SqlRecords.within_deadline`)."""

    @functools.wraps(method)
    async def bounded(self: SqlRecords, *args: Any, **kwargs: Any) -> T:
        return await self.within_deadline(method(self, *args, **kwargs))

    return bounded


class SqlRecords(SessionRecords):
    """Sessions and conversations in the database at ``url`` (migrated at :meth:`start`); every
    call answers within ``deadline_s`` or raises :class:`DatabaseUnavailable`."""

    def __init__(self, url: str, *, migrate_on_start: bool = True, deadline_s: float = 3.0) -> None:
        self.url = url
        self.migrate_on_start = migrate_on_start
        self.deadline_s = deadline_s
        self.engine: AsyncEngine = migrate.make_engine(url)
        self._abandoned: set[asyncio.Future[Any]] = set()

    async def within_deadline(self, work: Coroutine[Any, Any, T], deadline_s: float | None = None) -> T:
        """``work``'s result, or :class:`DatabaseUnavailable` once ``deadline_s`` (the records'
        deadline by default) has passed.

        The work runs as a task of its own that is cancelled at the deadline but not waited for:
        on a stalled server, the cancelled call's own clean-up (its rollback) waits for the server
        too, and the caller must not. It ends when the server answers again or the engine closes.
        """
        deadline_s = self.deadline_s if deadline_s is None else deadline_s
        task = asyncio.ensure_future(work)
        try:
            done, _ = await asyncio.wait({task}, timeout=deadline_s)
        except asyncio.CancelledError:
            # The caller went (a client gone, a run stopped): the call itself is not torn down
            # half way, which leaves the driver closing its connection in a task nobody awaits.
            self._abandon(task)
            raise
        if task in done:
            return task.result()
        task.cancel()
        self._abandon(task)
        raise DatabaseUnavailable(f"the session database did not answer within {deadline_s:g} s")

    def _abandon(self, task: asyncio.Future[Any]) -> None:
        """Keep ``task`` until it ends, so that :meth:`close` can wait for it."""
        self._abandoned.add(task)
        task.add_done_callback(self._forget_abandoned)

    def _forget_abandoned(self, task: asyncio.Future[Any]) -> None:
        self._abandoned.discard(task)
        if not task.cancelled():
            task.exception()  # its caller was already answered (a 503): nothing more to tell

    async def ping(self, timeout: float) -> None:
        """One round trip (``SELECT 1``) within ``timeout`` (at most the deadline), for ``/healthz``."""

        async def select_one() -> None:
            async with self._begin() as conn:
                await conn.execute(sa.text("SELECT 1"))

        await self.within_deadline(select_one(), min(timeout, self.deadline_s))

    @property
    def kind(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self.engine.dialect.name

    async def start(self) -> None:
        if self.migrate_on_start:
            await migrate.upgrade(self.engine)
        log.info("session database: %s at revision %s", self.kind, await migrate.current(self.engine))

    async def close(self) -> None:
        if self._abandoned:
            # Calls their callers left: each gets the deadline to end (a cancelled one, to close
            # its connection) before the engine goes; what a stalled server holds is cancelled.
            _, stalled = await asyncio.wait(set(self._abandoned), timeout=self.deadline_s)
            for task in stalled:
                task.cancel()
        try:
            # Closing a connection says goodbye to the server, which a stalled one never answers.
            async with asyncio.timeout(self.deadline_s):
                await self.engine.dispose()
        except TimeoutError:
            log.warning("the session database did not answer while its connections were closed")

    def _begin(self) -> Any:
        return _Transaction(self.engine)

    @_bounded
    async def created(self, session_id: str, owner: str, now: float, agent: str = DEFAULT_AGENT) -> None:
        try:
            async with self._begin() as conn:
                await conn.execute(
                    sessions.insert().values(
                        id=session_id, owner=owner, created_at=now, updated_at=now, status=IDLE, agent=agent
                    )
                )
        except sa.exc.IntegrityError:
            # A client-chosen id already on record (the live tier had dropped it).
            raise SessionExists(session_id) from None

    @_bounded
    async def run_started(
        self, session_id: str, run_id: str, message: str, now: float, *, ids_reserved_until: int = 0
    ) -> None:
        async with self._begin() as conn:
            title = (
                await conn.execute(sa.select(sessions.c.title).where(sessions.c.id == session_id))
            ).scalar()
            if title is None:
                return  # not a session of the record (deleted meanwhile)
            values: dict[str, Any] = {
                "status": RUNNING,
                "run_id": run_id,
                "updated_at": now,
                "ids_reserved_until": ids_reserved_until,
            }
            if not title:
                values["title"] = _text(title_of(message))
            await conn.execute(sessions.update().where(sessions.c.id == session_id).values(**values))
            await conn.execute(
                runs.insert().values(id=run_id, session_id=session_id, message=_text(message), started_at=now)
            )

    @_bounded
    async def reserve_ids(self, session_id: str, ids_reserved_until: int) -> None:
        async with self._begin() as conn:
            await conn.execute(
                sessions.update()
                .where(sessions.c.id == session_id, sessions.c.ids_reserved_until < ids_reserved_until)
                .values(ids_reserved_until=ids_reserved_until)
            )

    @_bounded
    async def run_finished(
        self,
        session_id: str,
        run_id: str,
        *,
        messages: list[dict[str, Any]],
        usage: Usage,
        last_event_id: int,
        end: RunEnd,
        now: float,
        cut: int | None = None,
    ) -> None:
        table = tables.messages
        async with self._begin() as conn:
            stored = (
                await conn.execute(sa.select(sa.func.count()).where(table.c.session_id == session_id))
            ).scalar_one()
            kept = (
                await conn.execute(sa.select(sessions.c.last_event_id).where(sessions.c.id == session_id))
            ).scalar()
            if kept is None:
                return  # deleted meanwhile
            await conn.execute(
                sessions.update()
                .where(sessions.c.id == session_id)
                .values(
                    status=IDLE,
                    run_id="",
                    updated_at=now,
                    input_tokens=usage.input_tokens,
                    output_tokens=usage.output_tokens,
                    total_tokens=usage.total_tokens,
                    last_event_id=max(kept, last_event_id),  # ids only ever rise
                    ids_reserved_until=max(kept, last_event_id),  # every id used is stored now
                )
            )
            if cut is not None and cut < stored:
                # A rewind: what was stored from the cut on is no longer the conversation.
                await conn.execute(table.delete().where(table.c.session_id == session_id, table.c.seq >= cut))
                stored = cut
            fresh = messages[stored:]
            if fresh:
                await conn.execute(
                    table.insert(),
                    [
                        {"session_id": session_id, "seq": stored + i, "run_id": run_id, "message": message}
                        for i, message in enumerate(fresh)
                    ],
                )
            await conn.execute(
                runs.update()
                .where(runs.c.id == run_id)
                .values(ended_at=now, outcome=end.outcome, error=_text(end.error, ERROR_CHARS))
            )

    @_bounded
    async def load(self, session_id: str) -> SessionRecord | None:
        if not _storable(session_id):
            return None
        async with self._begin() as conn:
            row = (await conn.execute(sa.select(sessions).where(sessions.c.id == session_id))).first()
            if row is None:
                return None
            record = _record(row)
            table = tables.messages
            rows = await conn.execute(
                sa.select(table.c.message).where(table.c.session_id == session_id).order_by(table.c.seq)
            )
            record.messages = [message for (message,) in rows]
            return record

    @_bounded
    async def list(self, owner: str, limit: int, before: str | None = None) -> Page:
        query = sa.select(sessions).where(sessions.c.owner == owner)
        if before is not None:
            stamp, session_id = parse_cursor(before)
            query = query.where(
                sa.or_(
                    sessions.c.updated_at < stamp,
                    sa.and_(sessions.c.updated_at == stamp, sessions.c.id < session_id),
                )
            )
        query = query.order_by(sessions.c.updated_at.desc(), sessions.c.id.desc()).limit(limit + 1)
        async with self._begin() as conn:
            found = [_record(row) for row in await conn.execute(query)]
        page = found[:limit]
        return Page(page, cursor_of(page[-1]) if len(found) > limit else None)

    @_bounded
    async def rename(self, session_id: str, owner: str, title: str, now: float) -> bool:
        if not _storable(session_id):
            return False
        async with self._begin() as conn:
            updated = await conn.execute(
                sessions.update()
                .where(sessions.c.id == session_id, sessions.c.owner == owner)
                .values(title=_text(title), updated_at=now)
            )
            return bool(updated.rowcount)

    @_bounded
    async def delete(self, session_id: str) -> bool:
        if not _storable(session_id):
            return False
        async with self._begin() as conn:
            return await _delete(conn, [session_id]) > 0

    async def sweep(self, before: float) -> list[str]:
        swept: list[str] = []
        while True:
            ids = await self._sweep_batch(before)
            swept += ids
            if len(ids) < SWEEP_BATCH:
                return swept

    @_bounded
    async def _sweep_batch(self, before: float) -> list[str]:
        """Delete up to ``SWEEP_BATCH`` of the sessions past retention (a deadline per batch)."""
        async with self._begin() as conn:
            ids = list(
                (
                    await conn.execute(
                        sa.select(sessions.c.id)
                        .where(sessions.c.updated_at < before, sessions.c.status != RUNNING)
                        .limit(SWEEP_BATCH)
                    )
                ).scalars()
            )
            if ids:
                await _delete(conn, ids)
        return ids


async def _delete(conn: AsyncConnection, ids: list[str]) -> int:
    """Delete the sessions ``ids`` with their messages and runs; how many sessions there were."""
    await conn.execute(tables.messages.delete().where(tables.messages.c.session_id.in_(ids)))
    await conn.execute(runs.delete().where(runs.c.session_id.in_(ids)))
    return (await conn.execute(sessions.delete().where(sessions.c.id.in_(ids)))).rowcount


class _Transaction:
    """``engine.begin()``, with the database's failures told as :class:`DatabaseUnavailable` (a 503)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._context = engine.begin()

    async def __aenter__(self) -> AsyncConnection:
        try:
            return await self._context.__aenter__()
        except Exception as exc:
            if _down(exc):
                raise DatabaseUnavailable(f"the session database is unavailable: {exc}") from exc
            raise

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        try:
            await self._context.__aexit__(*exc_info)
        except Exception as exc:
            if _down(exc):
                raise DatabaseUnavailable(f"the session database is unavailable: {exc}") from exc
            raise
        if exc_info[1] is not None and _down(exc_info[1]):
            raise DatabaseUnavailable(f"the session database is unavailable: {exc_info[1]}") from exc_info[1]
        return None
