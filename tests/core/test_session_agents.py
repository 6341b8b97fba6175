"""A session's agent in the memory store: given when the session is made, kept for its life, and
``default`` when nobody names one."""

from __future__ import annotations

from service.core.events import Usage
from service.core.records import SessionRecord
from service.core.sessions import DEFAULT_AGENT, MemorySessionStore, scoped_id


async def test_a_session_keeps_the_agent_it_was_made_for() -> None:
    store = MemorySessionStore()
    support = await store.create(owner="alice", agent="support")
    plain = await store.create(owner="alice")
    chosen = await store.create(owner="alice", session_id="chat-1", agent="research")
    brief = await store.create(ephemeral=True, agent="support")

    assert (await store.get(support.id)).agent == "support"
    assert (await store.get(plain.id)).agent == DEFAULT_AGENT == "default"
    assert (await store.get_owned("chat-1", "alice")).agent == "research"
    assert (await store.get(brief.id)).agent == "support"
    assert chosen.agent == "research"


async def test_open_binds_a_new_session_and_leaves_an_existing_one_as_it_was() -> None:
    store = MemorySessionStore()
    made = await store.open("thread-7", "alice", agent="support")
    assert made.agent == "support"
    # Opened again naming another agent: the session was bound when it was made.
    again = await store.open("thread-7", "alice", agent="research")
    assert again is made and again.agent == "support"
    # Another owner's first use of the id makes a session of its own, bound to what it names.
    bobs = await store.open("thread-7", "bob", agent="research")
    assert bobs.id == scoped_id("thread-7", "bob") and bobs.agent == "research"
    assert (await store.open("fresh", "alice")).agent == DEFAULT_AGENT


async def test_a_session_restored_from_its_record_has_the_recorded_agent() -> None:
    record = SessionRecord(
        id="kept",
        owner="alice",
        created_at=1_700_000_000.0,
        usage=Usage(input_tokens=3, output_tokens=1, total_tokens=4),
        last_event_id=9,
        messages=[{"role": "user", "content": [{"text": "hi"}]}],
        agent="support",
    )
    store = MemorySessionStore()
    session, fresh = await store.restore(record)
    assert fresh and session.agent == "support"
    assert (await store.get("kept")).agent == "support"
    assert SessionRecord(id="older", owner="").agent == DEFAULT_AGENT
    assert record.summary()["agent"] == "support"
