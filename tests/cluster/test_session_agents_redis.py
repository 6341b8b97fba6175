"""A session's agent on Redis: kept in the session's hash, so every instance reads the agent the
session was made for; a hash written before agents had names reads ``default``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from service.core.records import SessionRecord
from service.core.sessions import DEFAULT_AGENT, MemorySessionStore
from service.store.redis import RedisBackend, RedisSessionStore
from tests.conftest import ClientFactory, services_of
from tests.db.helpers import ask, session_body
from tests.support.redis_server import RedisServer

PREFIX = "agents"


# The agents the sessions below are made for: a query resolves its session's agent by name.
AGENTS = """
[agents.default]
[agents.support]
system_prompt = "You help with orders."
[agents.research]
tools = []
"""


def instance_settings(redis: RedisServer, name: str, tmp_path: Path, **more: Any) -> dict[str, Any]:
    agents = tmp_path / "agents.toml"
    agents.write_text(AGENTS)
    return {
        "redis_url": redis.url,
        "redis_prefix": PREFIX,
        "instance_id": name,
        "agents_file": str(agents),
        **more,
    }


async def test_a_session_made_on_one_instance_has_its_agent_on_the_other(
    own_redis: RedisServer, make_client: ClientFactory, tmp_path: Path
) -> None:
    one = await make_client(**instance_settings(own_redis, "one", tmp_path))
    two = await make_client(**instance_settings(own_redis, "two", tmp_path))
    made = await services_of(one).sessions.create(agent="support")
    opened = await services_of(one).sessions.open("chat-9", "", agent="research")
    plain = await services_of(one).sessions.create()

    assert (await services_of(two).sessions.get(made.id)).agent == "support"
    assert (await session_body(two, made.id))["agent"] == "support"
    assert (await session_body(two, opened.id))["agent"] == "research"
    assert (await session_body(two, plain.id))["agent"] == DEFAULT_AGENT
    # Opened on the other instance naming another agent: it stays the one it was made for.
    assert (await services_of(two).sessions.open("chat-9", "", agent="support")).agent == "research"

    # A query run on the second instance rewrites the hash's run fields, not its agent.
    await ask(two, made.id, "Hello")
    body = await session_body(one, made.id)
    assert body["agent"] == "support" and len(body["messages"]) == 2


async def test_a_hash_without_an_agent_reads_default_and_a_restored_one_keeps_its_own(
    own_redis: RedisServer,
) -> None:
    backends = [RedisBackend(own_redis.url, prefix=PREFIX, instance_id=name) for name in ("one", "two")]
    for backend in backends:
        await backend.start()
    try:
        one, two = (RedisSessionStore(backend, MemorySessionStore()) for backend in backends)
        session = await one.create(owner="alice", agent="support")
        with own_redis.client() as redis:
            assert redis.hget(backends[0].meta_key(session.id), "agent") == "support"
            # As a version before agents had names wrote it: the hash has no such field.
            assert redis.hdel(backends[0].meta_key(session.id), "agent") == 1
        assert (await two.get(session.id)).agent == DEFAULT_AGENT

        # Put back from the durable record on one instance, read on the other.
        record = SessionRecord(id="from-record", owner="alice", last_event_id=4, agent="research")
        restored, fresh = await one.restore(record)
        assert fresh and restored.agent == "research"
        assert (await two.get("from-record")).agent == "research"
    finally:
        for backend in backends:
            await backend.stop()


async def test_redis_and_the_database_keep_the_agent_when_the_live_tier_lost_the_session(
    own_redis: RedisServer, make_client: ClientFactory, tmp_path: Any
) -> None:
    database = f"sqlite+aiosqlite:///{tmp_path / 'agentstream.db'}"
    one = await make_client(**instance_settings(own_redis, "one", tmp_path, database_url=database))
    two = await make_client(**instance_settings(own_redis, "two", tmp_path, database_url=database))
    made = await services_of(one).sessions.create(agent="support")
    await ask(one, made.id, "Hello")
    backend = services_of(one).sessions.live.backend
    with own_redis.client() as redis:
        # Redis dropped it (its time-to-live, a flush): the next request loads it from the record.
        assert redis.delete(*backend.session_keys(made.id)) >= 1
    body = await session_body(two, made.id)
    assert body["agent"] == "support" and len(body["messages"]) == 2
    with own_redis.client() as redis:
        assert redis.hget(backend.meta_key(made.id), "agent") == "support"  # held on Redis again
    listed = (await (await one.get("/sessions")).json())["sessions"]
    assert [(s["id"], s["agent"]) for s in listed] == [(made.id, "support")]
