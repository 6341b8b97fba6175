"""The durable record of sessions on a SQL database: SQLite embedded, PostgreSQL at scale.

SQLAlchemy 2 (async: aiosqlite, asyncpg) with Alembic migrations shipped in ``migrations/``;
:class:`~service.db.records.SqlRecords` implements the core's
:class:`~service.core.records.SessionRecords`. The core never imports this package; the app
wires it in when ``AGENT_DATABASE_URL`` is not empty.
"""

from __future__ import annotations

from service.db.records import SqlRecords

__all__ = ["SqlRecords"]
