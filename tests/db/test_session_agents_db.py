"""A session's agent in the database (SQLite and PostgreSQL): written when the session is made,
read back after a restart, in the list and in ``GET /sessions/{id}``; queries leave it as it was."""

from __future__ import annotations

import time
from pathlib import Path

import sqlalchemy as sa

from service.core.sessions import DEFAULT_AGENT
from service.db import migrate, tables
from tests.conftest import ClientFactory, services_of
from tests.db.helpers import ask, new_session, session_body


AGENTS = """
[agents.default]
[agents.support]
system_prompt = "You help with orders."
[agents.research]
tools = []
"""


async def test_the_agent_survives_a_restart_and_is_listed(
    make_client: ClientFactory, database_url: str, tmp_path: Path
) -> None:
    agents = tmp_path / "agents.toml"
    agents.write_text(AGENTS)
    first = await make_client(database_url=database_url, agents_file=str(agents))
    store = services_of(first).sessions
    support = await store.create(agent="support")
    research = await store.open("chat-3", "", agent="research")
    plain = await new_session(first)
    await ask(first, support.id, "Hello")
    assert (await session_body(first, support.id))["agent"] == "support"

    again = await make_client(database_url=database_url, agents_file=str(agents))  # from the record alone
    assert (await session_body(again, support.id))["agent"] == "support"
    assert (await session_body(again, research.id))["agent"] == "research"
    assert (await session_body(again, plain))["agent"] == DEFAULT_AGENT
    # A query on the restored session is recorded without touching its agent.
    await ask(again, research.id, "Hello again")
    record = await services_of(again).sessions.record_of(research.id)
    assert record is not None and record.agent == "research" and len(record.messages) == 2

    async with again.get("/sessions") as response:
        assert response.status == 200
        listed = (await response.json())["sessions"]
    assert {s["id"]: s["agent"] for s in listed} == {
        support.id: "support",
        research.id: "research",
        plain: DEFAULT_AGENT,
    }


async def test_a_row_stored_without_an_agent_reads_default(
    make_client: ClientFactory, database_url: str
) -> None:
    # The revision before agents had names, with a session stored as it stored them.
    engine = migrate.make_engine(database_url)
    try:
        await migrate.upgrade(engine, "0004")
        old = sa.table(
            "sessions", *(sa.column(name) for name in ("id", "owner", "created_at", "updated_at", "status"))
        )
        now = time.time()
        async with engine.begin() as conn:
            await conn.execute(
                # Recent, so the retention sweep at start leaves it.
                old.insert().values(id="before", owner="", created_at=now, updated_at=now, status="idle")
            )
        await migrate.upgrade(engine)
        async with engine.connect() as conn:
            stored = (
                await conn.execute(sa.select(tables.sessions.c.agent).where(tables.sessions.c.id == "before"))
            ).scalar_one()
        assert stored == DEFAULT_AGENT
    finally:
        await engine.dispose()

    client = await make_client(database_url=database_url)
    assert (await session_body(client, "before"))["agent"] == DEFAULT_AGENT
    listed = (await (await client.get("/sessions")).json())["sessions"]
    assert [(s["id"], s["agent"]) for s in listed] == [("before", DEFAULT_AGENT)]
