"""The session record on a SQL database (SQLite or PostgreSQL) through SQLAlchemy's async engine.

Every method is one transaction and a few statements, written once for both databases; the
engine's dialect does the rest. See :mod:`service.core.records` for the contract.
"""

from __future__ import annotations

import logging
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from service.core.events import Usage
from service.core.records import Page, RunEnd, SessionRecord, SessionRecords, title_of
from service.core.sessions import valid_client_id
from service.db import migrate, tables
from service.db.tables import runs, sessions
from service.errors import DatabaseUnavailable, SessionExists

log = logging.getLogger(__name__)

IDLE = "idle"
RUNNING = "running"
SWEEP_BATCH = 500
ERROR_CHARS = 64  # runs.error: a run's error code
# What a database that is down or unreachable raises (a 503 for new work, as Redis's outages are).
_DOWN = (sa.exc.OperationalError, sa.exc.InterfaceError, sa.exc.DisconnectionError, OSError)


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
    )


def _text(value: str, limit: int | None = None) -> str:
    """``value`` as a text column keeps it. PostgreSQL's text refuses U+0000, so it is kept as
    U+FFFD: the edge refuses NUL in what clients send, and this is the net under anything else
    (the conversation itself is JSON, where ``\\u0000`` is kept exactly)."""
    value = value.replace("\x00", "\ufffd")
    return value if limit is None else value[:limit]


def _storable(session_id: str) -> bool:
    """Whether a session of that id can be on record: every id made or taken has the alphabet of
    ``CLIENT_ID``, so another (a NUL in a path, too long for the column) is looked up nowhere."""
    return valid_client_id(session_id)


def cursor_of(record: SessionRecord) -> str:
    """The ``before`` cursor that pages on after ``record`` (its update time, then its id)."""
    return f"{record.updated_at!r}~{record.id}"


def parse_cursor(cursor: str) -> tuple[float, str]:
    """``(updated_at, id)`` of a cursor; ValueError for one this service did not make."""
    stamp, sep, session_id = cursor.partition("~")
    if not sep or not _storable(session_id):
        raise ValueError("not a cursor from this service")
    return float(stamp), session_id


class SqlRecords(SessionRecords):
    """Sessions and conversations in the database at ``url`` (migrated at :meth:`start`)."""

    def __init__(self, url: str, *, migrate_on_start: bool = True) -> None:
        self.url = url
        self.migrate_on_start = migrate_on_start
        self.engine: AsyncEngine = migrate.make_engine(url)

    @property
    def kind(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self.engine.dialect.name

    async def start(self) -> None:
        if self.migrate_on_start:
            await migrate.upgrade(self.engine)
        log.info("session database: %s at revision %s", self.kind, await migrate.current(self.engine))

    async def close(self) -> None:
        await self.engine.dispose()

    def _begin(self) -> Any:
        return _Transaction(self.engine)

    async def created(self, session_id: str, owner: str, now: float) -> None:
        try:
            async with self._begin() as conn:
                await conn.execute(
                    sessions.insert().values(
                        id=session_id, owner=owner, created_at=now, updated_at=now, status=IDLE
                    )
                )
        except sa.exc.IntegrityError:
            # A client-chosen id already on record (the live tier had dropped it).
            raise SessionExists(session_id) from None

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

    async def reserve_ids(self, session_id: str, ids_reserved_until: int) -> None:
        async with self._begin() as conn:
            await conn.execute(
                sessions.update()
                .where(sessions.c.id == session_id, sessions.c.ids_reserved_until < ids_reserved_until)
                .values(ids_reserved_until=ids_reserved_until)
            )

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

    async def delete(self, session_id: str) -> bool:
        if not _storable(session_id):
            return False
        async with self._begin() as conn:
            return await _delete(conn, [session_id]) > 0

    async def sweep(self, before: float) -> list[str]:
        swept: list[str] = []
        while True:
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
            swept += ids
            if len(ids) < SWEEP_BATCH:
                return swept


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
        except _DOWN as exc:
            raise DatabaseUnavailable(f"the session database is unavailable: {exc}") from exc

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        try:
            await self._context.__aexit__(*exc_info)
        except _DOWN as exc:
            raise DatabaseUnavailable(f"the session database is unavailable: {exc}") from exc
        if isinstance(exc_info[1], _DOWN):
            raise DatabaseUnavailable(f"the session database is unavailable: {exc_info[1]}") from exc_info[1]
        return None
