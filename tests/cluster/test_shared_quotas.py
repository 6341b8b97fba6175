"""Per-key (and per-user) quotas across two service processes on one real Redis: a key's runs, streams and
requests per minute are counted once for both instances; a slot given back (or left behind by an
instance that died) is free on the other; with Redis stopped the checks fail open with a warning,
and the quotas are shared again once it is back.

Waiting is on Redis itself: the tests subscribe to the keyspace notifications of a key's slots
(``zrem``, ``expired``) rather than polling or sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import jwt
import pytest
import redis.asyncio as aioredis

from service.transports.edge.auth import fingerprint
from tests.cluster.test_scaleout import instance_env, read_events
from tests.support.instances import ServiceProcess
from tests.support.redis_server import RedisServer

PREFIX = "quota"
RUNS_KEY, STREAMS_KEY, RPM_KEY, OTHER_KEY = "key-runs", "key-streams", "key-rpm", "key-other"
LIMITS = {
    "AGENT_API_KEYS": ",".join([RUNS_KEY, STREAMS_KEY, RPM_KEY, OTHER_KEY]),
    "AGENT_QUOTA_RUNS": "2",
    "AGENT_QUOTA_STREAMS": "1",
    "AGENT_QUOTA_REQUESTS_PER_MINUTE": "20",
    # Leases (and run claims) last 3 s: long enough that a refusal is seen before a dead
    # instance's slot runs out, on a loaded machine too.
    "AGENT_REDIS_LOCK_TTL_S": "3",
}
LONG = "a long answer [emu:tokens=2000] [emu:tps=50]"
WAIT_S = 20


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def slots_key(key: str, kind: str) -> str:
    return f"{PREFIX}:q:{fingerprint(key)}:{kind}"


@contextlib.asynccontextmanager
async def pair_on(server: RedisServer) -> AsyncIterator[tuple[ServiceProcess, ServiceProcess, Any]]:
    """Two instances on ``server`` with the test's limits, and an HTTP client."""
    env = instance_env(server.url, PREFIX, **LIMITS)
    a, b = ServiceProcess(env), ServiceProcess(env)
    await asyncio.gather(a.astart(), b.astart())
    try:
        async with aiohttp.ClientSession() as http:
            yield a, b, http
    finally:
        await asyncio.gather(a.aterminate(), b.aterminate())


@contextlib.asynccontextmanager
async def keyspace(server: RedisServer, key: str) -> AsyncIterator[asyncio.Queue[str]]:
    """The keyspace notifications of ``key`` (``zadd``, ``zrem``, ``del``, ``expired``...) as they
    come."""
    client = aioredis.Redis.from_url(server.url, decode_responses=True)
    await client.config_set("notify-keyspace-events", "Kgzx")
    pubsub = client.pubsub()
    await pubsub.subscribe(f"__keyspace@0__:{key}")
    await pubsub.get_message(timeout=5)  # the subscription's confirmation
    queue: asyncio.Queue[str] = asyncio.Queue()

    async def pump() -> None:
        async for message in pubsub.listen():
            if message["type"] == "message":
                queue.put_nowait(message["data"])

    task = asyncio.create_task(pump())
    try:
        yield queue
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await pubsub.aclose()
        await client.aclose()


async def notified(queue: asyncio.Queue[str], *events: str) -> str:
    """The next notification that is one of ``events``."""
    async with asyncio.timeout(WAIT_S):
        while (event := await queue.get()) not in events:
            pass
    return event


async def refused(response: aiohttp.ClientResponse, quota: str, limit: int) -> None:
    assert response.status == 429, await response.text()
    body = await response.json()
    assert set(body) == {"error", "code", "quota", "limit", "retry_after"}, body
    assert body["code"] == "quota_exceeded" and body["quota"] == quota and body["limit"] == limit, body
    assert response.headers["Retry-After"] == str(body["retry_after"]) and body["retry_after"] >= 1


async def start_run(http: Any, instance: ServiceProcess, key: str) -> tuple[str, aiohttp.ClientResponse]:
    """A new session on ``instance`` and the answer to its long query."""
    async with http.post(f"{instance.base_url}/sessions", headers=auth(key)) as response:
        assert response.status == 201, await response.text()
        session_id = (await response.json())["id"]
    response = await http.post(
        f"{instance.base_url}/sessions/{session_id}/messages", json={"content": LONG}, headers=auth(key)
    )
    await response.read()
    return session_id, response


@pytest.fixture
def redis_server(own_redis: RedisServer) -> RedisServer:
    return own_redis


async def test_a_key_limited_to_two_runs_gets_429_on_its_third_across_two_instances(
    redis_server: RedisServer,
) -> None:
    async with pair_on(redis_server) as (a, b, http):
        first, response = await start_run(http, a, RUNS_KEY)
        assert response.status == 202
        second, response = await start_run(http, b, RUNS_KEY)
        assert response.status == 202
        # Each instance runs one: alone, either would take a second.
        for instance in (a, b):
            _, response = await start_run(http, instance, RUNS_KEY)
            await refused(response, "runs", 2)
        _, response = await start_run(http, a, OTHER_KEY)  # another key runs as usual
        assert response.status == 202
        # The first query ends (its cancel sent to the other instance); a client that has read
        # its end starts the next one at once, on either instance.
        async with http.post(f"{b.base_url}/sessions/{first}/cancel", headers=auth(RUNS_KEY)) as cancel:
            assert cancel.status == 202
        async with aiohttp.ClientSession(headers=auth(RUNS_KEY)) as keyed:
            events = await read_events(
                keyed, b, first, stop=lambda got: got[-1]["event"] in {"done", "error"}
            )
        assert events[-1]["event"] == "done"
        third, response = await start_run(http, b, RUNS_KEY)
        assert response.status == 202
        _, response = await start_run(http, a, RUNS_KEY)
        await refused(response, "runs", 2)
        for session_id in (second, third):
            async with http.post(f"{a.base_url}/sessions/{session_id}/cancel", headers=auth(RUNS_KEY)):
                pass


async def test_requests_per_minute_count_across_two_instances(redis_server: RedisServer) -> None:
    async with pair_on(redis_server) as (a, b, http):
        # 20 requests, half on each instance (a 404 is still a request).
        for i in range(20):
            instance = (a, b)[i % 2]
            async with http.get(f"{instance.base_url}/sessions/none", headers=auth(RPM_KEY)) as response:
                assert response.status == 404, await response.text()
        for instance in (a, b):
            async with http.get(f"{instance.base_url}/sessions/none", headers=auth(RPM_KEY)) as response:
                await refused(response, "requests_per_minute", 20)
        async with http.get(f"{a.base_url}/sessions/none", headers=auth(OTHER_KEY)) as response:
            assert response.status == 404


async def test_a_stream_slot_freed_on_disconnect_is_reusable_on_the_other_instance(
    redis_server: RedisServer,
) -> None:
    async with (
        pair_on(redis_server) as (a, b, http),
        keyspace(redis_server, slots_key(STREAMS_KEY, "streams")) as changes,
    ):
        ws = await http.ws_connect(f"{a.base_url}/ws", headers=auth(STREAMS_KEY))
        await ws.send_json({"type": "ping"})
        assert (await ws.receive_json())["type"] == "pong"
        with pytest.raises(aiohttp.WSServerHandshakeError) as handshake:
            await http.ws_connect(f"{b.base_url}/ws", headers=auth(STREAMS_KEY))
        assert handshake.value.status == 429
        async with http.post(
            f"{b.base_url}/agent/stream", json={"message": "hi"}, headers=auth(STREAMS_KEY)
        ) as r:
            await refused(r, "streams", 1)
        await ws.close()
        await notified(changes, "zrem")  # instance a gave the slot back
        async with http.post(
            f"{b.base_url}/agent/stream", json={"message": "hi"}, headers=auth(STREAMS_KEY)
        ) as r:
            assert r.status == 200
            await r.read()
        await notified(changes, "zrem")
        # An instance that dies holding a slot: its lease runs out, and the slot is free again.
        ws = await http.ws_connect(f"{a.base_url}/ws", headers=auth(STREAMS_KEY))
        await notified(changes, "zadd")
        await a.akill()
        async with http.post(
            f"{b.base_url}/agent/stream", json={"message": "hi"}, headers=auth(STREAMS_KEY)
        ) as r:
            await refused(r, "streams", 1)
        await notified(changes, "expired")
        async with http.post(
            f"{b.base_url}/agent/stream", json={"message": "hi"}, headers=auth(STREAMS_KEY)
        ) as r:
            assert r.status == 200
            await r.read()


async def test_with_redis_stopped_the_checks_fail_open_with_a_warning_and_recover(
    redis_server: RedisServer,
) -> None:
    async with pair_on(redis_server) as (a, b, http):
        redis_server.stop()
        # Short-lived queries need no Redis: every quota check on the way lets them through.
        async with http.post(
            f"{a.base_url}/agent/stream", json={"message": "hi"}, headers=auth(OTHER_KEY)
        ) as r:
            assert r.status == 200, await r.text()
            events = [line async for line in r.content]
        assert any(b'"done"' in line for line in events)
        warned = await a.alog_lines(lambda line: "quotas: Redis is unavailable" in line)
        assert warned, a.output()
        redis_server.start()
        async with keyspace(redis_server, slots_key(OTHER_KEY, "streams")) as changes:
            # A stream held across the return counts on Redis again; and the quotas hold across
            # the instances again (the next check is answered by Redis).
            ws = await http.ws_connect(f"{a.base_url}/ws", headers=auth(OTHER_KEY))
            await notified(changes, "zadd")
            with pytest.raises(aiohttp.WSServerHandshakeError) as handshake:
                await http.ws_connect(f"{b.base_url}/ws", headers=auth(OTHER_KEY))
            assert handshake.value.status == 429
            await ws.close()
        back = await a.alog_lines(lambda line: "quotas: Redis answers again" in line)
        assert back, a.output()


async def test_a_signed_in_users_runs_count_across_two_instances(redis_server: RedisServer) -> None:
    secret = "a shared secret of thirty-two bytes or more"

    def token(sub: str) -> str:
        return jwt.encode({"sub": sub, "exp": int(time.time()) + 600}, secret, algorithm="HS256")

    env = instance_env(
        redis_server.url, "users", AGENT_JWT_SECRET=secret, AGENT_QUOTA_RUNS="1", AGENT_REDIS_LOCK_TTL_S="3"
    )
    a, b = ServiceProcess(env), ServiceProcess(env)
    await asyncio.gather(a.astart(), b.astart())
    try:
        async with aiohttp.ClientSession() as http:
            alice, bob = token("alice"), token("bob")
            first, response = await start_run(http, a, alice)
            assert response.status == 202
            _, response = await start_run(http, b, alice)  # her second, on the other instance
            await refused(response, "runs", 1)
            second, response = await start_run(http, b, bob)  # bob is another user
            assert response.status == 202
            for session_id, user in ((first, alice), (second, bob)):
                async with http.post(
                    f"{a.base_url}/sessions/{session_id}/cancel", headers=auth(user)
                ) as cancel:
                    assert cancel.status == 202
    finally:
        await asyncio.gather(a.aterminate(), b.aterminate())
