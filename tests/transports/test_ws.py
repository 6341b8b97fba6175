"""The WebSocket transport over real sockets: protocol, parity with SSE, bad input, slow readers."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import struct
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient

from service.core.events import TextDelta
from tests.conftest import ClientFactory, services_of, sse_events
from tests.support.sessions import new_session


async def receive(ws: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
    return await asyncio.wait_for(ws.receive_json(), 10)


async def until(ws: aiohttp.ClientWebSocketResponse, predicate: Any) -> list[dict[str, Any]]:
    """Frames up to and including the first one that satisfies ``predicate``."""
    frames = []
    while True:
        frame = await receive(ws)
        frames.append(frame)
        if predicate(frame):
            return frames


async def start_long_answer(ws: aiohttp.ClientWebSocketResponse, session_id: str) -> None:
    """Subscribe, start a long paced answer, and return once its text is flowing."""
    await ws.send_json({"type": "subscribe", "session_id": session_id})
    await until(ws, lambda f: f["type"] == "status_change")
    await ws.send_json(
        {"type": "message", "session_id": session_id, "content": "long [emu:tokens=2000] [emu:tps=50]"}
    )
    await until(ws, lambda f: f["type"] == "assistant_text")


def is_done(frame: dict[str, Any]) -> bool:
    return frame.get("type") == "done" and "id" in frame


async def test_ping_subscribe_message_and_events(client: TestClient) -> None:
    session_id = await new_session(client)
    async with client.ws_connect("/ws") as ws:
        await ws.send_json({"type": "ping"})
        assert await receive(ws) == {"type": "pong"}
        await ws.send_json({"type": "subscribe", "session_id": session_id})
        assert await receive(ws) == {"type": "subscribed", "session_id": session_id}
        assert await receive(ws) == {"session_id": session_id, "type": "status_change", "status": "idle"}
        await ws.send_json(
            {"type": "message", "session_id": session_id, "content": "What is the square root of 144?"}
        )
        frames = await until(ws, is_done)
        accepted = [f for f in frames if f["type"] == "accepted"]
        assert accepted and accepted[0]["session_id"] == session_id
        events = [f for f in frames if "id" in f]
        assert [f["id"] for f in events] == list(range(1, len(events) + 1))
        assert all(f["session_id"] == session_id for f in events)
        assert any(f["type"] == "tool_result" and f["result"] == "12" for f in events)
        # the subscription stays: a second query on the same socket is followed too
        await ws.send_json({"type": "message", "session_id": session_id, "content": "more [emu:tokens=3]"})
        second = [f for f in await until(ws, is_done) if "id" in f]
        assert second[0]["id"] == events[-1]["id"] + 1


@pytest.mark.slow
async def test_parity_between_sse_and_websocket(make_client: ClientFactory) -> None:
    client = await make_client(merge_deltas_after=100_000)
    session_id = await new_session(client)
    async with client.post(
        f"/sessions/{session_id}/messages", json={"content": "What is the square root of 144? [emu:tps=300]"}
    ):
        pass

    async def over_sse() -> list[dict[str, Any]]:
        async with client.get(f"/sessions/{session_id}/events", headers={"Last-Event-ID": "0"}) as response:
            return [dict(event["data"]) async for event in sse_events(response)]

    async def over_ws() -> list[dict[str, Any]]:
        async with client.ws_connect("/ws") as ws:
            await ws.send_json({"type": "subscribe", "session_id": session_id, "last_event_id": 0})
            frames = [f for f in await until(ws, is_done) if "id" in f]
        for frame in frames:
            assert frame.pop("session_id") == session_id
        return frames

    sse, ws = await asyncio.gather(over_sse(), over_ws())
    assert sse == ws
    assert [e["id"] for e in sse] == list(range(1, len(sse) + 1)) and sse[-1]["type"] == "done"


async def test_one_socket_follows_many_sessions_and_unsubscribes(client: TestClient) -> None:
    first, second = await new_session(client), await new_session(client)
    async with client.ws_connect("/ws") as ws:
        for session_id in (first, second):
            await ws.send_json({"type": "subscribe", "session_id": session_id})
            await until(ws, lambda f: f["type"] == "status_change")
        for session_id in (first, second):
            await ws.send_json(
                {"type": "message", "session_id": session_id, "content": "hello [emu:tokens=4]"}
            )
        frames = []
        while sum(1 for f in frames if is_done(f)) < 2:
            frames.append(await receive(ws))
        assert {f["session_id"] for f in frames if is_done(f)} == {first, second}
        await ws.send_json({"type": "unsubscribe", "session_id": first})
        assert await receive(ws) == {"type": "unsubscribed", "session_id": first}
        await ws.send_json({"type": "unsubscribe", "session_id": first})
        assert (await receive(ws))["code"] == "not_subscribed"


async def test_short_lived_run_over_websocket(client: TestClient) -> None:
    async with client.ws_connect("/ws") as ws:
        await ws.send_json({"type": "run", "message": "What is the square root of 144?", "max_turns": 3})
        subscribed = await receive(ws)
        assert subscribed["type"] == "subscribed"
        run_id = subscribed["session_id"]
        frames = await until(ws, is_done)
        events = [f for f in frames if "id" in f]
        assert all(f["session_id"] == run_id for f in events)
        assert events[-1]["turns"] == 2 and events[-1]["type"] == "done"
        assert (await receive(ws)) == {"type": "unsubscribed", "session_id": run_id, "reason": "ended"}
    services = services_of(client)
    await asyncio.wait_for(services.runs.wait_idle(), 5)
    assert await services.sessions.count() == 0


async def test_cancel_over_websocket(client: TestClient) -> None:
    session_id = await new_session(client)
    async with client.ws_connect("/ws") as ws:
        await start_long_answer(ws, session_id)
        await ws.send_json({"type": "cancel", "session_id": session_id})
        frames = await until(ws, is_done)
        assert frames[-1]["cancelled"] is True
        assert any(f["type"] == "status_change" and f.get("status") == "cancelled" for f in frames)


async def test_bad_messages_get_errors_and_the_socket_stays_open(client: TestClient) -> None:
    session_id = await new_session(client)
    cases = [
        ("{not json", "bad_json"),
        ("[1, 2]", "invalid"),
        (json.dumps({"no": "type"}), "unknown_type"),
        (json.dumps({"type": "dance"}), "unknown_type"),
        (json.dumps({"type": "subscribe"}), "invalid"),
        (json.dumps({"type": "subscribe", "session_id": 5}), "invalid"),
        (json.dumps({"type": "subscribe", "session_id": "nope"}), "not_found"),
        (json.dumps({"type": "subscribe", "session_id": session_id, "last_event_id": -1}), "invalid"),
        (json.dumps({"type": "subscribe", "session_id": session_id, "last_event_id": 99}), "invalid"),
        (json.dumps({"type": "message", "session_id": session_id}), "invalid"),
        (json.dumps({"type": "message", "session_id": session_id, "content": "  "}), "invalid"),
        (json.dumps({"type": "message", "session_id": "nope", "content": "x"}), "not_found"),
        (json.dumps({"type": "cancel"}), "invalid"),
        (json.dumps({"type": "run"}), "invalid"),
        (json.dumps({"type": "run", "message": "x", "max_turns": 0}), "invalid"),
        (json.dumps({"type": "unsubscribe", "session_id": session_id}), "not_subscribed"),
        (json.dumps({"type": "cancel", "session_id": session_id, "_meta": "00-trace"}), "invalid"),
    ]
    async with client.ws_connect("/ws") as ws:
        for text, code in cases:
            await ws.send_str(text)
            frame = await receive(ws)
            assert frame["type"] == "error" and frame["code"] == code, (text, frame)
            assert frame["error"]
        await ws.send_json({"type": "ping"})
        assert await receive(ws) == {"type": "pong"}
        await ws.send_bytes(b"\x00\x01")
        closed = await ws.receive()
        assert closed.type == aiohttp.WSMsgType.CLOSE and closed.data == 1003


async def test_oversized_message_closes_with_1009(make_client: ClientFactory) -> None:
    client = await make_client(ws_max_message_bytes=1024)
    async with client.ws_connect("/ws") as ws:
        await ws.send_str(json.dumps({"type": "ping", "pad": "x" * 4096}))
        closed = await ws.receive()
        assert closed.type == aiohttp.WSMsgType.CLOSE and closed.data == 1009


async def test_purged_resume_over_websocket(make_client: ClientFactory) -> None:
    client = await make_client(session_events_max_bytes=8192)
    session_id = await new_session(client)
    async with client.post(f"/sessions/{session_id}/messages", json={"content": "long [emu:tokens=60]"}):
        pass
    await services_of(client).runs.wait_idle()
    async with client.ws_connect("/ws") as ws:
        await ws.send_json({"type": "subscribe", "session_id": session_id, "last_event_id": 1})
        frame = await receive(ws)
        assert frame["code"] == "events_purged" and frame["oldest_id"] > 2 and "snapshot" in frame
        await ws.send_json({"type": "ping"})
        assert await receive(ws) == {"type": "pong"}


# -- a client that never reads -------------------------------------------------------------


def _client_frame(text: str) -> bytes:
    payload = text.encode()
    mask = os.urandom(4)
    header = bytes([0x81])
    if len(payload) < 126:
        header += bytes([0x80 | len(payload)])
    else:
        header += bytes([0x80 | 126]) + struct.pack("!H", len(payload))
    return header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def _server_frames(data: bytes) -> tuple[list[tuple[int, bytes]], bytes]:
    frames, offset = [], 0
    while len(data) - offset >= 2:
        opcode, length = data[offset] & 0x0F, data[offset + 1] & 0x7F
        head = 2
        if length == 126:
            if len(data) - offset < 4:
                break
            length, head = struct.unpack("!H", data[offset + 2 : offset + 4])[0], 4
        elif length == 127:
            if len(data) - offset < 10:
                break
            length, head = struct.unpack("!Q", data[offset + 2 : offset + 10])[0], 10
        if len(data) - offset < head + length:
            break
        frames.append((opcode, data[offset + head : offset + head + length]))
        offset += head + length
    return frames, data[offset:]


@pytest.mark.slow
@pytest.mark.timeout(180)  # 40,000 events through Redis in the suite's Redis pass take a while
async def test_a_client_that_never_reads_is_closed_and_resumes_with_nothing_lost(
    make_client: ClientFactory,
) -> None:
    # 40,000 events must all stay in the log for the resume (about 1.4 KB each as it counts them).
    client = await make_client(
        ws_send_queue=8,
        ws_send_timeout_s=0.3,
        merge_deltas_after=100_000,
        session_events_max_bytes=100 * 1024 * 1024,
        # The raw socket never answers a ping: on a slow machine the heartbeat's missing pong
        # would close the connection (1006, no close frame) before the outbox overflows.
        ws_heartbeat_s=3600,
    )
    services = services_of(client)
    session_id = await new_session(client)
    session = await services.sessions.get(session_id)
    # A raw socket with a tiny receive window, that subscribes and then reads nothing.
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, (client.host, client.port))
    key = base64.b64encode(os.urandom(16)).decode()
    handshake = (
        f"GET /ws HTTP/1.1\r\nHost: {client.host}:{client.port}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    await loop.sock_sendall(sock, handshake.encode())
    response = b""
    while b"\r\n\r\n" not in response:
        response += await loop.sock_recv(sock, 1)
    assert response.startswith(b"HTTP/1.1 101")
    await loop.sock_sendall(
        sock, _client_frame(json.dumps({"type": "subscribe", "session_id": session_id, "last_event_id": 0}))
    )
    await asyncio.wait_for(session.log.wait_subscribers(1), 10)
    # The model talks a lot while the client reads nothing.
    # (In bursts, as a run appends them: 40,000 round trips to a busy Redis could take minutes.)
    for start in range(0, 40_000, 100):
        await session.log.append_many([TextDelta(text=f"word{n} ") for n in range(start, start + 100)])
        await asyncio.sleep(0)  # let the server's writer run as it would between real events
    # The server gives up on this client: its subscription ends once the outbox stays full.
    await asyncio.wait_for(session.log.wait_subscribers(0), 10)
    # Now read everything the server did send: frames in order, then a close with 1013.
    data = b""
    while True:
        chunk = await loop.sock_recv(sock, 1 << 16)
        if not chunk:
            break
        data += chunk
    sock.close()
    frames, _ = _server_frames(data)
    close = [payload for opcode, payload in frames if opcode == 0x8]
    assert close and struct.unpack("!H", close[0][:2])[0] == 1013
    events = [json.loads(payload) for opcode, payload in frames if opcode == 0x1]
    ids = [e["id"] for e in events if "id" in e]
    assert ids == list(range(1, len(ids) + 1)) and len(ids) < 40_000
    # It resumes from the last id it saw and gets the rest, nothing lost, nothing twice.
    async with client.ws_connect("/ws") as ws:
        await ws.send_json({"type": "subscribe", "session_id": session_id, "last_event_id": ids[-1]})
        assert (await receive(ws))["type"] == "subscribed"
        rest = []
        while not rest or rest[-1] != 40_000:
            frame = await receive(ws)
            rest.append(frame["id"])
    assert ids + rest == list(range(1, 40_001))


async def test_shutdown_closes_sockets_with_1001_after_runs_end(client: TestClient) -> None:
    session_id = await new_session(client)
    async with client.ws_connect("/ws") as ws:
        await start_long_answer(ws, session_id)
        await client.server.app.shutdown()
        frames = []
        while True:
            message = await ws.receive()
            if message.type != aiohttp.WSMsgType.TEXT:
                break
            frames.append(json.loads(message.data))
        assert message.type == aiohttp.WSMsgType.CLOSE and message.data == 1001
    errors = [f for f in frames if f.get("type") == "error" and "id" in f]
    assert errors and errors[-1]["code"] == "shutdown"


@pytest.mark.slow
async def test_idle_socket_without_subscriptions_is_closed(make_client: ClientFactory) -> None:
    client = await make_client(ws_idle_timeout_s=0.2)
    session_id = await new_session(client)
    async with client.ws_connect("/ws") as ws:
        closed = await ws.receive()
        assert closed.type == aiohttp.WSMsgType.CLOSE and closed.data == 1001
    async with client.ws_connect("/ws") as ws:  # a subscribed socket is kept past the idle time
        await ws.send_json({"type": "subscribe", "session_id": session_id})
        await until(ws, lambda f: f["type"] == "status_change")
        await ws.send_json(
            {"type": "message", "session_id": session_id, "content": "later [emu:ttft=500] [emu:tokens=2]"}
        )
        frames = await until(ws, is_done)
        assert frames[-1]["type"] == "done"


@pytest.mark.slow
async def test_a_run_refused_as_overloaded_announces_no_subscription(make_client: ClientFactory) -> None:
    client = await make_client(max_concurrent_runs=1)
    sessions = services_of(client).sessions
    async with client.post("/agent/stream", json={"message": "long [emu:tokens=2000] [emu:tps=50]"}) as busy:
        await anext(sse_events(busy))  # the one slot is taken
        held = await sessions.count()
        async with client.ws_connect("/ws") as ws:
            await ws.send_json({"type": "run", "message": "second"})
            refusal = await receive(ws)  # no `subscribed` first: nothing to wait on
            assert refusal["type"] == "error" and refusal["code"] == "overloaded", refusal
            assert "session_id" not in refusal and refusal["request_type"] == "run"
            await ws.send_json({"type": "ping"})
            assert (await receive(ws))["type"] == "pong"
            assert await sessions.count() == held  # its short-lived session is gone again
        busy.close()
