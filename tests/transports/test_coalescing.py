"""Many viewers of one session, with the window that holds new events for them (AGENT_COALESCE_*)
set so that a handful of viewers gets one: each receives every event once, in order, byte for
byte what the others receive, and the answer whole. On Redis the window is the log's tail's,
fed by the instance's reader and its own appends."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from service.transports.ws.direct import wire_bytes
from tests.conftest import ClientFactory, services_of
from tests.support.sessions import new_session
from tests.transports.test_sessions import send

VIEWERS = 6


@pytest.fixture
async def windowed(make_client: ClientFactory) -> TestClient:
    """1 ms per viewer, up to 20 ms: six viewers get a 6 ms window, at 400 tokens a second."""
    return await make_client(
        coalesce_per_subscriber_us=1000, coalesce_max_ms=20, emulator_tokens_per_second=400
    )


def ids_of(raw: bytes) -> list[int]:
    return [int(line[4:]) for line in raw.decode().split("\r\n") if line.startswith("id: ")]


async def raw_stream(client: TestClient, session_id: str, after: int) -> bytes:
    """A session's SSE stream after ``after`` to the query's end, as the bytes that came."""
    async with client.get(
        f"/sessions/{session_id}/events", headers={"Last-Event-ID": str(after)}
    ) as response:
        assert response.status == 200
        return await response.read()  # the stream ends with the query's end


async def test_viewers_in_a_window_get_the_same_events_once_and_in_order(windowed: TestClient) -> None:
    client = windowed
    session_id = await new_session(client)
    session = await services_of(client).sessions.get(session_id)
    after = (await send(client, session_id, "Tell me a story [emu:tokens=200]"))["after_id"]
    streams = await asyncio.gather(*(raw_stream(client, session_id, after) for _ in range(VIEWERS)))

    entries = await session.log.read(after)
    assert entries[-1].event.type == "done"
    assert all(raw == streams[0] for raw in streams)  # the same bytes for every viewer
    # Each once, in order: a window's text deltas merged into one event, which names its first id.
    ids = ids_of(streams[0])
    assert ids == sorted(set(ids)) and ids[-1] == entries[-1].id
    firsts = [int(m) for m in re.findall(rb'"first_id":(\d+)', streams[0])]
    assert len(ids) < len(entries) and firsts  # merged in windows
    datas = [line[6:] for line in streams[0].decode().split("\r\n") if line.startswith("data: ")]
    told = "".join(d["text"] for d in map(json.loads, datas) if d["type"] == "assistant_text")
    assert told == entries[-1].event.output
    text = "".join(e.event.text for e in entries if e.event.type == "text_delta")
    assert text == entries[-1].event.output and len(text.split()) == 200
    # Windows were used: the viewers were handed events together.
    assert session.log.windows > 0


async def test_the_window_is_off_with_coalesce_max_ms_zero(make_client: ClientFactory) -> None:
    client = await make_client(coalesce_max_ms=0, coalesce_per_subscriber_us=1000)
    session_id = await new_session(client)
    session = await services_of(client).sessions.get(session_id)
    after = (await send(client, session_id, "Tell me a story [emu:tokens=50]"))["after_id"]
    streams = await asyncio.gather(*(raw_stream(client, session_id, after) for _ in range(3)))
    assert all(raw == streams[0] for raw in streams)
    assert session.log.windows == 0


async def ws_viewer(
    client: TestClient, session_id: str, after: int, ready: asyncio.Event
) -> list[dict[str, Any]]:
    """A WebSocket following the session after ``after``: its session frames to the query's end."""
    frames: list[dict[str, Any]] = []
    async with client.ws_connect("/ws") as ws:
        await ws.send_json({"type": "subscribe", "session_id": session_id, "last_event_id": after})
        while True:
            frame = await ws.receive_json()
            if frame["type"] == "subscribed":
                ready.set()
                continue
            frames.append(frame)
            if frame["type"] in {"done", "error"}:
                return frames


async def test_websocket_viewers_in_a_window_get_every_event_once_and_in_order(
    windowed: TestClient,
) -> None:
    client = windowed
    session_id = await new_session(client)
    session = await services_of(client).sessions.get(session_id)
    after = await session.log.last_id()
    readies = [asyncio.Event() for _ in range(VIEWERS)]
    viewers = [asyncio.create_task(ws_viewer(client, session_id, after, ready)) for ready in readies]
    for ready in readies:
        await ready.wait()
    windows = session.log.windows
    await send(client, session_id, "Tell me a story [emu:tokens=200]")
    streams = await asyncio.gather(*viewers)

    entries = await session.log.read(after)
    answer = entries[-1].event.output
    for frames in streams:
        ids = [frame["id"] for frame in frames]
        assert ids == sorted(set(ids)) and ids[-1] == entries[-1].id  # once each, in order, to the end
        # Merged or not, the text is the answer's, each piece once: a merged frame covers the ids
        # from its first_id to its id.
        text = "".join(frame["text"] for frame in frames if frame["type"] == "assistant_text")
        assert text == answer and len(text.split()) == 200
        covered = [
            i for frame in frames for i in (range(frame.get("first_id", frame["id"]), frame["id"] + 1))
        ]
        assert covered == [entry.id for entry in entries]
    assert session.log.windows > windows


async def window_viewers(client: TestClient, path: str) -> tuple[list[bytes], str]:
    """A story asked in a new session and read whole by every viewer at ``path`` (``{id}``: the
    session's): what each read, and the answer."""
    session_id = await new_session(client)
    session = await services_of(client).sessions.get(session_id)
    after = (await send(client, session_id, "Tell me a story [emu:tokens=200]"))["after_id"]

    async def read() -> bytes:
        async with client.get(path.format(id=session_id)) as response:
            assert response.status == 200
            return await response.read()

    streams = await asyncio.gather(*(read() for _ in range(VIEWERS)))
    return list(streams), (await session.log.read(after))[-1].event.output


async def test_ai_sdk_viewers_in_a_window_get_the_same_parts_and_the_whole_answer(
    windowed: TestClient,
) -> None:
    streams, answer = await window_viewers(windowed, "/api/chat/{id}/stream")
    for raw in streams:
        parts = [
            json.loads(line[6:])
            for line in raw.decode().split("\r\n")
            if line.startswith("data: ") and line != "data: [DONE]"
        ]
        assert [p["type"] for p in parts][:2] == ["start", "start-step"] and parts[-1]["type"] == "finish"
        assert "".join(p["delta"] for p in parts if p["type"] == "text-delta") == answer
    assert all(raw == streams[0] for raw in streams)


async def test_ag_ui_viewers_in_a_window_get_the_same_events_and_the_whole_answer(
    windowed: TestClient,
) -> None:
    streams, answer = await window_viewers(windowed, "/ag-ui/{id}/events")
    for raw in streams:
        events = [json.loads(line[6:]) for line in raw.decode().split("\n") if line.startswith("data: ")]
        assert events[-1]["type"] == "RUN_FINISHED"
        contents = [e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT"]
        assert "".join(contents) == answer and len(contents) < 200  # merged in windows
    assert all(raw == streams[0] for raw in streams)


async def test_a_window_s_websocket_bytes_are_frames_a_client_reads(aiohttp_client: Any) -> None:
    # Every length form of RFC 6455's header: 7 bits, 16 bits, 64 bits.
    frames = ['{"n":1}', json.dumps({"text": "é" * 150}), json.dumps({"text": "x" * 70_000})]

    async def handler(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(compress=False)
        await ws.prepare(request)
        assert request.transport is not None
        request.transport.write(wire_bytes(frames))
        await ws.receive()  # the client's close
        return ws

    app = web.Application()
    app.router.add_get("/ws", handler)
    client = await aiohttp_client(app)
    async with client.ws_connect("/ws") as ws:
        assert [await ws.receive_str() for _ in frames] == frames
