"""Migrations: a database made by the first revision, with sessions in it, upgrades in place and
is served as if it had always been at the newest; ``agentstream db upgrade`` does it from outside."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import pytest
import sqlalchemy as sa
from alembic import command

from service.db import migrate
from tests.conftest import ClientFactory, services_of
from tests.db.helpers import ask, events_after, session_body, texts
from tests.support.instances import REPO_ROOT
from tests.support.postgres_server import PostgresServer

CONVERSATION = [
    {"role": "user", "content": [{"text": "What   is the\ncapital of France? " + "Please " * 20}]},
    {"role": "assistant", "content": [{"text": "Paris."}]},
]


async def populate_first_revision(url: str) -> None:
    """The first revision's schema, with one session in it as that version stored it."""
    engine = migrate.make_engine(url)
    try:
        await migrate.upgrade(engine, "0001")
        assert await migrate.current(engine) == "0001"
        sessions = sa.table(
            "sessions",
            *(
                sa.column(name)
                for name in ("id", "owner", "created_at", "updated_at", "status", "last_event_id")
            ),
            sa.column("input_tokens"),
            sa.column("output_tokens"),
            sa.column("total_tokens"),
        )
        messages = sa.table(
            "messages",
            sa.column("session_id"),
            sa.column("seq"),
            sa.column("run_id"),
            sa.column("message", sa.JSON),
        )
        now = time.time()
        async with engine.begin() as conn:
            await conn.execute(
                sessions.insert().values(
                    id="old-session",
                    owner="",
                    created_at=now - 60,
                    updated_at=now - 30,
                    status="idle",
                    last_event_id=17,
                    input_tokens=10,
                    output_tokens=2,
                    total_tokens=12,
                )
            )
            await conn.execute(
                messages.insert(),
                [
                    {"session_id": "old-session", "seq": i, "run_id": "r0", "message": m}
                    for i, m in enumerate(CONVERSATION)
                ],
            )
    finally:
        await engine.dispose()


async def test_a_populated_first_revision_database_upgrades_in_place(
    make_client: ClientFactory, database_url: str
) -> None:
    await populate_first_revision(database_url)
    before, after = await migrate.upgrade_url(database_url)
    assert (before, after) == ("0001", migrate.head()) and after != "0001"

    client = await make_client(database_url=database_url)
    listed = (await (await client.get("/sessions")).json())["sessions"]
    assert [s["id"] for s in listed] == ["old-session"]
    title = listed[0]["title"]
    assert (
        title.startswith("What is the capital of France? Please") and len(title) == 80 and title.endswith("…")
    )
    assert listed[0]["usage"] == {"input_tokens": 10, "output_tokens": 2, "total_tokens": 12}
    body = await session_body(client, "old-session")
    assert body["messages"] == CONVERSATION and body["last_event_id"] == 17
    # The third revision's id reservation: none for a session stored before it (ids go on at 18).
    record = await services_of(client).sessions.records.load("old-session")
    assert record is not None and (record.last_event_id, record.ids_reserved_until) == (17, 0)
    # The fifth revision's agent: the one agent there was, for a session stored before it.
    assert record.agent == listed[0]["agent"] == body["agent"] == "default"
    await ask(client, "old-session", "And of Italy?")
    assert (await events_after(client, "old-session", 17))["events"][0]["id"] == 18
    assert texts((await session_body(client, "old-session"))["messages"])[2] == "And of Italy?"


async def test_the_service_migrates_a_first_revision_database_at_start(
    make_client: ClientFactory, database_url: str
) -> None:
    await populate_first_revision(database_url)
    client = await make_client(database_url=database_url)
    assert (await session_body(client, "old-session"))["title"].startswith("What is the capital")
    engine = migrate.make_engine(database_url)
    try:
        assert await migrate.current(engine) == migrate.head()
    finally:
        await engine.dispose()


async def downgrade(url: str, revision: str) -> None:
    """Take the database at ``url`` back to ``revision`` (an operator's ``alembic downgrade``)."""
    engine = migrate.make_engine(url)
    try:
        async with engine.begin() as connection:
            await connection.run_sync(lambda sync: command.downgrade(migrate.alembic_config(sync), revision))
    finally:
        await engine.dispose()


async def session_columns(url: str) -> set[str]:
    engine = migrate.make_engine(url)
    try:
        async with engine.connect() as connection:
            columns = await connection.run_sync(lambda sync: sa.inspect(sync).get_columns("sessions"))
    finally:
        await engine.dispose()
    return {column["name"] for column in columns}


async def test_the_agent_column_goes_with_a_downgrade_and_comes_back_default(
    make_client: ClientFactory, database_url: str
) -> None:
    await populate_first_revision(database_url)
    await migrate.upgrade_url(database_url)
    client = await make_client(database_url=database_url)
    made = await services_of(client).sessions.create(agent="support")
    assert "agent" in await session_columns(database_url)

    await downgrade(database_url, "0004")
    assert "agent" not in await session_columns(database_url)
    # Everything else the sessions held is still there (SQLite's drop copies the table).
    engine = migrate.make_engine(database_url)
    try:
        assert await migrate.current(engine) == "0004"
        async with engine.connect() as connection:
            ids = (
                await connection.execute(sa.text("SELECT id, last_event_id FROM sessions ORDER BY id"))
            ).all()
    finally:
        await engine.dispose()
    assert sorted(ids) == sorted([("old-session", 17), (made.id, 0)])

    await migrate.upgrade_url(database_url)
    again = await make_client(database_url=database_url)
    # What the downgrade dropped is gone for good: the session is the one agent's again.
    assert (await session_body(again, made.id))["agent"] == "default"
    assert (await session_body(again, "old-session"))["messages"] == CONVERSATION


@pytest.mark.slow
def test_agentstream_db_upgrade_migrates_and_says_so(tmp_path: object) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path}/ops/agentstream.db"
    command = [sys.executable, "-m", "service", "db", "upgrade"]
    env = {**os.environ, "AGENT_DATABASE_URL": url}
    first = subprocess.run(
        command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert first.returncode == 0, first.stderr
    assert f"from empty to {migrate.head()}" in first.stdout
    again = subprocess.run(
        command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert again.returncode == 0 and f"from {migrate.head()} to {migrate.head()}" in again.stdout
    off = subprocess.run(
        command,
        cwd=REPO_ROOT,
        env={**env, "AGENT_DATABASE_URL": ""},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert off.returncode == 2 and "AGENT_DATABASE_URL is empty" in off.stderr


async def test_instances_starting_together_on_postgresql_migrate_one_after_the_other(
    postgres: PostgresServer,
) -> None:
    url = postgres.create_database()
    results = await asyncio.gather(*(migrate.upgrade_url(url) for _ in range(4)))
    # Each read where it started before taking its turn; each ends at the newest, none failed.
    assert [after for _, after in results] == [migrate.head()] * 4
