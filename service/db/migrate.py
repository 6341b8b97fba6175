"""Alembic migrations, run at start and by ``agentstream db upgrade``.

The scripts ship inside the package (``service/db/migrations``), so an installed service can
bring its database up to date without the repository. Alembic runs on the async engine's
connection through ``run_sync``: one code path for SQLite and PostgreSQL.
"""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from service import jsonsafe

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
# PostgreSQL's advisory lock that migrations hold ("agentst" in ASCII: any constant unlikely to be
# another application's on the same database).
MIGRATION_LOCK = 0x6167656E74737400


def alembic_config(connection: Connection | None = None) -> Config:
    """Alembic's configuration, with no ini file: the scripts' place, and the connection to use."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    return config


def make_engine(url: str) -> AsyncEngine:
    """An async engine for ``url``; for SQLite, the file's folder is made first."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database and parsed.database != ":memory:":
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
    # Strict JSON into the JSON columns: PostgreSQL refuses NaN and Infinity, so a default
    # json.dumps would store them on SQLite and fail on PostgreSQL; here both raise alike.
    return create_async_engine(url, pool_pre_ping=True, json_serializer=jsonsafe.dumps)


def head() -> str:
    """The newest revision the package ships."""
    revision = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert revision is not None
    return revision


async def upgrade(engine: AsyncEngine, revision: str = "head") -> None:
    """Bring the database to ``revision`` (the newest by default); nothing to do when it is there."""

    def run(connection: Connection) -> None:
        command.upgrade(alembic_config(connection), revision)

    async with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            # Instances starting together on one database take turns (the lock ends with the
            # transaction): the second finds the first's work done, instead of failing on it.
            await connection.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
        await connection.run_sync(run)


async def current(engine: AsyncEngine) -> str | None:
    """The revision the database is at (None before the first migration)."""

    def read(connection: Connection) -> str | None:
        return MigrationContext.configure(connection).get_current_revision()

    async with engine.connect() as connection:
        return await connection.run_sync(read)


async def upgrade_url(url: str, revision: str = "head") -> tuple[str | None, str | None]:
    """``agentstream db upgrade``: upgrade the database at ``url``; returns (before, after)."""
    engine = make_engine(url)
    try:
        before = await current(engine)
        await upgrade(engine, revision)
        return before, await current(engine)
    finally:
        await engine.dispose()
