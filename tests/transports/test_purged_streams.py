"""Readers that fall behind the purge horizon, on every route that reads a run's events.

With the smallest bound (``AGENT_SESSION_EVENTS_MAX_BYTES=1024``) the log keeps only its newest
event, and a query logs two events (its start and ``status_change: running``) before any stream
can read one: every reader starting at the beginning of the query is behind the horizon at once.
Each route must end its stream in its own dialect with ``events_purged``, with a well-formed
body (no second HTTP response inside the chunked encoding), and nothing logged at ERROR.
"""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from tests.conftest import ClientFactory, sse_events
from tests.transports.test_fuzz import assert_clean_log

TINY = 1024
LONG = "hello [emu:tokens=300]"


@pytest.fixture(autouse=True)
def _warnings(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)


async def test_agent_stream_ends_with_an_events_purged_error(
    make_client: ClientFactory, caplog: pytest.LogCaptureFixture
) -> None:
    client = await make_client(session_events_max_bytes=TINY)
    async with client.post("/agent/stream", json={"message": LONG}) as response:
        assert response.status == 200
        async with asyncio.timeout(10):
            events = [event["data"] async for event in sse_events(response)]
    assert events, "the stream ended without a word"
    last = events[-1]
    assert last["type"] == "error" and last["code"] == "events_purged" and last["recoverable"] is True
    assert last["oldest_id"] > last["last_id"] + 1
    assert_clean_log(caplog)


async def test_agent_stream_body_is_well_formed_chunked_encoding(make_client: ClientFactory) -> None:
    """The raw bytes hold one HTTP response: no status line after the headers."""
    client = await make_client(session_events_max_bytes=TINY)
    async with client.post("/agent/stream", json={"message": LONG}) as response:
        async with asyncio.timeout(10):
            body = await response.read()  # a corrupt chunked body raises here
    assert b"HTTP/1.1" not in body
    assert b'"code":"events_purged"' in body


async def test_steps_stream_ends_with_an_events_purged_error(
    make_client: ClientFactory, caplog: pytest.LogCaptureFixture
) -> None:
    client = await make_client(session_events_max_bytes=TINY)
    async with client.post("/sessions", json={}) as created:
        session_id = (await created.json())["id"]
    async with client.get(f"/sessions/{session_id}/stream", params={"query": LONG}) as response:
        assert response.status == 200
        async with asyncio.timeout(10):
            events = [event["data"] async for event in sse_events(response)]
    assert events[-1]["type"] == "error" and events[-1]["code"] == "events_purged"
    assert_clean_log(caplog)


@pytest.mark.slow
async def test_session_stream_ends_with_an_events_purged_error(
    make_client: ClientFactory, caplog: pytest.LogCaptureFixture
) -> None:
    client = await make_client(session_events_max_bytes=TINY)
    async with client.post("/sessions", json={}) as created:
        session_id = (await created.json())["id"]
    async with client.post(f"/sessions/{session_id}/messages", json={"content": LONG}) as started:
        after = (await started.json())["after_id"]
    async with client.get(f"/sessions/{session_id}/events", params={"last_event_id": after}) as response:
        if response.status == 410:  # purged before the request was even read: the resume rule
            assert "oldest_id" in await response.json()
            return
        async with asyncio.timeout(10):
            events = [event async for event in sse_events(response)]
    assert events[-1]["event"] in {"error", "done"}
    if events[-1]["event"] == "error":
        assert events[-1]["data"]["code"] == "events_purged"
    assert_clean_log(caplog)


async def test_agent_run_answers_despite_a_purged_log(
    make_client: ClientFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """``POST /agent/run`` reads its own run: a log too small to hold it still gives the answer."""
    client = await make_client(session_events_max_bytes=TINY)
    async with client.post("/agent/run", json={"message": "What is the square root of 144?"}) as response:
        assert response.status == 200, await response.text()
        body = await response.json()
    assert "12" in body["response"] and body["turns"] == 2
    assert_clean_log(caplog)


async def test_websocket_run_ends_with_an_events_purged_error(
    make_client: ClientFactory, caplog: pytest.LogCaptureFixture
) -> None:
    client = await make_client(session_events_max_bytes=TINY)
    async with client.ws_connect("/ws") as ws:
        await ws.send_json({"type": "run", "message": LONG})
        async with asyncio.timeout(10):
            while True:
                frame = json.loads((await ws.receive()).data)
                if frame.get("type") == "error":
                    break
        assert frame["code"] == "events_purged"
    assert_clean_log(caplog)


@pytest.mark.slow
async def test_mcp_waiting_call_answers_despite_a_purged_log(
    make_client: ClientFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """``session_message`` with ``wait`` follows its query to the end through a purged stretch."""
    from tests.transports.test_mcp import call, connect

    client = await make_client(session_events_max_bytes=TINY)
    async with connect(client) as mcp:
        result = await call(mcp, "session_message", content="What is the square root of 144?", wait=True)
    assert "12" in result["response"] and result["done"]["type"] == "done"
    assert_clean_log(caplog)
