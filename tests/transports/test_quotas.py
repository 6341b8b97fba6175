"""Per-key quotas and request limits over real HTTP and WebSocket.

Quotas: open streams, running queries, requests per minute, model tokens per day; each refused
with a 429 (``Retry-After`` and a JSON body) or, on a WebSocket, an error frame after which the
socket goes on; each freed again (a stream that closes, a run that ends, the clock that moves);
one key's exhaustion leaves the others alone. Limits: body size (413), header size (400),
WebSocket frames that inflate past the message limit.

Nothing here sleeps: a test waits on the quotas themselves (:meth:`Quotas.wait_until`) and moves
their injected clock instead of waiting for a minute or a day to pass.
"""

from __future__ import annotations

import asyncio
import json
import zlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from service.app import create_app, server_options
from service.config import Settings, SettingsError, load_settings
from service.core.events import Usage
from service.core.runs import RunManager
from service.core.sessions import MemorySessionStore, Session
from service.errors import QuotaExceeded, StoreUnavailable
from service.quotas.local import Quotas
from service.transports.edge.auth import fingerprint
from tests.conftest import TEST_SETTINGS, ClientFactory, services_of, sse_events, test_tools
from tests.core.test_runs import ScriptedAgent
from tests.support.sessions import new_session
from tests.transports.test_mcp import RawMcp

KEYS = ["key-a", "key-b"]
A = {"Authorization": "Bearer key-a"}
B = {"Authorization": "Bearer key-b"}
OWNER_A, OWNER_B = fingerprint("key-a"), fingerprint("key-b")
ANONYMOUS = ""
ORIGIN = "https://app.example"
WAIT_S = 10.0
DAY = 86_400
# A paced answer that runs for about 40 s unless it is cancelled.
LONG = "A long story [emu:tokens=2000] [emu:tps=50]"
SHORT = "hi [emu:tokens=2]"


class Clock:
    """A clock a test moves by hand (epoch seconds)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def quotas_of(client: TestClient) -> Quotas:
    return services_of(client).quotas


async def settled(quotas: Quotas, predicate: Callable[[], bool]) -> None:
    """Wait (bounded) until ``predicate`` holds; it is tried each time a slot is freed."""
    await asyncio.wait_for(quotas.wait_until(predicate), WAIT_S)


async def refused(
    response: aiohttp.ClientResponse, quota: str, limit: int, retry_after: int | None = None
) -> dict[str, Any]:
    """Assert a quota's 429: ``Retry-After`` in whole seconds, and the JSON body that says which."""
    assert response.status == 429, await response.text()
    body = await response.json()
    assert body["code"] == "quota_exceeded" and body["quota"] == quota and body["limit"] == limit, body
    assert isinstance(body["error"], str) and body["error"]
    assert response.headers["Retry-After"] == str(body["retry_after"]) and body["retry_after"] >= 1
    if retry_after is not None:
        assert body["retry_after"] == retry_after, body
    return body


def refused_frame(frame: dict[str, Any], quota: str, limit: int, **fields: Any) -> None:
    """Assert a quota's WebSocket error frame."""
    assert frame["type"] == "error" and frame["code"] == "quota_exceeded", frame
    assert frame["quota"] == quota and frame["limit"] == limit and frame["retry_after"] >= 1, frame
    assert frame["error"]
    for name, value in fields.items():
        assert frame[name] == value, (name, frame)


async def receive(ws: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
    return await asyncio.wait_for(ws.receive_json(), WAIT_S)


async def still_usable(ws: aiohttp.ClientWebSocketResponse) -> None:
    await ws.send_json({"type": "ping"})
    assert await receive(ws) == {"type": "pong"}


async def running_session(client: TestClient, headers: dict[str, str] | None = None) -> str:
    """A session running ``LONG``."""
    session_id = await new_session(client, headers)
    async with client.post(f"/sessions/{session_id}/messages", json={"content": LONG}, headers=headers) as r:
        assert r.status == 202, await r.text()
    return session_id


async def untouched(client: TestClient, session_id: str, headers: dict[str, str] | None = None) -> None:
    """The session is idle and its log empty: a refused request started nothing."""
    async with client.get(f"/sessions/{session_id}", headers=headers) as response:
        body = await response.json()
    assert body["status"] == "idle" and body["last_event_id"] == 0, body


async def agent_run(client: TestClient, headers: dict[str, str] | None = None, message: str = SHORT) -> Any:
    async with client.post("/agent/run", json={"message": message}, headers=headers) as response:
        assert response.status == 200, await response.text()
        return await response.json()


# --- settings -----------------------------------------------------------------------------


def test_settings_defaults_and_validation() -> None:
    defaults = {name: field.default for name, field in Settings.model_fields.items()}
    assert (defaults["quota_streams"], defaults["quota_runs"]) == (32, 8)
    assert (defaults["quota_requests_per_minute"], defaults["quota_tokens_per_day"]) == (600, 2_000_000)
    assert defaults["max_header_bytes"] == 8190
    unlimited = Settings(quota_streams=0, quota_runs=0, quota_requests_per_minute=0, quota_tokens_per_day=0)
    assert Quotas.from_settings(unlimited).streams == 0
    for name in ("quota_streams", "quota_runs", "quota_requests_per_minute", "quota_tokens_per_day"):
        with pytest.raises(SettingsError, match=f"AGENT_{name.upper()}"):
            load_settings(**{name: -1})
    with pytest.raises(SettingsError, match="AGENT_MAX_HEADER_BYTES"):
        load_settings(max_header_bytes=100)


# --- the quota class alone ----------------------------------------------------------------


def test_the_minute_slides_by_the_second() -> None:
    clock = Clock(1_000.25)
    quotas = Quotas(requests_per_minute=3, clock=clock)
    quotas.check_request("x")  # second 1000
    clock.now = 1_010.5
    quotas.check_request("x")  # second 1010
    quotas.check_request("x")
    with pytest.raises(QuotaExceeded) as caught:
        quotas.check_request("x")
    # The request of second 1000 leaves the window at 1060.
    assert caught.value.quota == "requests_per_minute" and caught.value.limit == 3
    assert caught.value.retry_after == 50
    quotas.check_request("y")  # another owner counts apart
    clock.now = 1_060.0
    quotas.check_request("x")
    with pytest.raises(QuotaExceeded) as caught:
        quotas.check_request("x")
    assert caught.value.retry_after == 10  # both of second 1010 leave at 1070
    clock.now = 1_070.0
    quotas.check_request("x")
    quotas.check_request("x")
    # Refused attempts were not counted: the window holds 3 (1060, 1070, 1070).
    with pytest.raises(QuotaExceeded):
        quotas.check_request("x")


def test_tokens_count_per_utc_day_and_concurrency_slots_are_given_back() -> None:
    clock = Clock(DAY * 100 + 3_600)  # 01:00 UTC
    quotas = Quotas(runs=2, streams=1, tokens_per_day=100, clock=clock)
    quotas.admit("x")
    quotas.used("x", Usage(input_tokens=60, output_tokens=30, total_tokens=90))
    quotas.admit("x")  # 90 < 100: still admitted, and it may go past the limit
    with pytest.raises(QuotaExceeded) as caught:
        quotas.admit("x")
    assert caught.value.quota == "runs" and caught.value.retry_after == 1
    quotas.used("x", Usage(input_tokens=5, output_tokens=5, total_tokens=10))
    quotas.release("x")
    assert quotas.running("x") == 1 and quotas.tokens_today("x") == 100
    with pytest.raises(QuotaExceeded) as caught:
        quotas.admit("x")
    assert caught.value.quota == "tokens_per_day" and caught.value.retry_after == DAY - 3_600
    quotas.admit("y")
    clock.now = DAY * 101  # midnight UTC
    assert quotas.tokens_today("x") == 0
    quotas.admit("x")
    with quotas.stream("x"):
        with pytest.raises(QuotaExceeded) as caught, quotas.stream("x"):
            pass
        assert caught.value.quota == "streams"
        assert quotas.open_streams("x") == 1
    assert quotas.open_streams("x") == 0


class RecordingGate:
    """A run gate that refuses when told to and records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, int]] = []
        self.refuse = False

    def admit(self, owner: str) -> None:
        if self.refuse:
            raise QuotaExceeded("no", quota="runs", limit=0, retry_after=1)
        self.calls.append(("admit", owner, 0))

    def used(self, owner: str, usage: Usage) -> None:
        self.calls.append(("used", owner, usage.input_tokens + usage.output_tokens))

    def release(self, owner: str) -> None:
        self.calls.append(("release", owner, 0))


class FailingClaims(MemorySessionStore):
    async def claim_run(self, session: Session, run_id: str) -> str | None:
        raise StoreUnavailable("down")


async def test_the_run_manager_releases_each_admitted_run_once() -> None:
    gate = RecordingGate()
    store = MemorySessionStore()
    runs = RunManager(ScriptedAgent(), store=store, gate=gate)
    session = await store.create(owner="o")
    await (await runs.start(session, "hi")).wait()  # ends by itself
    held = ScriptedAgent(asyncio.Event())
    runs = RunManager(held, store=store, gate=gate)
    await runs.start(session, "hi")
    await held.started.wait()
    assert await runs.cancel(session.id)  # cancelled
    assert gate.calls == [("admit", "o", 0), ("used", "o", 4), ("release", "o", 0)] * 2
    gate.calls.clear()
    failing = FailingClaims()
    runs = RunManager(ScriptedAgent(), store=failing, gate=gate)
    with pytest.raises(StoreUnavailable):  # admitted, then the claim failed: released
        await runs.start(await failing.create(owner="o"), "hi")
    assert gate.calls == [("admit", "o", 0), ("release", "o", 0)] and runs.active == 0
    gate.calls.clear()
    gate.refuse = True
    with pytest.raises(QuotaExceeded):  # refused: nothing runs, nothing is logged
        await runs.start(session, "hi")
    assert gate.calls == [] and runs.active == 0 and session.status == "idle"


# --- streams ------------------------------------------------------------------------------


async def test_concurrent_streams_per_key(make_client: ClientFactory) -> None:
    client = await make_client(api_keys=KEYS, quota_streams=2)
    quotas = quotas_of(client)
    session_id = await running_session(client, A)
    idle = await new_session(client, A)
    first = await client.get(f"/sessions/{session_id}/events", headers=A)
    second = await client.get(f"/sessions/{session_id}/events", headers=A)
    try:
        assert first.status == second.status == 200
        assert quotas.open_streams(OWNER_A) == 2
        # Every kind of stream is refused, before it starts anything.
        for method, path, body in [
            ("GET", f"/sessions/{session_id}/events", None),
            ("POST", "/agent/stream", {"message": SHORT}),
            ("GET", f"/sessions/{idle}/stream?query=hi", None),
            ("GET", "/ws", None),
        ]:
            async with client.request(method, path, json=body, headers=A) as response:
                await refused(response, "streams", 2, retry_after=1)
        with pytest.raises(aiohttp.WSServerHandshakeError) as handshake:
            await client.ws_connect("/ws", headers=A)
        assert handshake.value.status == 429 and handshake.value.headers["Retry-After"] == "1"
        await untouched(client, idle, A)
        assert quotas.open_streams(OWNER_A) == 2 and services_of(client).runs.active == 1
        # Another key streams as usual.
        async with client.post("/agent/stream", json={"message": SHORT}, headers=B) as response:
            assert response.status == 200
            assert [event["data"] async for event in sse_events(response)][-1]["type"] == "done"
        # A client that leaves frees its slot.
        first.close()
        await settled(quotas, lambda: quotas.open_streams(OWNER_A) == 1)
        third = await client.get(f"/sessions/{session_id}/events", headers=A)
        assert third.status == 200
        # The query's end ends the streams that follow it, and frees their slots.
        async with client.post(f"/sessions/{session_id}/cancel", headers=A) as response:
            assert response.status == 202
        for response in (second, third):
            assert [event["event"] async for event in sse_events(response)][-1] == "done"
        await settled(quotas, lambda: quotas.open_streams(OWNER_A) == 0)
    finally:
        for response in (first, second):
            response.close()
    async with client.get(f"/sessions/{idle}/stream?query=hi", headers=A) as response:
        assert response.status == 200
        assert [event["data"]["type"] async for event in sse_events(response)][-1] == "done"


async def test_a_websocket_holds_a_stream_slot_until_it_closes(make_client: ClientFactory) -> None:
    client = await make_client(quota_streams=1)
    quotas = quotas_of(client)
    async with client.ws_connect("/ws") as ws:
        await still_usable(ws)
        assert quotas.open_streams(ANONYMOUS) == 1
        with pytest.raises(aiohttp.WSServerHandshakeError) as handshake:
            await client.ws_connect("/ws")
        assert handshake.value.status == 429
        async with client.post("/agent/stream", json={"message": SHORT}) as response:
            await refused(response, "streams", 1)
        await still_usable(ws)
    await settled(quotas, lambda: quotas.open_streams(ANONYMOUS) == 0)
    async with client.ws_connect("/ws") as ws:
        await still_usable(ws)


async def test_an_mcp_stream_is_a_stream_and_mcp_queries_are_runs(make_client: ClientFactory) -> None:
    client = await make_client(quota_streams=1, quota_runs=1)
    raw = await RawMcp(client).start()
    async with raw.stream() as stream:
        assert stream.status == 200
        async with client.post("/agent/stream", json={"message": SHORT}) as response:
            await refused(response, "streams", 1)
        first = await raw.tool("session_message", content=LONG)
        result = await raw.post("tools/call", {"name": "session_message", "arguments": {"content": SHORT}})
        assert result["isError"] is True
        fields = result["structuredContent"]
        assert fields["code"] == "quota_exceeded" and fields["quota"] == "runs" and fields["limit"] == 1
        await raw.tool("session_cancel", session_id=first["session_id"])
        assert quotas_of(client).running(ANONYMOUS) == 0
        await raw.tool("session_message", content=SHORT)


# --- runs ---------------------------------------------------------------------------------


@pytest.mark.slow
async def test_concurrent_runs_per_key(make_client: ClientFactory) -> None:
    client = await make_client(api_keys=KEYS, quota_runs=1)
    quotas = quotas_of(client)
    busy = await running_session(client, A)
    idle = await new_session(client, A)
    assert quotas.running(OWNER_A) == 1
    # Every way of starting a query is refused, and starts nothing.
    for method, path, body in [
        ("POST", f"/sessions/{idle}/messages", {"content": SHORT}),
        ("POST", "/agent/run", {"message": SHORT}),
        ("POST", "/agent/stream", {"message": SHORT}),
        ("GET", f"/sessions/{idle}/stream?query=hi", None),
    ]:
        async with client.request(method, path, json=body, headers=A) as response:
            await refused(response, "runs", 1, retry_after=1)
    await untouched(client, idle, A)
    assert quotas.running(OWNER_A) == 1 and quotas.open_streams(OWNER_A) == 0
    # Over WebSocket: an error frame, and the socket goes on.
    async with client.ws_connect("/ws", headers=A) as ws:
        await ws.send_json({"type": "message", "session_id": idle, "content": SHORT})
        refused_frame(await receive(ws), "runs", 1, request_type="message", session_id=idle)
        await ws.send_json({"type": "run", "message": SHORT})
        # Refused before any subscription is announced (nothing left for the client to wait on).
        refused_frame(await receive(ws), "runs", 1, request_type="run")
        await still_usable(ws)
    # Another key runs meanwhile.
    assert (await agent_run(client, B))["usage"]["total_tokens"] > 0
    # The run's end frees its slot: once cancel answers, the query has ended.
    async with client.post(f"/sessions/{busy}/cancel", headers=A) as response:
        assert response.status == 202
    assert quotas.running(OWNER_A) == 0
    # A query that ends by itself frees it too, before its `done` is seen.
    await agent_run(client, A)
    await agent_run(client, A)
    async with client.post(f"/sessions/{idle}/messages", json={"content": SHORT}, headers=A) as response:
        assert response.status == 202


# --- requests per minute ------------------------------------------------------------------


async def test_requests_per_minute_slide_with_the_clock(make_client: ClientFactory) -> None:
    client = await make_client(api_keys=KEYS, quota_requests_per_minute=3, allowed_origins=[ORIGIN])
    quotas = quotas_of(client)
    clock = quotas.clock = Clock(1_000_000.5)
    session_id = await new_session(client, A)  # one request at second 1_000_000
    clock.now += 20
    for _ in range(2):
        async with client.get(f"/sessions/{session_id}", headers=A) as response:
            assert response.status == 200
    async with client.get(f"/sessions/{session_id}", headers={**A, "Origin": ORIGIN}) as response:
        await refused(response, "requests_per_minute", 3, retry_after=40)
        # A browser page on another origin may read the 429 and its Retry-After.
        assert response.headers["Access-Control-Allow-Origin"] == ORIGIN
        assert "Retry-After" in response.headers["Access-Control-Expose-Headers"]
    for path in ("/healthz", "/"):  # what needs no key is not counted
        async with client.get(path, headers=A) as response:
            assert response.status == 200
        async with client.get(path) as response:
            assert response.status == 200
    await new_session(client, B)  # another key counts apart
    clock.now = 1_000_060.0  # the first request has left the window
    async with client.get(f"/sessions/{session_id}", headers=A) as response:
        assert response.status == 200
    async with client.post("/agent/run", json={"message": SHORT}, headers=A) as response:
        await refused(response, "requests_per_minute", 3, retry_after=20)
    clock.now = 1_000_080.0
    await agent_run(client, A)


async def test_websocket_messages_count_as_requests(make_client: ClientFactory) -> None:
    client = await make_client(quota_requests_per_minute=3)
    quotas = quotas_of(client)
    clock = quotas.clock = Clock(2_000_000.0)
    async with client.ws_connect("/ws") as ws:  # the upgrade is a request
        for _ in range(2):
            await ws.send_json({"type": "unsubscribe", "session_id": "x"})
            assert (await receive(ws))["code"] == "not_subscribed"
        await ws.send_json({"type": "unsubscribe", "session_id": "x"})
        refused_frame(await receive(ws), "requests_per_minute", 3, request_type="unsubscribe", retry_after=60)
        await still_usable(ws)  # pings are not counted
        await ws.send_json({"type": "run", "message": SHORT})
        refused_frame(await receive(ws), "requests_per_minute", 3, request_type="run")
        clock.now += 60
        await ws.send_json({"type": "unsubscribe", "session_id": "x"})
        assert (await receive(ws))["code"] == "not_subscribed"


async def test_one_key_at_its_limits_leaves_the_other_alone(make_client: ClientFactory) -> None:
    client = await make_client(
        api_keys=KEYS, quota_requests_per_minute=4, quota_streams=1, quota_runs=1, quota_tokens_per_day=1
    )
    quotas = quotas_of(client)
    quotas.clock = Clock(3_000_000.0)
    async with client.post("/auth/token", headers=A) as response:  # request 1
        token = (await response.json())["token"]
    await agent_run(client, A)  # 2: spends the day's tokens
    async with client.post("/agent/run", json={"message": SHORT}, headers=A) as response:  # 3
        await refused(response, "tokens_per_day", 1)
    await new_session(client, A)  # 4
    async with client.post("/sessions", json={}, headers=A) as response:
        await refused(response, "requests_per_minute", 4)
    # A's browser token is A, and is refused the same.
    async with client.post(f"/sessions?token={token}", json={}) as response:
        await refused(response, "requests_per_minute", 4)
    # B does what A no longer may: requests, a stream, a query, tokens.
    await new_session(client, B)
    async with client.post("/agent/stream", json={"message": SHORT}, headers=B) as response:
        assert response.status == 200
        assert [event["data"] async for event in sse_events(response)][-1]["type"] == "done"
    assert quotas.tokens_today(OWNER_B) > 1 and quotas.tokens_today(OWNER_A) > 1


# --- tokens per day -----------------------------------------------------------------------


async def test_model_tokens_per_day(make_client: ClientFactory) -> None:
    client = await make_client(api_keys=KEYS, quota_tokens_per_day=1)
    quotas = quotas_of(client)
    clock = quotas.clock = Clock(DAY * 20_000 + 10 * 3_600)  # 10:00 UTC
    # Under the limit a query starts, and runs to its end past it (two turns: the calculator).
    answer = await agent_run(client, A, "What is 6 * 7?")
    assert answer["turns"] == 2
    usage = answer["usage"]
    assert quotas.tokens_today(OWNER_A) == usage["input_tokens"] + usage["output_tokens"] > 1
    # Then every query is refused until midnight UTC.
    async with client.post("/agent/run", json={"message": SHORT}, headers=A) as response:
        await refused(response, "tokens_per_day", 1, retry_after=14 * 3_600)
    session_id = await new_session(client, A)
    async with client.post(
        f"/sessions/{session_id}/messages", json={"content": SHORT}, headers=A
    ) as response:
        await refused(response, "tokens_per_day", 1)
    await untouched(client, session_id, A)
    async with client.ws_connect("/ws", headers=A) as ws:
        await ws.send_json({"type": "message", "session_id": session_id, "content": SHORT})
        refused_frame(await receive(ws), "tokens_per_day", 1, session_id=session_id, retry_after=14 * 3_600)
        await still_usable(ws)
    # Reading what there is still works, and another key still runs.
    async with client.get(f"/sessions/{session_id}", headers=A) as response:
        assert response.status == 200
    await agent_run(client, B)
    # A new day, a new allowance.
    clock.now += 14 * 3_600
    assert quotas.tokens_today(OWNER_A) == 0
    again = await agent_run(client, A)
    assert quotas.tokens_today(OWNER_A) == again["usage"]["input_tokens"] + again["usage"]["output_tokens"]


# --- request limits -----------------------------------------------------------------------


@pytest.mark.slow
async def test_a_body_over_the_limit_is_413(make_client: ClientFactory) -> None:
    client = await make_client(max_request_bytes=4096)
    session_id = await new_session(client)
    big = json.dumps({"content": "x" * 10_000}).encode()

    async def chunked() -> AsyncIterator[bytes]:
        for start in range(0, len(big), 1024):
            yield big[start : start + 1024]

    for path in (f"/sessions/{session_id}/messages", "/sessions"):
        for data in (big, chunked()):  # with a Content-Length, and without one
            headers = {"Content-Type": "application/json"}
            async with client.post(path, data=data, headers=headers) as response:
                assert response.status == 413, await response.text()
                assert "too large" in (await response.json())["error"]
    await untouched(client, session_id)


@pytest.fixture
async def header_limited(aiohttp_client: Any) -> Callable[..., Any]:
    """The service on the aiohttp server options ``python -m service`` uses."""

    async def make(**overrides: Any) -> TestClient:
        settings = Settings(**{**TEST_SETTINGS, **overrides})
        server = TestServer(create_app(settings, tools=test_tools()))
        # Started here: TestServer passes only start_server's arguments on to aiohttp.
        await server.start_server(**server_options(settings))
        return await aiohttp_client(server)

    return make


async def test_oversized_headers_get_a_400_not_a_500(header_limited: Callable[..., Any]) -> None:
    client = await header_limited(max_header_bytes=2048)
    async with client.get("/healthz", headers={"X-Pad": "x" * 1500}) as response:
        assert response.status == 200
    for path, headers in [
        ("/healthz", {"X-Pad": "x" * 3000}),  # one header
        ("/healthz?pad=" + "x" * 3000, {}),  # the request line
        ("/healthz", {f"X-Pad-{n}": "x" for n in range(200)}),  # too many headers
    ]:
        async with client.get(path, headers=headers) as response:
            assert response.status == 400
            text = await response.text()
            assert "2048 bytes" in text or "Too many headers" in text, text
    async with client.get("/healthz") as response:
        assert response.status == 200  # the service goes on
    roomy = await header_limited(max_header_bytes=16_384)
    async with roomy.get("/healthz", headers={"X-Pad": "x" * 12_000}) as response:
        assert response.status == 200


# --- WebSocket frames ---------------------------------------------------------------------

# 1 MiB of one character deflates to about a kilobyte: far under any frame limit on the wire.
BOMB = json.dumps({"type": "ping", "pad": "0" * (1 << 20)})


def test_the_bomb_is_small_on_the_wire() -> None:
    compressor = zlib.compressobj(wbits=-15)
    assert len(compressor.compress(BOMB.encode()) + compressor.flush()) < 4096


async def test_a_compressed_frame_is_refused_unless_negotiated(make_client: ClientFactory) -> None:
    client = await make_client(ws_max_message_bytes=65_536)
    async with client.ws_connect("/ws", compress=15) as ws:
        assert ws.compress == 0  # the service does not take up permessage-deflate
        await still_usable(ws)
        await ws.send_str(BOMB, compress=15)  # deflated (RSV1) all the same
        closed = await asyncio.wait_for(ws.receive(), WAIT_S)
        # A protocol error, refused before anything is inflated.
        assert closed.type == aiohttp.WSMsgType.CLOSE and closed.data == aiohttp.WSCloseCode.PROTOCOL_ERROR


async def test_a_negotiated_frame_that_inflates_past_the_limit_closes_with_1009(
    make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Were compression ever turned on, the message limit would hold for the inflated size."""
    plain = web.WebSocketResponse

    def with_compression(**kwargs: Any) -> web.WebSocketResponse:
        return plain(**{**kwargs, "compress": True})

    monkeypatch.setattr(web, "WebSocketResponse", with_compression)
    client = await make_client(ws_max_message_bytes=65_536)
    async with client.ws_connect("/ws", compress=15) as ws:
        assert ws.compress == 15
        await still_usable(ws)
        await ws.send_str(BOMB)
        closed = await asyncio.wait_for(ws.receive(), WAIT_S)
        assert closed.type == aiohttp.WSMsgType.CLOSE and closed.data == aiohttp.WSCloseCode.MESSAGE_TOO_BIG


# --- sessions per key, and no per-key quotas for the anonymous owner -----------------------


async def test_one_key_cannot_fill_the_session_cap_for_everyone(make_client: ClientFactory) -> None:
    client = await make_client(api_keys=KEYS, quota_sessions=3, max_sessions=5)
    mine = [await new_session(client, A) for _ in range(3)]
    async with client.post("/sessions", json={}, headers=A) as response:
        await refused(response, "sessions", 3)
    # The other key still gets sessions: A's quota keeps it from the global cap.
    await new_session(client, B)
    # Deleting one gives the slot back.
    async with client.delete(f"/sessions/{mine[0]}", headers=A) as response:
        assert response.status == 204
    await new_session(client, A)
    # Short-lived sessions (a stream's own) do not count against it.
    async with client.post("/agent/stream", json={"message": SHORT}, headers=A) as response:
        assert response.status == 200
        assert [event["data"]["type"] async for event in sse_events(response)][-1] == "done"


def test_per_key_quotas_apply_to_the_anonymous_owner_only_when_set() -> None:
    default = Quotas.from_settings(Settings())
    assert (default.streams, default.runs, default.requests_per_minute, default.tokens_per_day) == (
        0,
        0,
        0,
        0,
    )
    assert default.max_streams == Settings().max_streams >= 1000
    assert Settings().quota("sessions") == 0 and Settings(api_keys=["k"]).quota("sessions") == 100
    keyed = Quotas.from_settings(Settings(api_keys=["k"]))
    assert (keyed.streams, keyed.runs) == (32, 8)
    assert Quotas.from_settings(Settings(quota_streams=2)).streams == 2  # set on purpose: applies


async def test_instance_wide_stream_bound_is_a_503(make_client: ClientFactory) -> None:
    client = await make_client(max_streams=1)
    async with client.ws_connect("/ws") as ws:
        await still_usable(ws)
        async with client.post("/agent/stream", json={"message": SHORT}) as response:
            assert response.status == 503 and response.headers["Retry-After"] == "1"
            assert "open streams" in (await response.json())["error"]
    await settled(quotas_of(client), lambda: quotas_of(client).total_streams == 0)
    async with client.post("/agent/stream", json={"message": SHORT}) as response:
        assert response.status == 200


@pytest.fixture
async def default_service(aiohttp_client: Any) -> TestClient:
    """The service as ``python -m service`` starts it: default settings, no keys (a paced emulator)."""
    return await aiohttp_client(create_app(Settings()))


@pytest.mark.slow
async def test_a_default_service_serves_a_hundred_anonymous_viewers(default_service: TestClient) -> None:
    client = default_service
    session_id = await new_session(client, {})
    async with client.post(f"/sessions/{session_id}/messages", json={"content": LONG}) as response:
        after = (await response.json())["after_id"]
    viewers = []
    try:
        for _ in range(100):
            response = await client.get(f"/sessions/{session_id}/events", params={"last_event_id": after})
            assert response.status == 200, await response.text()
            viewers.append(response)
        events = [sse_events(viewer) for viewer in viewers]
        for stream in events:
            await anext(stream)  # each of the hundred is open and reading
        assert quotas_of(client).total_streams == 100
        async with client.post(f"/sessions/{session_id}/cancel") as response:
            assert response.status == 202
        for stream in events:
            last = [event async for event in stream][-1]
            assert last["event"] == "done", last
    finally:
        for viewer in viewers:
            viewer.close()


@pytest.mark.slow
async def test_a_default_service_runs_a_dozen_anonymous_queries_at_once(default_service: TestClient) -> None:
    client = default_service

    async def one() -> str:
        async with client.post(
            "/agent/stream", json={"message": "hi [emu:tokens=40] [emu:tps=20]"}
        ) as response:
            assert response.status == 200, await response.text()
            return [event["data"]["type"] async for event in sse_events(response)][-1]

    assert await asyncio.gather(*(one() for _ in range(12))) == ["done"] * 12
