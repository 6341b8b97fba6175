"""Sessions over real HTTP: routes, the session event stream, resume, polling, purge, cancel."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient

from tests.conftest import SESSION_ROUTES, SUITE_REDIS_URL, ClientFactory, services_of, sse_events
from tests.support.sessions import new_session


async def send(client: TestClient, session_id: str, content: str, status: int = 202) -> dict[str, Any]:
    async with client.post(f"/sessions/{session_id}/messages", json={"content": content}) as response:
        assert response.status == status, await response.text()
        return await response.json()


async def read_all(client: TestClient, session_id: str, **headers: str) -> list[dict[str, Any]]:
    async with client.get(f"/sessions/{session_id}/events", headers=headers) as response:
        assert response.status == 200, await response.text()
        return [event async for event in sse_events(response)]


async def wait_done(client: TestClient, session_id: str) -> None:
    """Wait for the session's query to end (on the run itself)."""
    run = services_of(client).runs.get(session_id)
    if run is not None:
        await run.wait()


def ids(events: list[dict[str, Any]]) -> list[int]:
    return [int(event["id"]) for event in events if "id" in event]


async def test_session_routes(client: TestClient) -> None:
    session_id = await new_session(client)
    async with client.get(f"/sessions/{session_id}") as response:
        body = await response.json()
    assert body == {
        "id": session_id,
        "status": "idle",
        "messages": [],
        "usage": body["usage"],
        "last_event_id": 0,
        "agent": "default",
        "pending_approvals": [],
        "pending_tool_calls": [],
    }
    await send(client, session_id, "What is the square root of 144?")
    await wait_done(client, session_id)
    await send(client, session_id, "And now tell me more [emu:tokens=5]")
    await wait_done(client, session_id)
    async with client.get(f"/sessions/{session_id}") as response:
        body = await response.json()
    roles = [message["role"] for message in body["messages"]]
    assert roles == ["user", "assistant", "user", "assistant", "user", "assistant"]
    assert body["usage"]["total_tokens"] > 0
    # the second query saw the first: its request carried the whole conversation
    records = services_of(client).emulator.records()
    assert records[-1].user_text.startswith("And now tell me more")
    async with client.delete(f"/sessions/{session_id}") as response:
        assert response.status == 204
    for method, path in SESSION_ROUTES:
        async with client.request(method, f"/sessions/{session_id}{path}", json={"content": "x"}) as response:
            assert response.status == 404, (method, path)
            assert await response.json() == {"error": "Session not found"}


async def test_a_second_query_while_one_runs_is_409(client: TestClient) -> None:
    session_id = await new_session(client)
    await send(client, session_id, "slow [emu:ttft=5000]")
    body = await send(client, session_id, "another", status=409)
    assert "already running" in body["error"]
    async with client.post(f"/sessions/{session_id}/cancel") as response:
        assert response.status == 202 and (await response.json())["cancelled"] is True


async def test_bad_input_on_session_routes(client: TestClient) -> None:
    session_id = await new_session(client)
    for body, status in [(b"{", 400), (b"[]", 422), (b'{"content": ""}', 422), (b'{"text": "x"}', 422)]:
        async with client.post(f"/sessions/{session_id}/messages", data=body) as response:
            assert response.status == status
            assert "error" in await response.json()
    async with client.post("/sessions", data=b"not json") as response:
        assert response.status == 400
    # No body makes a session; a blank one is a body that is not JSON (what schemathesis sends).
    async with client.post("/sessions", data=b"") as response:
        assert response.status == 201
    async with client.post(
        "/sessions", data=b"\r\n\r\n", headers={"Content-Type": "application/json"}
    ) as response:
        assert response.status == 400 and "error" in await response.json()
    for query in ("last_event_id=abc", "last_event_id=-1", "last_event_id=99"):
        async with client.get(f"/sessions/{session_id}/events?{query}") as response:
            assert response.status == 400 and "error" in await response.json()
    async with client.get(f"/sessions/{session_id}/events", headers={"Last-Event-ID": "x"}) as response:
        assert response.status == 400
    async with client.get(f"/sessions/{session_id}/events/poll?since_index=nope") as response:
        assert response.status == 400


@pytest.mark.slow
async def test_three_subscribers_and_a_poller_see_the_same_events(make_client: ClientFactory) -> None:
    client = await make_client(merge_deltas_after=10_000)
    session_id = await new_session(client)
    await send(client, session_id, "A story [emu:tokens=40] [emu:tps=400]")
    polled: list[dict[str, Any]] = []
    next_index = 0

    async def poll() -> None:
        nonlocal next_index
        async with client.get(f"/sessions/{session_id}/events/poll?since_index={next_index}") as response:
            body = await response.json()
        polled.extend(body["events"])
        next_index = body["next_index"]

    async def subscriber(poll_along: bool) -> list[dict[str, Any]]:
        seen = []
        async with client.get(f"/sessions/{session_id}/events", headers={"Last-Event-ID": "0"}) as response:
            async for event in sse_events(response):
                seen.append(event)
                if poll_along:
                    await poll()  # mixed mode: poll as events arrive
        return seen

    streams = await asyncio.gather(subscriber(True), subscriber(False), subscriber(False))
    await poll()
    expected = [(int(e["id"]), e["data"]) for e in streams[0]]
    assert [e["id"] for e in polled] == ids(streams[0]) == list(range(1, len(expected) + 1))
    for stream in streams[1:]:
        assert [(int(e["id"]), e["data"]) for e in stream] == expected
    assert [(e["id"], e) for e in polled] == expected
    assert all(e["event"] == e["data"]["type"] for e in streams[0])
    assert expected[-1][1]["type"] == "done"


async def test_joining_mid_run_and_resuming_by_last_event_id(make_client: ClientFactory) -> None:
    client = await make_client(merge_deltas_after=10_000)
    session_id = await new_session(client)
    await send(client, session_id, "A story [emu:tokens=60] [emu:tps=200]")
    async with client.get(f"/sessions/{session_id}/events", headers={"Last-Event-ID": "0"}) as first:
        stream = sse_events(first)
        seen = []
        while len(seen) < 8:
            seen.append(await anext(stream))
        k = int(seen[-1]["id"])
        # a fresh client joining now: its status first (no id), then only what comes after
        async with client.get(f"/sessions/{session_id}/events") as fresh:
            joined = [event async for event in sse_events(fresh)]
        # a reconnect with Last-Event-ID k: exactly k+1 onwards, then live
        async with client.get(f"/sessions/{session_id}/events", headers={"Last-Event-ID": str(k)}) as again:
            resumed = [event async for event in sse_events(again)]
        rest = [event async for event in stream]
    assert joined[0]["event"] == "status_change" and "id" not in joined[0]
    assert joined[0]["data"] == {"type": "status_change", "status": "running"}
    joined_ids = ids(joined)
    assert joined_ids[0] > k and joined_ids == list(range(joined_ids[0], joined_ids[-1] + 1))
    assert ids(resumed) == list(range(k + 1, ids(rest)[-1] + 1))
    assert ids(seen) + ids(rest) == list(range(1, ids(rest)[-1] + 1))
    assert resumed[-1]["data"]["type"] == joined[-1]["data"]["type"] == "done"


async def test_idle_session_gets_its_status_and_a_close(client: TestClient) -> None:
    session_id = await new_session(client)
    events = await read_all(client, session_id)
    assert [(e["event"], e["data"]) for e in events] == [
        ("status_change", {"type": "status_change", "status": "idle"})
    ]


async def test_wire_format_and_headers(client: TestClient) -> None:
    session_id = await new_session(client)
    await send(client, session_id, "hi [emu:tokens=2]")
    await wait_done(client, session_id)
    async with client.get(f"/sessions/{session_id}/events?last_event_id=0") as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        assert response.headers["Cache-Control"] == "no-cache"
        assert response.headers["Connection"].lower() == "keep-alive"
        raw = await response.read()
    first = raw.split(b"\r\n\r\n")[0].decode()
    lines = first.split("\r\n")
    assert (
        lines[0] == "id: 1"
        and lines[1] == "event: processing"
        and lines[2].startswith('data: {"type":"processing"')
    )


@pytest.mark.slow
async def test_reconnect_after_done_gets_204_so_eventsource_stops(client: TestClient) -> None:
    session_id = await new_session(client)
    await send(client, session_id, "hi [emu:tokens=2]")
    events = await read_all(client, session_id, **{"Last-Event-ID": "0"})
    last = events[-1]
    assert last["data"]["type"] == "done"
    async with client.get(
        f"/sessions/{session_id}/events", headers={"Last-Event-ID": last["id"]}
    ) as response:
        assert response.status == 204
    # ...while a reconnect from earlier still replays what it missed and closes after done
    again = await read_all(client, session_id, **{"Last-Event-ID": str(int(last["id"]) - 3)})
    assert ids(again) == [int(last["id"]) - 2, int(last["id"]) - 1, int(last["id"])]


async def test_tiny_bound_purges_resume_gives_410_and_poll_says_so(make_client: ClientFactory) -> None:
    client = await make_client(session_events_max_bytes=8192)
    session_id = await new_session(client)
    await send(client, session_id, "What is the square root of 144?")
    await wait_done(client, session_id)
    await send(client, session_id, "A long answer [emu:tokens=60]")
    await wait_done(client, session_id)
    session = await services_of(client).sessions.get(session_id)
    oldest = await session.log.first_id()
    assert oldest > 2
    async with client.get(f"/sessions/{session_id}/events", headers={"Last-Event-ID": "1"}) as response:
        assert response.status == 410
        body = await response.json()
    assert body["oldest_id"] == oldest and "purged" in body["error"]
    snapshot = body["snapshot"]
    assert [m["role"] for m in snapshot["messages"]] == [
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
        "assistant",
    ]
    assert snapshot["usage"]["total_tokens"] == session.usage.total_tokens > 0
    async with client.get(f"/sessions/{session_id}/events/poll?since_index=0") as response:
        polled = await response.json()
    assert polled["purged"] is True and polled["oldest_id"] == oldest
    assert polled["events"][0]["id"] == oldest and polled["next_index"] == polled["events"][-1]["id"]
    assert "snapshot" in polled


async def test_purge_snapshot_mid_run_holds_the_query_so_far(make_client: ClientFactory) -> None:
    client = await make_client(session_events_max_bytes=8192)
    session_id = await new_session(client)
    await send(client, session_id, "What is the square root of 144? [emu:tps=100]")
    session = await services_of(client).sessions.get(session_id)
    async for batch in session.log.subscribe(await session.log.last_id()):  # until text flows
        if any(entry.event.type == "text_delta" for entry in batch):
            break
    body = None
    async with client.get(f"/sessions/{session_id}/events", headers={"Last-Event-ID": "1"}) as response:
        if response.status == 410:
            body = await response.json()
    assert body is not None
    current = body["snapshot"]["current_query"]
    assert current["message"].startswith("What is the square root of 144?")
    assert current["tool_calls"][0]["result"] == "12" and current["usage"]["total_tokens"] > 0
    await wait_done(client, session_id)


async def test_heartbeats_carry_the_last_id_and_status(make_client: ClientFactory) -> None:
    client = await make_client(heartbeat_interval_s=0.05)
    session_id = await new_session(client)
    await send(client, session_id, "wait for it [emu:ttft=60000]")
    async with client.get(f"/sessions/{session_id}/events") as response:
        stream = sse_events(response)
        status = await anext(stream)
        heartbeat = await anext(stream)
        async with client.post(f"/sessions/{session_id}/cancel") as cancel:
            assert cancel.status == 202
        rest = [event async for event in stream]
    assert status["data"]["status"] == "running"
    assert heartbeat["event"] == "heartbeat" and "id" not in heartbeat
    assert heartbeat["data"] == {"type": "heartbeat", "last_id": 2, "status": "running"}
    assert rest[-1]["data"]["type"] == "done" and rest[-1]["data"]["cancelled"] is True


@pytest.mark.slow
async def test_cancel_is_seen_by_every_subscriber(client: TestClient) -> None:
    session_id = await new_session(client)
    await send(client, session_id, "What is the square root of 144? [emu:tokens=500] [emu:tps=50]")
    session = await services_of(client).sessions.get(session_id)

    async def subscriber() -> list[dict[str, Any]]:
        return await read_all(client, session_id, **{"Last-Event-ID": "0"})

    tasks = [asyncio.create_task(subscriber()) for _ in range(2)]
    async for batch in session.log.subscribe(0):  # cancel once the answer is streaming
        if any(entry.event.type == "text_delta" for entry in batch):
            break
    async with client.post(f"/sessions/{session_id}/cancel") as response:
        assert (await response.json())["cancelled"] is True
    for events in await asyncio.gather(*tasks):
        types = [e["data"]["type"] for e in events]
        statuses = [e["data"]["status"] for e in events if e["data"]["type"] == "status_change"]
        assert "cancelled" in statuses and types[-1] == "done"
        done = events[-1]["data"]
        # The tool's turn, and the answer's turn the cancel cut short: both were billed.
        assert done["cancelled"] is True and done["usage"]["total_tokens"] > 0 and done["turns"] == 2
        assert done["tool_calls"][0]["result"] == "12"
    assert (await services_of(client).sessions.get(session_id)).status == "idle"
    await send(client, session_id, "still usable [emu:tokens=2]")


async def test_cancel_before_the_query_really_started(client: TestClient) -> None:
    session_id = await new_session(client)
    services = services_of(client)
    session = await services.sessions.get(session_id)
    await services.runs.start(session, "never mind")
    assert await services.runs.cancel(session_id)  # same tick: the run's task never ran
    types = [entry.event.type for entry in await session.log.read(0)]
    assert types[-3:] == ["status_change", "status_change", "done"]
    assert (await session.log.read(0))[-1].event.cancelled
    assert not services.emulator.records() or all(
        "never mind" not in r.user_text for r in services.emulator.records()
    )


async def test_live_usage_per_turn_and_running_total(client: TestClient) -> None:
    session_id = await new_session(client)
    await send(client, session_id, "What is the square root of 144?")
    events = await read_all(client, session_id, **{"Last-Event-ID": "0"})
    usage = [e["data"] for e in events if e["data"]["type"] == "usage"]
    assert [u["turn"] for u in usage] == [1, 2]
    assert (
        usage[1]["total_usage"]["total_tokens"]
        == usage[0]["usage"]["total_tokens"] + usage[1]["usage"]["total_tokens"]
    )
    assert events[-1]["data"]["usage"] == usage[1]["total_usage"]


async def test_a_lagging_reader_gets_merged_text_deltas(make_client: ClientFactory) -> None:
    client = await make_client(merge_deltas_after=8)
    session_id = await new_session(client)
    await send(client, session_id, "A story [emu:tokens=50]")
    await wait_done(client, session_id)
    async with client.get(f"/sessions/{session_id}/events/poll?since_index=0") as response:
        every = (await response.json())["events"]
    events = await read_all(client, session_id, **{"Last-Event-ID": "0"})
    texts = [e["data"] for e in events if e["data"]["type"] == "assistant_text"]
    assert len(texts) == 1 and texts[0]["first_id"] < texts[0]["id"]
    full = "".join(e["text"] for e in every if e["type"] == "assistant_text")
    assert texts[0]["text"] == full
    # nothing lost: every id is covered once, by an event or by a merged range
    covered = []
    for e in events:
        data = e["data"]
        covered.extend(range(data.get("first_id", data["id"]), data["id"] + 1))
    assert covered == [e["id"] for e in every]
    assert len(events) < len(every)


@pytest.mark.slow
async def test_a_stalled_reader_does_not_hold_up_the_run(make_client: ClientFactory) -> None:
    client = await make_client(session_events_max_bytes=600_000)
    session_id = await new_session(client)
    await send(client, session_id, "A long story [emu:tokens=2000] [emu:tps=4000]")
    # A client that asks for the stream and never reads a byte.
    reader, writer = await asyncio.open_connection(client.host, client.port)
    writer.write(
        f"GET /sessions/{session_id}/events?last_event_id=0 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
    )
    await writer.drain()
    async with client.get(f"/sessions/{session_id}/events") as response:
        normal = [event async for event in sse_events(response)]
    assert normal[-1]["data"]["type"] == "done"
    session = await services_of(client).sessions.get(session_id)
    assert session.status == "idle"  # the run finished while one reader never read a byte
    assert 0 < await session.log.kept_bytes() <= 600_000
    writer.close()


async def test_subscriptions_are_released_when_clients_leave(client: TestClient) -> None:
    session_id = await new_session(client)
    await send(client, session_id, "long [emu:tokens=2000] [emu:tps=50]")
    session = await services_of(client).sessions.get(session_id)
    async with client.get(f"/sessions/{session_id}/events") as response:
        stream = sse_events(response)
        await anext(stream)
        await anext(stream)
        assert session.log.subscribers == 1
        response.close()
    # the handler is cancelled and its subscription closed
    await asyncio.wait_for(session.log.wait_subscribers(0), 5)
    # a disconnect never cancels a session's query
    assert (await services_of(client).sessions.get(session_id)).status == "running"
    async with client.post(f"/sessions/{session_id}/cancel") as cancel:
        assert cancel.status == 202


@pytest.mark.skipif(bool(SUITE_REDIS_URL), reason="Redis expires sessions by its own clock (tests/cluster)")
async def test_session_cap_and_idle_time_to_live(make_client: ClientFactory) -> None:
    client = await make_client(max_sessions=2, session_ttl_s=60)
    first = await new_session(client)
    await new_session(client)
    async with client.post("/sessions") as response:
        assert response.status == 503 and "sessions" in (await response.json())["error"]
    store = services_of(client).sessions
    assert await store.expire_idle(now=time.monotonic() + 30) == []
    expired = await store.expire_idle(now=time.monotonic() + 61)
    assert first in expired and await store.count() == 0
    async with client.get(f"/sessions/{first}") as response:
        assert response.status == 404
    await new_session(client)


@pytest.mark.slow
async def test_running_sessions_do_not_expire(make_client: ClientFactory) -> None:
    client = await make_client(session_ttl_s=60)
    session_id = await new_session(client)
    await send(client, session_id, "slow [emu:ttft=60000]")
    assert await services_of(client).sessions.expire_idle(now=time.monotonic() + 3600) == []
    async with client.post(f"/sessions/{session_id}/cancel"):
        pass


async def step_stream(client: TestClient, session_id: str, query: str) -> list[dict[str, Any]]:
    async with client.get(f"/sessions/{session_id}/stream", params={"query": query}) as response:
        assert response.status == 200 and response.headers["Content-Type"].startswith("text/event-stream")
        return [event["data"] async for event in sse_events(response)]


async def test_step_stream_seed_000(client: TestClient) -> None:
    session_id = await new_session(client)
    events = await step_stream(client, session_id, "What is the square root of 144?")
    assert [e["type"] for e in events] == ["message", "step", "step", "final", "done"]
    message = events[0]
    assert message["role"] == "user" and message["content"] == "What is the square root of 144?"
    assert message["timestamp"].endswith("Z")
    action = events[1]
    assert action["step_type"] == "action" and action["step_number"] == 1
    assert set(action) >= {"model_output", "code_action", "observations", "error", "token_usage"}
    assert (
        "calculator" in action["code_action"] and action["observations"] == "12" and action["error"] is None
    )
    usage = action["token_usage"]
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"] > 0
    assert events[3] == {"type": "final", "step_number": 3, "output": "The square root of 144 is 12."}


async def test_step_stream_with_planning(make_client: ClientFactory) -> None:
    client = await make_client(steps_planning=True)
    session_id = await new_session(client)
    events = await step_stream(client, session_id, "What is 2 + 2?")
    plan = events[1]
    assert plan["type"] == "step" and plan["step_type"] == "planning" and plan["step_number"] == 1
    assert plan["plan"].startswith("1.")
    assert [e.get("step_number") for e in events if e["type"] in {"step", "final"}] == [1, 2, 3, 4]


async def test_step_stream_errors_exactly_as_seed_000(client: TestClient) -> None:
    session_id = await new_session(client)
    async with client.get(f"/sessions/{session_id}/stream") as response:
        assert response.status == 400 and await response.json() == {"error": "Query parameter is required"}
    async with client.get("/sessions/invalid-id/stream?query=test") as response:
        assert response.status == 404 and await response.json() == {"error": "Session not found"}
    events = await step_stream(client, session_id, "x [emu:http=400]")
    assert events[-1]["type"] == "error" and events[-1]["error"]


async def test_events_are_kept_for_polling_without_any_stream(client: TestClient) -> None:
    session_id = await new_session(client)
    await send(client, session_id, "quietly [emu:tokens=3]")
    await wait_done(client, session_id)
    async with client.get(f"/sessions/{session_id}/events/poll?since_index=0&limit=2") as response:
        page = await response.json()
    assert [e["id"] for e in page["events"]] == [1, 2] and page["next_index"] == 2
    async with client.get(f"/sessions/{session_id}/events/poll?since_index=2") as response:
        rest = await response.json()
    assert rest["events"][0]["id"] == 3 and rest["events"][-1]["type"] == "done" and rest["status"] == "idle"


async def test_deleting_a_running_session_ends_its_streams(client: TestClient) -> None:
    session_id = await new_session(client)
    await send(client, session_id, "long [emu:tokens=2000] [emu:tps=50]")
    async with client.get(f"/sessions/{session_id}/events") as response:
        stream = sse_events(response)
        await anext(stream)
        async with client.delete(f"/sessions/{session_id}") as deleted:
            assert deleted.status == 204
        rest = [event async for event in stream]
    assert rest[-1]["data"]["type"] == "done" and rest[-1]["data"]["cancelled"] is True


_ = aiohttp  # the client type comes from the fixture


async def test_an_sse_client_that_stops_reading_is_dropped_after_the_send_timeout(
    make_client: ClientFactory,
) -> None:
    import socket

    client = await make_client(sse_send_timeout_s=0.3)
    session_id = await new_session(client)
    session = await services_of(client).sessions.get(session_id)
    # A client with a tiny receive window that asks for the stream and never reads a byte.
    await send(client, session_id, "A long story [emu:tokens=20000]")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, (client.host, client.port))
    request = f"GET /sessions/{session_id}/events?last_event_id=0 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    await loop.sock_sendall(sock, request.encode())
    await asyncio.wait_for(session.log.wait_subscribers(1), 10)
    # Its socket fills, the next write waits past the timeout, and the server lets it go.
    await asyncio.wait_for(session.log.wait_subscribers(0), 20)
    assert (await services_of(client).sessions.get(session_id)).status in {"running", "idle"}
    sock.close()


@pytest.mark.slow
async def test_a_query_cancelled_mid_answer_reports_what_it_used(client: TestClient) -> None:
    # The model reports a turn's usage only at its end; a cancel mid-answer still used (and is
    # billed for) the whole request and the tokens generated so far.
    session_id = await new_session(client)
    await send(client, session_id, "Tell me a story [emu:tokens=500] [emu:tps=100]")
    session = await services_of(client).sessions.get(session_id)
    streamed = 0
    async for batch in session.log.subscribe(0):
        streamed += sum(entry.event.type == "text_delta" for entry in batch)
        if streamed >= 10:
            break
    async with client.post(f"/sessions/{session_id}/cancel") as response:
        assert (await response.json())["cancelled"] is True
    events = await read_all(client, session_id, **{"Last-Event-ID": "0"})
    done = events[-1]["data"]
    assert done["type"] == "done" and done["cancelled"] is True
    assert done["turns"] == 1
    usage = done["usage"]
    assert usage["input_tokens"] > 0 and usage["output_tokens"] >= 10
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    await services_of(client).runs.wait_idle()
    kept = await services_of(client).sessions.get(session_id)  # as the store keeps it now
    assert kept.usage.total_tokens == usage["total_tokens"]


class ManualStamp:
    """A session store's clock that says what the test sets."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.mark.slow
@pytest.mark.parametrize(
    "before",
    [
        "nan~s_x",
        "NaN~s_x",
        "inf~s_x",
        "-Infinity~s_x",
        "1_000~s_x",
        "\uff11\uff12~s_x",  # full-width digits
        "\u0661\u0662~s_x",  # Arabic-Indic digits
        "1e3~s_x",
        " 5~s_x",
        "+5~s_x",
        "5.~s_x",
        ".5~s_x",
        "0x10~s_x",
        "9" * 400 + "~s_x",  # a plain decimal, but float() makes it an infinity
        "5~",
        "5",
        "nonsense",
    ],
)
async def test_a_listing_cursor_is_a_plain_finite_decimal_or_a_400(
    make_client: ClientFactory, tmp_path: Any, before: str
) -> None:
    client = await make_client(database_url=f"sqlite+aiosqlite:///{tmp_path / 'sessions.db'}")
    async with client.get("/sessions", params={"before": before}) as response:
        assert response.status == 400, await response.text()
        assert "before" in (await response.json())["error"]


async def test_a_listing_cursor_pages_on_whatever_the_clock_reads(
    make_client: ClientFactory, tmp_path: Any
) -> None:
    """A clock near zero has a repr with an exponent (1e-05); its cursor is still a plain decimal."""
    database_url = f"sqlite+aiosqlite:///{tmp_path / 'sessions.db'}"
    client = await make_client(database_url=database_url, session_retention_days=0)
    clock = ManualStamp(0.0)
    services_of(client).sessions.clock = clock
    made = []
    for stamp in (1e-06, 2e-05, 3e-05):
        clock.now = stamp
        made.append(await new_session(client))
    async with client.get("/sessions", params={"limit": "1"}) as response:
        page = await response.json()
    seen = [session["id"] for session in page["sessions"]]
    while page["next_before"] is not None:
        assert "e" not in page["next_before"].partition("~")[0]
        async with client.get("/sessions", params={"limit": "1", "before": page["next_before"]}) as response:
            assert response.status == 200, await response.text()
            page = await response.json()
        seen += [session["id"] for session in page["sessions"]]
    assert seen == made[::-1]
