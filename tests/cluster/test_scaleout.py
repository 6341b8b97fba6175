"""Two service processes on one real Redis: any instance serves any session.

Each test starts its instances with ``python -m service`` (embedded emulator) and talks to them
over HTTP and WebSocket like a client behind a round-robin load balancer would.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
import redis

from tests.conftest import sse_events
from tests.support.instances import ServiceProcess
from tests.support.redis_server import RedisServer

LOCK_TTL_S = 1.0


def instance_env(url: str, prefix: str, **extra: str) -> dict[str, str]:
    return {
        "AGENT_REDIS_URL": url,
        "AGENT_REDIS_PREFIX": prefix,
        "AGENT_REDIS_LOCK_TTL_S": str(LOCK_TTL_S),
        "AGENT_EMULATOR_TTFT_MS": "0",
        "AGENT_EMULATOR_TOKENS_PER_SECOND": "0",
        "AGENT_GC_TUNING": "false",
        # Every event on its own frame, so what each reader got can be compared id by id.
        "AGENT_MERGE_DELTAS_AFTER": "1000000",
        **extra,
    }


@pytest.fixture(scope="module")
def pair(redis_url: str) -> Iterator[tuple[ServiceProcess, ServiceProcess]]:
    """Two instances sharing one prefix on the shared Redis, for the tests that harm nothing."""
    from uuid import uuid4

    from tests.support.redis_server import delete_prefix

    prefix = f"t{uuid4().hex[:12]}"
    env = instance_env(redis_url, prefix)
    a, b = ServiceProcess(env), ServiceProcess(env)
    try:
        a.start()
        b.start()
        yield a, b
    finally:
        a.terminate()
        b.terminate()
        delete_prefix(redis_url, prefix)


async def create_session(http: aiohttp.ClientSession, instance: ServiceProcess) -> str:
    async with http.post(f"{instance.base_url}/sessions") as response:
        assert response.status == 201, await response.text()
        return (await response.json())["id"]


async def post_message(
    http: aiohttp.ClientSession, instance: ServiceProcess, session_id: str, text: str
) -> int:
    async with http.post(
        f"{instance.base_url}/sessions/{session_id}/messages", json={"content": text}
    ) as response:
        return response.status


async def read_events(
    http: aiohttp.ClientSession, instance: ServiceProcess, session_id: str, last_id: int = 0, stop: Any = None
) -> list[dict[str, Any]]:
    """The SSE events after ``last_id`` until the stream ends (or ``stop(events)`` is true)."""
    url = f"{instance.base_url}/sessions/{session_id}/events"
    events: list[dict[str, Any]] = []
    async with http.get(url, headers={"Last-Event-ID": str(last_id)}) as response:
        assert response.status == 200, await response.text()
        async for event in sse_events(response):
            events.append(event)
            if stop is not None and stop(events):
                break
    return events


def ids_of(events: list[dict[str, Any]]) -> list[int]:
    return [int(event["id"]) for event in events if "id" in event]


def payloads(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [event["data"] for event in events if "id" in event]


async def poll_all(
    http: aiohttp.ClientSession, instance: ServiceProcess, session_id: str
) -> list[dict[str, Any]]:
    """Every event of the session by polling, until the session is idle and nothing is left."""
    since, events = 0, []
    while True:
        url = f"{instance.base_url}/sessions/{session_id}/events/poll?since_index={since}"
        async with http.get(url) as response:
            assert response.status == 200, await response.text()
            body = await response.json()
        events += body["events"]
        since = body["next_index"]
        if body["status"] == "idle" and since == body["last_id"]:
            return events
        if not body["events"]:
            # Polling clients wait between polls; here the wait is on the run's next event.
            await read_events(http, instance, session_id, since, stop=lambda got: True)


def terminal(event: dict[str, Any]) -> bool:
    return event["data"].get("type") in {"done", "error"}


async def slow_query_watched_on_both(
    http: aiohttp.ClientSession, a: ServiceProcess, b: ServiceProcess
) -> tuple[str, list[asyncio.Task[list[dict[str, Any]]]]]:
    """A slow query started on ``a``, a watcher on each instance, returned once text flows."""
    session_id = await create_session(http, a)
    assert await post_message(http, a, session_id, "slow [emu:tokens=2000] [emu:tps=50]") == 202
    watchers = [asyncio.create_task(read_events(http, instance, session_id)) for instance in (a, b)]
    await read_events(http, b, session_id, stop=lambda got: any(e["event"] == "assistant_text" for e in got))
    return session_id, watchers


async def test_a_query_started_on_one_instance_is_watched_on_the_other_by_sse_websocket_and_polling(
    pair: tuple[ServiceProcess, ServiceProcess],
) -> None:
    a, b = pair
    async with aiohttp.ClientSession() as http:
        session_id = await create_session(http, a)
        assert await post_message(http, a, session_id, "Tell me a story [emu:tokens=80] [emu:tps=200]") == 202
        on_a, on_b, polled = await asyncio.gather(
            read_events(http, a, session_id),
            read_events(http, b, session_id),
            poll_all(http, b, session_id),
        )
        frames = []
        async with http.ws_connect(f"{b.base_url}/ws") as ws:
            await ws.send_json({"type": "subscribe", "session_id": session_id, "last_event_id": 0})
            while not frames or frames[-1].get("type") not in {"done", "error"}:
                frame = await ws.receive_json()
                if "id" in frame:
                    frames.append(frame)
    assert payloads(on_a)[-1]["type"] == "done"
    assert payloads(on_b) == payloads(on_a)
    assert ids_of(on_b) == list(range(1, len(on_b) + 1))
    assert polled == payloads(on_a)
    assert [frame["id"] for frame in frames] == ids_of(on_a)
    assert [frame["type"] for frame in frames] == [p["type"] for p in payloads(on_a)]


async def test_a_client_resumes_on_the_other_instance_with_last_event_id(
    pair: tuple[ServiceProcess, ServiceProcess],
) -> None:
    a, b = pair
    async with aiohttp.ClientSession() as http:
        session_id = await create_session(http, a)
        assert await post_message(http, a, session_id, "A long story [emu:tokens=300] [emu:tps=300]") == 202
        first = await read_events(
            http, a, session_id, stop=lambda got: sum(e["event"] == "assistant_text" for e in got) >= 10
        )
        rest = await read_events(http, b, session_id, ids_of(first)[-1])
        every = await poll_all(http, a, session_id)
    assert ids_of(first) + ids_of(rest) == [event["id"] for event in every]
    assert payloads(first) + payloads(rest) == every
    assert every[-1]["type"] == "done"


async def test_one_query_per_session_across_instances(pair: tuple[ServiceProcess, ServiceProcess]) -> None:
    a, b = pair
    async with aiohttp.ClientSession() as http:
        session_id = await create_session(http, a)
        assert await post_message(http, a, session_id, "slow [emu:tokens=2000] [emu:tps=100]") == 202
        async with http.post(
            f"{b.base_url}/sessions/{session_id}/messages", json={"content": "me too"}
        ) as response:
            assert response.status == 409
            assert "already running" in (await response.json())["error"]
        async with http.post(f"{b.base_url}/sessions/{session_id}/cancel") as response:
            assert response.status == 202
        # Both instances race for a fresh session: exactly one query starts.
        for _ in range(5):
            contested = await create_session(http, b)
            # Long enough that the winner still runs when the other request is handled, however
            # late a loaded machine lets it come (a query that had ended would rightly be followed).
            statuses = await asyncio.gather(
                post_message(http, a, contested, "first [emu:tokens=2000] [emu:tps=50]"),
                post_message(http, b, contested, "second [emu:tokens=2000] [emu:tps=50]"),
            )
            assert sorted(statuses) == [202, 409]
            async with http.post(f"{a.base_url}/sessions/{contested}/cancel") as response:
                assert response.status == 202
            events = await read_events(http, a, contested)
            assert [p["type"] for p in payloads(events)].count("processing") == 1


async def test_a_cancel_sent_to_the_other_instance_stops_the_query_for_every_watcher(
    pair: tuple[ServiceProcess, ServiceProcess],
) -> None:
    a, b = pair
    async with aiohttp.ClientSession() as http:
        session_id, watchers = await slow_query_watched_on_both(http, a, b)
        async with http.post(f"{b.base_url}/sessions/{session_id}/cancel") as response:
            assert response.status == 202
            assert (await response.json())["cancelled"] is True
        for events in await asyncio.gather(*watchers):
            data = payloads(events)
            assert {"type": "status_change", "status": "cancelled"}.items() <= next(
                p for p in data if p.get("status") == "cancelled"
            ).items()
            assert data[-1]["type"] == "done" and data[-1]["cancelled"] is True
        # The session stays usable, from either instance.
        assert await post_message(http, b, session_id, "again [emu:tokens=3]") == 202
        after = await read_events(http, a, session_id, ids_of(events)[-1])
        assert payloads(after)[-1]["type"] == "done"


async def test_watchers_share_one_reader_per_instance(
    pair: tuple[ServiceProcess, ServiceProcess], redis_url: str
) -> None:
    a, b = pair
    client = redis.Redis.from_url(redis_url, decode_responses=True)

    def connections() -> dict[str, int]:
        counts: dict[str, int] = {}
        for entry in client.client_list():
            if entry.get("name", "").startswith("agentstream:"):
                counts[entry["name"]] = counts.get(entry["name"], 0) + 1
        return counts

    async with aiohttp.ClientSession() as http:
        async with http.get(f"{b.base_url}/healthz") as response:
            name = "agentstream:" + (await response.json())["store"]["instance_id"]
        session_id = await create_session(http, a)
        assert await post_message(http, a, session_id, "many watchers [emu:tokens=200] [emu:tps=100]") == 202
        watchers = [read_events(http, b, session_id) for _ in range(100)]
        results = await asyncio.gather(*watchers)
        during = connections()
    client.close()
    assert all(payloads(events) == payloads(results[0]) for events in results)
    assert payloads(results[0])[-1]["type"] == "done"
    # A hundred subscribers on one instance share its few connections to Redis: a bounded
    # pool for commands, plus the reader, the cancel listener and one for claims and checks.
    assert 2 < during[name] <= 16 + 3, during


async def test_killing_the_instance_running_a_query_interrupts_it_for_watchers_elsewhere(
    redis_url: str, redis_prefix: str
) -> None:
    env = instance_env(redis_url, redis_prefix)
    async with ServiceProcess(env) as a, ServiceProcess(env) as b, aiohttp.ClientSession() as http:
        session_id = await create_session(http, b)
        assert await post_message(http, a, session_id, "a long answer [emu:tokens=2000] [emu:tps=50]") == 202
        url = f"{b.base_url}/sessions/{session_id}/events"
        async with http.get(url, headers={"Last-Event-ID": "0"}) as response:
            stream = sse_events(response)
            seen = []
            async for event in stream:
                seen.append(event)
                if event["event"] == "assistant_text":
                    break
            killed_at = time.monotonic()
            await a.akill()
            async for event in stream:
                seen.append(event)
            elapsed = time.monotonic() - killed_at
        last = seen[-1]["data"]
        assert last["type"] == "error" and last["code"] == "interrupted" and last["recoverable"] is True
        assert ids_of(seen) == list(range(1, len(ids_of(seen)) + 1))
        # The claim expires within its time-to-live, and the watcher's instance checks a few
        # times per time-to-live: the error comes within about one expiry.
        assert elapsed < LOCK_TTL_S * 2 + 1.0, elapsed
        async with http.get(f"{b.base_url}/sessions/{session_id}") as response:
            assert (await response.json())["status"] == "idle"
        # The session stays usable: a new query runs on the surviving instance.
        assert await post_message(http, b, session_id, "still there? [emu:tokens=5]") == 202
        after = await read_events(http, b, session_id, ids_of(seen)[-1])
        assert payloads(after)[0]["type"] == "processing" and payloads(after)[-1]["type"] == "done"


async def test_an_orphaned_query_nobody_watched_is_ended_when_the_session_is_next_read(
    redis_url: str, redis_prefix: str
) -> None:
    env = instance_env(redis_url, redis_prefix)
    async with ServiceProcess(env) as a, ServiceProcess(env) as b, aiohttp.ClientSession() as http:
        session_id = await create_session(http, a)
        assert await post_message(http, a, session_id, "a long answer [emu:tokens=2000] [emu:tps=50]") == 202
        await read_events(
            http, a, session_id, stop=lambda got: any(e["event"] == "assistant_text" for e in got)
        )
        await a.akill()
        # Until the claim expires, the session is still running.
        async with http.post(
            f"{b.base_url}/sessions/{session_id}/messages", json={"content": "x"}
        ) as response:
            assert response.status == 409
        # A cancel to an instance that is gone ends the query at once.
        async with http.post(f"{b.base_url}/sessions/{session_id}/cancel") as response:
            assert (await response.json())["cancelled"] is True
        events = await poll_all(http, b, session_id)
        assert events[-1]["type"] == "error" and events[-1]["code"] == "interrupted"
        assert await post_message(http, b, session_id, "again [emu:tokens=3]") == 202


async def test_redis_down_gives_503_and_ends_streams_then_clients_resume(own_redis: RedisServer) -> None:
    env = instance_env(own_redis.url, "down")
    async with ServiceProcess(env) as a, aiohttp.ClientSession() as http:
        session_id = await create_session(http, a)
        assert await post_message(http, a, session_id, "a long answer [emu:tokens=600] [emu:tps=100]") == 202
        url = f"{a.base_url}/sessions/{session_id}/events"
        seen = []
        ws = await http.ws_connect(f"{a.base_url}/ws")
        await ws.send_json({"type": "subscribe", "session_id": session_id, "last_event_id": 0})
        async with http.get(url, headers={"Last-Event-ID": "0"}) as response:
            async for event in sse_events(response):
                seen.append(event)
                if event["event"] == "assistant_text" and len(seen) == 12:
                    own_redis.kill()
        # A WebSocket subscription is told the same way, and the socket stays open.
        frame: dict[str, Any] = {}
        while frame.get("type") != "error":
            frame = await ws.receive_json()
        assert frame["code"] == "store_unavailable" and frame["session_id"] == session_id
        await ws.send_json({"type": "ping"})
        assert (await ws.receive_json())["type"] == "pong"
        await ws.close()
        # The stream was told why it ended, with the last id it had sent.
        assert seen[-1]["event"] == "error"
        assert seen[-1]["data"]["code"] == "store_unavailable" and seen[-1]["data"]["recoverable"] is True
        last_seen = ids_of(seen)[-1]
        assert seen[-1]["data"]["last_id"] == last_seen
        # New work is refused with a clear body; health says so; the process lives on.
        async with http.post(f"{a.base_url}/sessions") as response:
            assert response.status == 503
            body = await response.json()
            assert body["code"] == "store_unavailable" and "Redis" in body["error"]
            assert response.headers["Retry-After"] == "1"
        async with http.get(f"{a.base_url}/healthz") as response:
            assert response.status == 503
            assert (await response.json())["store"]["connected"] is False
        assert a.running
        own_redis.start()
        # The client resumes where it was; every event it had acknowledged is still there.
        every = await poll_all(http, a, session_id)
        assert [e["id"] for e in every][:last_seen] == ids_of(seen)
        assert every[:last_seen] == payloads(seen)
        assert every[-1]["type"] in {"done", "error"}
        async with http.get(f"{a.base_url}/healthz") as response:
            assert response.status == 200 and (await response.json())["store"]["connected"] is True
        assert await post_message(http, a, session_id, "back again [emu:tokens=3]") == 202


async def resuming_reader(
    http: aiohttp.ClientSession, instances: list[ServiceProcess], session_id: str, deadline: float
) -> list[dict[str, Any]]:
    """A client that reconnects with its last id, switching instances, until the query's end."""
    events: list[dict[str, Any]] = []
    turn = 0
    while time.monotonic() < deadline:
        instance = instances[turn % len(instances)]
        turn += 1
        url = f"{instance.base_url}/sessions/{session_id}/events"
        last = ids_of(events)[-1] if ids_of(events) else 0
        try:
            async with http.get(url, headers={"Last-Event-ID": str(last)}) as response:
                if response.status == 503:
                    await asyncio.sleep(0.05)  # the store is coming back: the client's backoff
                    continue
                assert response.status == 200, await response.text()
                async for event in sse_events(response):
                    if "id" in event:
                        events.append(event)
                        if terminal(event):
                            return events
        except aiohttp.ClientError:
            await asyncio.sleep(0.05)
    raise AssertionError(f"session {session_id} did not finish; got {len(events)} events")


async def test_redis_restarted_under_load_loses_no_acknowledged_event(own_redis: RedisServer) -> None:
    env = instance_env(own_redis.url, "restart")
    async with ServiceProcess(env) as a, ServiceProcess(env) as b, aiohttp.ClientSession() as http:
        instances = [a, b]
        sessions = []
        for n in range(6):
            session_id = await create_session(http, instances[n % 2])
            text = f"story {n} [emu:tokens=400] [emu:tps=150]"
            assert await post_message(http, instances[n % 2], session_id, text) == 202
            sessions.append(session_id)
        deadline = time.monotonic() + 40
        readers = [
            asyncio.create_task(resuming_reader(http, instances[n % 2 :] + instances[: n % 2], sid, deadline))
            for n, sid in enumerate(sessions)
        ]
        # Restart Redis while every query is streaming.
        await read_events(
            http, a, sessions[0], stop=lambda got: sum(e["event"] == "assistant_text" for e in got) >= 40
        )
        await asyncio.to_thread(own_redis.restart)
        results = await asyncio.gather(*readers)
        for session_id, events in zip(sessions, results, strict=True):
            every = await poll_all(http, a, session_id)
            # Nothing the readers were sent is lost or changed, nothing came twice.
            assert ids_of(events) == [e["id"] for e in every]
            assert payloads(events) == every
            # The queries rode the restart out: their appends were retried, none was lost.
            assert every[-1]["type"] == "done", every[-1]
    assert own_redis.running


async def test_deleting_a_running_session_on_the_other_instance_ends_every_stream(
    pair: tuple[ServiceProcess, ServiceProcess],
) -> None:
    a, b = pair
    async with aiohttp.ClientSession() as http:
        session_id, watchers = await slow_query_watched_on_both(http, a, b)
        async with http.delete(f"{b.base_url}/sessions/{session_id}") as response:
            assert response.status == 204
        for events in await asyncio.wait_for(asyncio.gather(*watchers), 10):
            assert payloads(events)[-1]["type"] == "done" and payloads(events)[-1]["cancelled"] is True
        for instance in (a, b):
            async with http.get(f"{instance.base_url}/sessions/{session_id}") as response:
                assert response.status == 404


async def test_a_purged_resume_on_the_other_instance_gets_the_running_querys_snapshot(
    redis_url: str, redis_prefix: str
) -> None:
    env = instance_env(redis_url, redis_prefix, AGENT_SESSION_EVENTS_MAX_BYTES="200000")
    async with ServiceProcess(env) as a, ServiceProcess(env) as b, aiohttp.ClientSession() as http:
        session_id = await create_session(http, a)
        # A first, long answer fills the log past its bound; the second query then runs on A.
        assert await post_message(http, a, session_id, "first [emu:tokens=600]") == 202
        # A fresh connection follows a running query to its end (or says at once it is idle).
        async with http.get(f"{a.base_url}/sessions/{session_id}/events") as response:
            assert [event async for event in sse_events(response)]
        async with http.get(f"{a.base_url}/sessions/{session_id}") as response:
            after_first = (await response.json())["last_event_id"]
        assert await post_message(http, a, session_id, "second [emu:tokens=2000] [emu:tps=100]") == 202
        live = await read_events(
            http,
            a,
            session_id,
            after_first,
            stop=lambda got: sum(e["event"] == "assistant_text" for e in got) >= 5,
        )
        async with http.get(
            f"{b.base_url}/sessions/{session_id}/events", headers={"Last-Event-ID": "1"}
        ) as response:
            assert response.status == 410
            body = await response.json()
        current = body["snapshot"]["current_query"]
        assert body["snapshot"]["status"] == "running" and "partial" not in current
        assert current["message"] == "second [emu:tokens=2000] [emu:tps=100]"
        started = next(
            i for i, e in enumerate(live) if e["event"] == "processing" and "second" in e["data"]["message"]
        )
        text_so_far = "".join(e["data"]["text"] for e in live[started:] if e["event"] == "assistant_text")
        assert current["text"].startswith(text_so_far) and text_so_far
        assert len(body["snapshot"]["messages"]) == 2  # the first query's question and answer
        async with http.post(f"{b.base_url}/sessions/{session_id}/cancel") as response:
            assert (await response.json())["cancelled"] is True


async def test_mcp_clients_on_both_instances_follow_one_session(
    pair: tuple[ServiceProcess, ServiceProcess],
) -> None:
    """An MCP client on each instance, one agent session: each gets every event it follows, once."""
    from tests.transports.test_mcp import Notifications, call, connect, ids

    a, b = pair
    on_a_got, on_b_got = Notifications(), Notifications()
    async with connect(f"{a.base_url}/mcp", on_a_got) as on_a, connect(f"{b.base_url}/mcp", on_b_got) as on_b:
        await on_a.set_logging_level("debug")
        await on_b.set_logging_level("debug")
        session_id = (await call(on_a, "session_message", content="what is 2+3?"))["session_id"]
        first = await on_a_got.wait_done(session_id)
        # The conversation goes on through the other instance, and a script watches it there too.
        async with aiohttp.ClientSession() as http:
            await call(on_b, "session_message", session_id=session_id, content="and 3+4?")
            watching = asyncio.ensure_future(read_events(http, b, session_id, first[-1]["id"]))
            from_b = await on_b_got.wait_done(session_id)
            from_a = await on_a_got.wait_done(session_id, count=2)
            from_sse = await asyncio.wait_for(watching, 15)
    last = from_a[-1]["id"]
    assert ids(from_a) == list(range(1, last + 1))
    assert ids(from_b) == list(range(first[-1]["id"] + 1, last + 1))
    assert [int(event["id"]) for event in from_sse] == ids(from_b)
    assert "7" in from_b[-1]["output"]


async def read_sse_raw(response: aiohttp.ClientResponse) -> list[str]:
    """Every line of an SSE body until the server ends it."""
    lines = []
    try:
        async for line in response.content:
            lines.append(line.decode().rstrip("\r\n"))
    except aiohttp.ClientPayloadError:
        lines.append("<cut>")
    return lines


async def test_sigterm_drains_clients_to_the_other_instance_with_nothing_lost(
    redis_url: str, redis_prefix: str
) -> None:
    """SIGTERM: listening stops, the query running here ends for everyone, a stream waiting on a
    query that runs elsewhere gets a retry hint, WebSockets get 1001, the process exits in time,
    and every client resumes on the other instance from its last id."""
    env = instance_env(redis_url, redis_prefix, AGENT_SHUTDOWN_TIMEOUT_S="5", AGENT_SSE_RETRY_MS="250")
    slow = "a long answer [emu:tokens=2000] [emu:tps=50]"
    async with ServiceProcess(env) as a, ServiceProcess(env) as b, aiohttp.ClientSession() as http:
        here, elsewhere = await create_session(http, a), await create_session(http, b)
        assert await post_message(http, a, here, slow) == 202
        assert await post_message(http, b, elsewhere, "[emu:tokens=100] [emu:tps=20]") == 202
        sse_here = await http.get(f"{a.base_url}/sessions/{here}/events", headers={"Last-Event-ID": "0"})
        sse_elsewhere = await http.get(
            f"{a.base_url}/sessions/{elsewhere}/events", headers={"Last-Event-ID": "0"}
        )
        ws = await http.ws_connect(f"{a.base_url.replace('http', 'ws')}/ws")
        await ws.send_json({"type": "subscribe", "session_id": here, "last_event_id": 0})
        ws_seen: list[dict[str, Any]] = []
        while not any(frame.get("type") == "assistant_text" for frame in ws_seen):
            ws_seen.append(await ws.receive_json())
        stopped_at = time.monotonic()
        stopping = asyncio.ensure_future(a.aterminate())
        here_lines, elsewhere_lines = await asyncio.wait_for(
            asyncio.gather(read_sse_raw(sse_here), read_sse_raw(sse_elsewhere)), 10
        )
        while (message := await ws.receive()).type == aiohttp.WSMsgType.TEXT:
            ws_seen.append(json.loads(message.data))
        assert message.type == aiohttp.WSMsgType.CLOSE and message.data == 1001
        assert await stopping == 0
        assert time.monotonic() - stopped_at < 5 + 2  # within the shutdown timeout
        assert "<cut>" not in here_lines + elsewhere_lines  # every stream ended properly
        # The query that ran here ended for its readers with a recoverable error...
        here_ids = [int(line[4:]) for line in here_lines if line.startswith("id: ")]
        assert here_ids == list(range(1, len(here_ids) + 1))
        ended = json.loads([line for line in here_lines if line.startswith("data: ")][-1][6:])
        assert ended["type"] == "error" and ended["code"] == "shutdown" and ended["recoverable"] is True
        ws_ids = [frame["id"] for frame in ws_seen if "id" in frame]
        assert ws_ids == here_ids
        # ...and the other instance has all of it, nothing more to send, and goes on with it.
        async with http.get(f"{b.base_url}/sessions/{here}") as response:
            state = await response.json()
        assert state["status"] == "idle" and state["last_event_id"] == here_ids[-1]
        async with http.get(
            f"{b.base_url}/sessions/{here}/events", headers={"Last-Event-ID": str(here_ids[-1])}
        ) as response:
            assert response.status == 204
        assert await post_message(http, b, here, "and now? [emu:tokens=3]") == 202
        after = await read_events(http, b, here, here_ids[-1])
        assert payloads(after)[0]["type"] == "processing" and payloads(after)[-1]["type"] == "done"
        # The stream that followed a query running elsewhere was told to come back soon, and
        # picks up on the other instance where it stopped.
        assert elsewhere_lines[-3:] == [": server shutting down", "retry: 250", ""]
        elsewhere_ids = [int(line[4:]) for line in elsewhere_lines if line.startswith("id: ")]
        rest = await read_events(http, b, elsewhere, elsewhere_ids[-1])
        assert elsewhere_ids + ids_of(rest) == list(range(1, ids_of(rest)[-1] + 1))
        assert payloads(rest)[-1]["type"] == "done"
