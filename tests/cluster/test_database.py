"""The session database across processes: a service killed with SIGKILL mid-query keeps every
completed turn when it comes back; two instances on one Redis and one PostgreSQL list the same
sessions."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from service.db import migrate
from tests.conftest import sse_events
from tests.support.instances import ServiceFactory, ServiceProcess
from tests.support.postgres_server import PostgresServer

QUICK = {"AGENT_EMULATOR_TTFT_MS": "0", "AGENT_EMULATOR_TOKENS_PER_SECOND": "0", "AGENT_GC_TUNING": "false"}
ALICE = {"Authorization": "Bearer key-alice"}
BOB = {"Authorization": "Bearer key-bob"}


async def call(http: aiohttp.ClientSession, method: str, url: str, **options: Any) -> tuple[int, Any]:
    async with http.request(method, url, **options) as response:
        body = await response.json() if response.content_type == "application/json" else None
        return response.status, body


async def wait_for(
    http: aiohttp.ClientSession, base: str, sid: str, since: int, kind: str, **options: Any
) -> int:
    """Follow the session's events after ``since`` (SSE) until one of type ``kind`` comes; its id."""
    url = f"{base}/sessions/{sid}/events?last_event_id={since}"
    async with http.get(url, **options) as response:
        assert response.status == 200, await response.text()
        async for event in sse_events(response):
            if event.get("event") == kind:
                return int(event["id"])
    raise AssertionError(f"the stream ended without a {kind} event")


async def ask(http: aiohttp.ClientSession, base: str, sid: str, text: str, **options: Any) -> int:
    """Send ``text`` and wait for its ``done``; the id of that done."""
    status, body = await call(
        http, "POST", f"{base}/sessions/{sid}/messages", json={"content": text}, **options
    )
    assert status == 202, body
    return await wait_for(http, base, sid, body["after_id"], "done", **options)


async def test_a_service_killed_mid_query_keeps_every_completed_turn(
    service_process: ServiceFactory, tmp_path: Any
) -> None:
    env = {**QUICK, "AGENT_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path}/agentstream.db"}
    service = await service_process(env)
    base = service.base_url
    async with aiohttp.ClientSession() as http:
        _, created = await call(http, "POST", f"{base}/sessions", json={})
        sid = created["id"]
        await ask(http, base, sid, "Hello")
        await ask(http, base, sid, "What is 2+3?")
        _, before = await call(http, "GET", f"{base}/sessions/{sid}")
        last = before["last_event_id"]
        # A query that stalls after a few tokens: running when the process dies.
        status, started = await call(
            http, "POST", f"{base}/sessions/{sid}/messages", json={"content": "Go on [emu:stall]"}
        )
        assert status == 202
        await wait_for(http, base, sid, started["after_id"], "assistant_text")
        await service.akill()

        await service.astart()  # the same port, a new process: nothing in its memory
        _, after = await call(http, "GET", f"{base}/sessions/{sid}")
        assert after["messages"] == before["messages"]
        assert after["usage"] == before["usage"]
        assert after["status"] == "idle"
        assert after["last_event_id"] == last + 2
        _, polled = await call(http, "GET", f"{base}/sessions/{sid}/events/poll?since_index={last}")
        ended = polled["events"]
        assert [(e["id"], e["type"]) for e in ended] == [(last + 1, "status_change"), (last + 2, "error")]
        assert ended[1]["code"] == "interrupted"

        done = await ask(http, base, sid, "Hello again")
        assert done > last + 2
        _, body = await call(http, "GET", f"{base}/sessions/{sid}")
        assert body["messages"][: len(before["messages"])] == before["messages"]
        assert body["messages"][len(before["messages"])]["content"] == [{"text": "Hello again"}]


async def test_two_instances_on_redis_and_postgresql_see_the_same_sessions(
    postgres: PostgresServer, redis_url: str, redis_prefix: str
) -> None:
    url = postgres.create_database()
    await migrate.upgrade_url(url)  # as an operator does before starting several instances
    env = {
        **QUICK,
        "AGENT_DATABASE_URL": url,
        "AGENT_REDIS_URL": redis_url,
        "AGENT_REDIS_PREFIX": redis_prefix,
        "AGENT_API_KEYS": "key-alice,key-bob",
    }
    a, b = ServiceProcess(env), ServiceProcess(env)
    await asyncio.gather(a.astart(), b.astart())
    try:
        async with aiohttp.ClientSession() as http:
            made = []
            for instance in (a, b, a):
                _, created = await call(http, "POST", f"{instance.base_url}/sessions", json={}, headers=ALICE)
                made.append(created["id"])
                await ask(http, instance.base_url, made[-1], f"Question {len(made)}", headers=ALICE)
            _, theirs = await call(http, "POST", f"{b.base_url}/sessions", json={}, headers=BOB)
            _, seen_a = await call(http, "GET", f"{a.base_url}/sessions", headers=ALICE)
            _, seen_b = await call(http, "GET", f"{b.base_url}/sessions", headers=ALICE)
            assert seen_a == seen_b
            assert [s["id"] for s in seen_a["sessions"]] == made[::-1]
            assert theirs["id"] not in {s["id"] for s in seen_a["sessions"]}

            status, _ = await call(
                http, "PATCH", f"{b.base_url}/sessions/{made[0]}", json={"title": "First"}, headers=ALICE
            )
            assert status == 200
            status, _ = await call(http, "DELETE", f"{a.base_url}/sessions/{made[1]}", headers=ALICE)
            assert status == 204
            _, seen_a = await call(http, "GET", f"{a.base_url}/sessions", headers=ALICE)
            _, seen_b = await call(http, "GET", f"{b.base_url}/sessions", headers=ALICE)
            assert seen_a == seen_b
            assert [(s["id"], s["title"]) for s in seen_b["sessions"]] == [
                (made[0], "First"),
                (made[2], "Question 3"),
            ]
            status, _ = await call(http, "GET", f"{b.base_url}/sessions/{made[1]}", headers=ALICE)
            assert status == 404
    finally:
        await asyncio.gather(a.aterminate(), b.aterminate())
