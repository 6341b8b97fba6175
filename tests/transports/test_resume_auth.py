"""Resuming is authorised and validated like live delivery.

A resume (SSE ``Last-Event-ID`` or ``?last_event_id=``, WebSocket ``last_event_id``, MCP
``Last-Event-ID``) or a poll on another key's session, an unknown id, an id from the future or a
malformed one gets a clear error and never a foreign or partial replay; what the service emits as
ids and ``retry:`` values is digits (or, on the MCP stream, ``<session id>:<digits>``).
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from tests.conftest import ClientFactory
from tests.transports.test_mcp import RawMcp, read_messages

ALICE = {"Authorization": "Bearer key-alice"}
BOB = {"Authorization": "Bearer key-bob"}


@pytest.fixture
async def secured(make_client: ClientFactory) -> TestClient:
    return await make_client(api_keys=["key-alice", "key-bob"])


async def finished_session(client: TestClient, headers: dict[str, str]) -> tuple[str, int]:
    """A session of ``headers``' key holding one finished query; its id and last event id."""
    session_id = (await (await client.post("/sessions", json={}, headers=headers)).json())["id"]
    response = await client.post(f"/sessions/{session_id}/messages", json={"content": "hi"}, headers=headers)
    assert response.status == 202
    async with asyncio.timeout(10):
        while True:
            state = await (await client.get(f"/sessions/{session_id}", headers=headers)).json()
            if state["status"] == "idle":
                return session_id, state["last_event_id"]
            await asyncio.sleep(0.01)  # a client's polling pace; the loop ends on the state it reads


async def test_another_keys_session_is_not_found_however_it_is_resumed(secured: TestClient) -> None:
    session_id, last = await finished_session(secured, ALICE)
    for headers, query in [
        ({**BOB, "Last-Event-ID": "0"}, ""),
        ({**BOB, "Last-Event-ID": str(last - 1)}, ""),
        (BOB, "?last_event_id=0"),
    ]:
        async with secured.get(f"/sessions/{session_id}/events{query}", headers=headers) as response:
            assert response.status == 404
            assert await response.json() == {"error": "Session not found"}
    async with secured.get(f"/sessions/{session_id}/events/poll?since_index=0", headers=BOB) as response:
        assert response.status == 404 and await response.json() == {"error": "Session not found"}
    async with secured.ws_connect("/ws", headers=BOB) as ws:
        await ws.send_json({"type": "subscribe", "session_id": session_id, "last_event_id": 0})
        frame = await ws.receive_json()
        assert frame["type"] == "error" and frame["code"] == "not_found" and "id" not in frame
        await ws.send_json({"type": "ping"})
        assert (await ws.receive_json())["type"] == "pong"  # nothing of Alice's came in between
    # Over MCP: Bob's stream never carries Alice's session, whatever his Last-Event-ID names.
    bob = await RawMcp(secured, BOB).start()
    assert (
        await bob.post("tools/call", {"name": "session_events", "arguments": {"session_id": session_id}})
    )["isError"]
    async with bob.stream(f"{session_id}:0") as response:
        assert response.status == 200
        mine = (await bob.tool("session_message", content="bob's own"))["session_id"]
        _, message = await anext(read_messages(response))
        assert message["params"]["data"]["session_id"] == mine


@pytest.mark.slow
@pytest.mark.parametrize(
    "value",
    [
        "99",  # from the future
        "9" * 30,  # a huge number, still from the future
        "9" * 5000,  # too long to be a number at all
        "-1",
        "abc",
        "1.5",
        "0x10",
        "１２",  # full-width digits
    ],
)
async def test_bad_last_event_ids_are_refused_clearly(client: TestClient, value: str) -> None:
    session_id, _ = await finished_session(client, {})
    async with client.get(f"/sessions/{session_id}/events", headers={"Last-Event-ID": value}) as response:
        assert response.status == 400
        body = await response.json()
        assert isinstance(body["error"], str) and "Last-Event-ID" in body["error"]
    async with client.get(f"/sessions/{session_id}/events", params={"last_event_id": value}) as response:
        assert response.status == 400 and "last" in (await response.json())["error"].lower()
    async with client.get(f"/sessions/{session_id}/events/poll", params={"since_index": value}) as response:
        assert response.status == 400 and "since_index" in (await response.json())["error"]


@pytest.mark.slow
@pytest.mark.parametrize("value", ["1\x00", "1\r\n2", "1\n", "\x00"])
async def test_control_characters_in_a_resume_id_are_refused(client: TestClient, value: str) -> None:
    session_id, _ = await finished_session(client, {})
    for params in ({"last_event_id": value}, {"since_index": value}):
        path = "events" if "last_event_id" in params else "events/poll"
        async with client.get(f"/sessions/{session_id}/{path}", params=params) as response:
            assert response.status == 400
            assert isinstance((await response.json())["error"], str)


async def raw_request(client: TestClient, head: bytes) -> tuple[int, bytes]:
    """Send a hand-written request (headers a client library would refuse to send)."""
    reader, writer = await asyncio.open_connection(client.host, client.port)
    writer.write(head)
    await writer.drain()
    data = await reader.read(65536)
    writer.close()
    status = int(data.split(b" ", 2)[1])
    return status, data


@pytest.mark.slow
@pytest.mark.parametrize("value", [b"1\x00", b"1\r2", b"\x001"])
async def test_control_characters_in_the_header_never_reach_a_replay(
    client: TestClient, value: bytes
) -> None:
    session_id, _ = await finished_session(client, {})
    head = (
        f"GET /sessions/{session_id}/events HTTP/1.1\r\nHost: {client.host}\r\n".encode()
        + b"Last-Event-ID: "
        + value
        + b"\r\nConnection: close\r\n\r\n"
    )
    status, data = await raw_request(client, head)
    assert status == 400  # refused by the HTTP parser or by the route, never a stream
    assert b"text/event-stream" not in data


@pytest.mark.slow
async def test_websocket_resume_ids_are_validated(client: TestClient) -> None:
    session_id, last = await finished_session(client, {})
    async with client.ws_connect("/ws") as ws:
        for value in (last + 1, -1, "3", 1.5, True, 10**30, None):
            await ws.send_json({"type": "subscribe", "session_id": session_id, "last_event_id": value})
            frame = await ws.receive_json()
            if value is None:  # no id: a fresh subscription, which is fine
                assert frame["type"] == "subscribed"
                await ws.send_json({"type": "unsubscribe", "session_id": session_id})
                while (await ws.receive_json())["type"] != "unsubscribed":
                    pass
                continue
            assert frame["type"] == "error" and "id" not in frame, (value, frame)
        await ws.send_json({"type": "subscribe", "session_id": "no-such-session", "last_event_id": 0})
        assert (await ws.receive_json())["code"] == "not_found"


async def test_mcp_resume_ids_are_validated(client: TestClient) -> None:
    raw = await RawMcp(client).start()
    for value in ("x", "a:b", "a:-1", ":1", "a:1,,b:2", "a:" + "9" * 5000):
        async with client.get(
            "/mcp",
            headers={"Accept": "text/event-stream", "Mcp-Session-Id": raw.session_id, "Last-Event-ID": value},
        ) as response:
            assert response.status == 400, value


async def test_emitted_ids_and_retry_values_are_plain(make_client: ClientFactory) -> None:
    client = await make_client(sse_retry_ms=1234)
    session_id, last = await finished_session(client, {})
    async with client.get(f"/sessions/{session_id}/events", headers={"Last-Event-ID": "0"}) as response:
        body = await response.read()
    text = body.decode()
    assert "\x00" not in text and not re.search(r"\r(?!\n)", text)  # no NUL, no bare CR
    lines = text.splitlines()
    ids = [line[4:] for line in lines if line.startswith("id: ")]
    retries = [line[7:] for line in lines if line.startswith("retry: ")]
    assert ids == [str(n) for n in range(1, last + 1)]
    assert retries == ["1234"]
    raw = await RawMcp(client).start()
    started: dict[str, Any] = await raw.tool("session_message", content="again")
    async with raw.stream() as response:
        seen: list[str] = []
        async for line in response.content:
            text = line.decode().rstrip("\r\n")
            seen.append(text)
            if text.startswith("data: {") and '"type":"done"' in text:
                break
    for text in seen:
        if text.startswith("id: "):
            assert re.fullmatch(r"[A-Za-z0-9_-]+:\d+", text[4:]), text
        if text.startswith("retry: "):
            assert text[7:].isdigit()
        assert "\x00" not in text
    assert f"id: {started['session_id']}:1" in seen
