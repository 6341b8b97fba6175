"""``/mcp``: the MCP face, driven by the official ``mcp`` SDK client (v2) over real HTTP.

One test per seed 004 scenario, then the protocol's edges (raw HTTP where a test needs to hold the
connection itself), access control, and one session followed at once over MCP, SSE and WebSocket.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import httpx2
import mcp_types as types
import pytest
from aiohttp.test_utils import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from service.transports.mcp import MCP_SESSIONS, McpSession, format_cursor, parse_cursor
from tests.conftest import ClientFactory, services_of, sse_blocks, sse_events

WAIT_S = 15.0
METHODS = [
    "initialize",
    "ping",
    "tools/list",
    "tools/call",
    "logging/setLevel",
    "notifications/initialized",
    "notifications/cancelled",
    "resources/list",
    "server/discover",
]


class Notifications:
    """What a client's logging callback received, with a way to wait for what is expected."""

    def __init__(self) -> None:
        self.items: list[types.LoggingMessageNotificationParams] = []
        self._changed = asyncio.Condition()
        self.hook: Callable[[dict[str, Any]], Any] | None = None

    async def __call__(self, params: types.LoggingMessageNotificationParams) -> None:
        self.items.append(params)
        if self.hook is not None:
            result = self.hook(params.data)
            if asyncio.iscoroutine(result):
                await result
        async with self._changed:
            self._changed.notify_all()

    @property
    def events(self) -> list[dict[str, Any]]:
        return [item.data for item in self.items]

    async def wait_for(self, predicate: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        async with asyncio.timeout(WAIT_S), self._changed:
            while True:
                for data in self.events:
                    if predicate(data):
                        return data
                await self._changed.wait()

    async def wait_done(self, session_id: str, count: int = 1) -> list[dict[str, Any]]:
        """This session's events up to its ``count``-th query end."""

        def ended(_: dict[str, Any]) -> bool:
            ends = [
                e
                for e in self.events
                if e.get("session_id") == session_id and e["type"] in ("done", "error") and "id" in e
            ]
            return len(ends) >= count

        await self.wait_for(ended)
        return [e for e in self.events if e.get("session_id") == session_id]


class RefuseGet(httpx2.AsyncBaseTransport):
    """An HTTP transport through which no GET gets: a client that never opens the SSE stream."""

    def __init__(self) -> None:
        self._inner = httpx2.AsyncHTTPTransport()
        self.refused = 0

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if request.method == "GET":
            self.refused += 1
            raise httpx2.ConnectError("GET refused by the test's network", request=request)
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


def mcp_url(client: TestClient) -> str:
    return str(client.make_url("/mcp"))


@asynccontextmanager
async def connect(
    client: TestClient | str,
    notifications: Notifications | None = None,
    *,
    headers: dict[str, str] | None = None,
    transport: httpx2.AsyncBaseTransport | None = None,
) -> AsyncIterator[Client]:
    """The SDK client on the service's ``/mcp`` (a test client, or a URL), in its default
    (auto-negotiating) mode."""
    url = client if isinstance(client, str) else mcp_url(client)
    http = httpx2.AsyncClient(
        headers=headers or {}, transport=transport, timeout=httpx2.Timeout(30, read=300)
    )
    async with (
        http,
        Client(streamable_http_client(url, http_client=http), logging_callback=notifications) as mcp,
    ):
        yield mcp


async def call(mcp: Client, name: str, **arguments: Any) -> dict[str, Any]:
    """A tool's structured result; the test fails on an ``isError`` result."""
    result = await mcp.call_tool(name, arguments)
    assert not result.is_error, result.structured_content
    assert result.structured_content is not None
    # The text content says the same as the structured content.
    assert json.loads(result.content[0].text) == result.structured_content  # type: ignore[union-attr]
    return result.structured_content


async def poll_all(
    mcp: Client, session_id: str, since: int = 0, limit: int | None = None
) -> list[dict[str, Any]]:
    """``session_events`` from ``since`` until the query has ended and nothing is left."""
    events: list[dict[str, Any]] = []
    async with asyncio.timeout(WAIT_S):
        while True:
            args: dict[str, Any] = {"session_id": session_id, "since_index": since}
            if limit:
                args["limit"] = limit
            page = await call(mcp, "session_events", **args)
            events.extend(page["events"])
            since = page["next_index"]
            if (
                page["status"] == "idle"
                and since == page["last_id"]
                and events
                and events[-1]["type"] in ("done", "error")
            ):
                return events
            if not page["events"]:
                await asyncio.sleep(0.02)  # a poller's pace; the loop ends on the state it reads


def mcp_sessions(client: TestClient) -> list[McpSession]:
    return list(client.server.app[MCP_SESSIONS]._sessions.values())


def ids(events: list[dict[str, Any]]) -> list[int]:
    return [event["id"] for event in events]


def assert_accounted_for(streamed: list[dict[str, Any]], last_id: int) -> None:
    """Ids 1..last_id each arrived once, in order, or fell in a gap an ``events_purged`` error named."""
    position = 0
    for event in streamed:
        if event.get("code") == "events_purged":
            assert event["after_id"] == position
            position = event["oldest_id"] - 1
            continue
        assert event["id"] == position + 1
        position = event["id"]
    assert position == last_id


# --- seed 004: SSE event delivery ---


@pytest.mark.slow
async def test_working_state_change_arrives_as_a_log_notification(client: TestClient) -> None:
    received = Notifications()
    async with connect(client, received) as mcp:
        assert mcp.protocol_version in HANDSHAKE_PROTOCOL_VERSIONS  # auto mode fell back to initialize
        await mcp.set_logging_level("info")
        started = await call(mcp, "session_message", content="hello there")
        session_id = started["session_id"]
        assert started["status"] == "running" and started["next_index"] == 0
        running = await received.wait_for(lambda e: e["type"] == "status_change" and e["status"] == "running")
        assert running["session_id"] == session_id and running["id"] >= 1
        await received.wait_done(session_id)
    item = next(i for i in received.items if i.data["type"] == "status_change")
    assert item.level == "info" and item.logger == "agentstream"
    states = [e["status"] for e in received.events if e["type"] == "status_change"]
    assert states == ["running", "idle"]


async def test_tool_use_arrives_with_the_tool_name_and_status(client: TestClient) -> None:
    received = Notifications()
    async with connect(client, received) as mcp:
        await mcp.set_logging_level("info")
        session_id = (await call(mcp, "session_message", content="what is 6*7?"))["session_id"]
        events = await received.wait_done(session_id)
    tool_events = [e for e in events if e["type"].startswith("tool_")]
    assert [(e["type"], e["status"]) for e in tool_events] == [
        ("tool_use_start", "started"),
        ("tool_use", "requested"),
        ("tool_executing", "executing"),
        ("tool_result", "completed"),
    ]
    assert {e["toolName"] for e in tool_events} == {"calculator"}
    assert tool_events[-1]["result"] == "42"


async def test_text_output_arrives_with_the_message_content(client: TestClient) -> None:
    received = Notifications()
    async with connect(client, received) as mcp:
        await mcp.set_logging_level("info")
        session_id = (await call(mcp, "session_message", content="tell me something [emu:tokens=9]"))[
            "session_id"
        ]
        events = await received.wait_done(session_id)
    text = "".join(e["text"] for e in events if e["type"] == "assistant_text")
    assert len([e for e in events if e["type"] == "assistant_text"]) == 9
    assert text and text == events[-1]["output"]


async def test_without_a_stream_events_wait_for_polling_and_nothing_fails(client: TestClient) -> None:
    network = RefuseGet()
    received = Notifications()
    async with connect(client, received, transport=network) as mcp:
        await mcp.set_logging_level("debug")
        session_id = (await call(mcp, "session_message", content="what is 2+3?"))["session_id"]
        events = await poll_all(mcp, session_id)
        assert ids(events) == list(range(1, len(events) + 1))
        assert events[-1]["type"] == "done"
        (held,) = mcp_sessions(client)
        assert held.stream is None and held.followed == {session_id: 0}
        # The conversation goes on, still without a stream.
        await call(mcp, "session_message", session_id=session_id, content="and again")
        more = await poll_all(mcp, session_id, since=events[-1]["id"])
        assert more[0]["id"] == events[-1]["id"] + 1 and more[-1]["type"] == "done"
    assert network.refused >= 1 and received.items == []


# --- seed 004: stream resumption ---


class RawMcp:
    """A hand-driven MCP client over aiohttp, for what the SDK client does on its own."""

    def __init__(self, client: TestClient, headers: dict[str, str] | None = None) -> None:
        self.client = client
        self.headers = {"Accept": "application/json, text/event-stream", **(headers or {})}
        self.session_id = ""
        self._ids = 0

    async def post(self, method: str, params: dict[str, Any] | None = None, *, notify: bool = False) -> Any:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        if not notify:
            self._ids += 1
            message["id"] = self._ids
        headers = dict(self.headers)
        if self.session_id:
            headers["Mcp-Session-Id"] = self.session_id
            headers["MCP-Protocol-Version"] = "2025-06-18"
        response = await self.client.post("/mcp", json=message, headers=headers)
        if notify:
            assert response.status == 202, await response.text()
            return None
        body = await response.json()
        assert response.status == 200, body
        if method == "initialize":
            self.session_id = response.headers["Mcp-Session-Id"]
        assert "error" not in body, body
        return body["result"]

    async def start(self, level: str | None = "info") -> RawMcp:
        await self.post(
            "initialize",
            {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "raw", "version": "1"},
            },
        )
        await self.post("notifications/initialized", notify=True)
        if level:
            await self.post("logging/setLevel", {"level": level})
        return self

    async def tool(self, name: str, **arguments: Any) -> dict[str, Any]:
        result = await self.post("tools/call", {"name": name, "arguments": arguments})
        assert not result.get("isError"), result
        return result["structuredContent"]

    @asynccontextmanager
    async def stream(self, last_event_id: str | None = None) -> AsyncIterator[aiohttp.ClientResponse]:
        """The GET stream; leaving the block drops the connection (the stream itself never ends)."""
        headers = {"Accept": "text/event-stream", "Mcp-Session-Id": self.session_id, **self._auth()}
        if last_event_id is not None:
            headers["Last-Event-ID"] = last_event_id
        response = await self.client.get("/mcp", headers=headers)
        try:
            yield response
        finally:
            response.close()

    def _auth(self) -> dict[str, str]:
        return {k: v for k, v in self.headers.items() if k == "Authorization"}

    async def wait_idle(self, session_id: str) -> dict[str, Any]:
        async with asyncio.timeout(WAIT_S):
            while (status := await self.tool("session_status", session_id=session_id))["status"] != "idle":
                await asyncio.sleep(0.02)
        return status


async def read_messages(response: aiohttp.ClientResponse) -> AsyncIterator[tuple[str | None, dict[str, Any]]]:
    """(SSE id, JSON-RPC message) for each message on a raw MCP stream (the priming event skipped)."""
    async for block in sse_blocks(response):
        if block["data"]:
            yield block.get("id"), json.loads(block["data"])


async def test_reconnect_with_last_event_id_replays_what_was_missed(client: TestClient) -> None:
    raw = await RawMcp(client).start(level="debug")  # every event, partial tool input included
    session_id = (await raw.tool("session_message", content="what is 2+3?"))["session_id"]
    seen: list[int] = []
    last_id = None
    async with raw.stream() as response:
        assert response.status == 200
        async for sse_id, message in read_messages(response):
            data = message["params"]["data"]
            seen.append(data["id"])
            last_id = sse_id
            if data["id"] == 4:
                break  # the network drops here
    assert last_id == f"{session_id}:4" and parse_cursor(last_id) == {session_id: 4}
    await raw.wait_idle(session_id)  # the rest of the query happens while disconnected
    last = (await raw.tool("session_status", session_id=session_id))["last_event_id"]
    async with raw.stream(last_id) as response:
        assert response.status == 200
        replayed: list[int] = []
        async for sse_id, message in read_messages(response):
            data = message["params"]["data"]
            replayed.append(data["id"])
            assert sse_id == format_cursor({session_id: data["id"]})
            if data["id"] == last:
                break
        assert replayed == list(range(5, last + 1))
        # Streaming continues from the current position: the next query arrives live.
        await raw.tool("session_message", session_id=session_id, content="more")
        async for _, message in read_messages(response):
            data = message["params"]["data"]
            assert data["id"] == last + 1 and data["type"] == "processing"
            break


async def test_sdk_client_resumes_after_the_stream_drops(make_client: ClientFactory) -> None:
    client = await make_client(sse_retry_ms=50, emulator_tokens_per_second=200)
    received = Notifications()
    dropped = asyncio.Event()

    def drop_once(data: dict[str, Any]) -> None:
        # The server's side of the stream dies mid-answer, as a network cut would end it.
        if data.get("id") == 5 and not dropped.is_set():
            dropped.set()
            (held,) = mcp_sessions(client)
            assert held.stream is not None
            held.stream.close()

    received.hook = drop_once
    async with connect(client, received) as mcp:
        await mcp.set_logging_level("info")
        session_id = (await call(mcp, "session_message", content="hello [emu:tokens=40]"))["session_id"]
        events = await received.wait_done(session_id)
        (held,) = mcp_sessions(client)
        assert held.resumed >= 1  # the client came back with a Last-Event-ID
    assert dropped.is_set()
    assert ids(events) == list(range(1, len(events) + 1))  # nothing lost, nothing twice


async def test_purged_events_give_an_error_and_polling_takes_over(make_client: ClientFactory) -> None:
    client = await make_client(session_events_max_bytes=40_000)
    raw = await RawMcp(client).start()
    session_id = (await raw.tool("session_message", content="hi [emu:tokens=3]"))["session_id"]
    async with raw.stream() as response:
        async for sse_id, message in read_messages(response):
            last_id = sse_id
            if message["params"]["data"]["type"] == "done":
                break
    old = parse_cursor(last_id)[session_id]
    # While the client is away, a long answer pushes its position out of the bounded log.
    await raw.tool("session_message", session_id=session_id, content="long [emu:tokens=200]")
    status = await raw.wait_idle(session_id)
    assert status["oldest_id"] > old + 1
    async with raw.stream(last_id) as response:
        assert response.status == 200
        messages = read_messages(response)
        _, first = await anext(messages)
        error = first["params"]["data"]
        assert first["params"]["level"] == "error"
        assert error["code"] == "events_purged" and error["session_id"] == session_id
        assert error["after_id"] == old and error["oldest_id"] == status["oldest_id"]
        assert error["poll"] == {"tool": "session_events", "session_id": session_id, "since_index": old}
        _, following = await anext(messages)
        assert following["params"]["data"]["id"] == status["oldest_id"]  # the stream goes on
    # Polling from the old position: what is left, flagged as purged, with a snapshot.
    page = await raw.tool("session_events", session_id=session_id, since_index=old)
    assert page["purged"] is True and page["events"][0]["id"] == status["oldest_id"]
    assert page["snapshot"]["messages"]


# --- seed 004: the event store ---


async def test_memory_limit_purges_the_oldest_and_keeps_storing(make_client: ClientFactory) -> None:
    bound = 30_000
    client = await make_client(session_events_max_bytes=bound)
    received = Notifications()
    async with connect(client, received) as mcp:
        await mcp.set_logging_level("info")
        session_id = (await call(mcp, "session_message", content="long [emu:tokens=150]"))["session_id"]
        streamed = await received.wait_done(session_id)
        page = await call(mcp, "session_events", session_id=session_id, since_index=0)
    assert page["oldest_id"] > 1 and page["purged"] is True
    assert page["events"][-1]["type"] == "done" and page["events"][-1]["id"] == page["last_id"]
    # The stream saw each event once, in order; any it fell too far behind for, it was told of.
    assert_accounted_for(streamed, page["last_id"])
    log = (await services_of(client).sessions.get(session_id)).log
    if hasattr(log, "size_bytes"):
        assert log.size_bytes <= bound


async def test_the_default_event_store_bound_is_ten_megabytes(client: TestClient) -> None:
    assert services_of(client).settings.session_events_max_bytes == 10 * 1024 * 1024


# --- seed 004: backwards compatibility ---


async def test_polling_works_as_before_with_a_stream_open(client: TestClient) -> None:
    received = Notifications()
    async with connect(client, received) as mcp:
        await mcp.set_logging_level("info")
        session_id = (await call(mcp, "session_message", content="what is 1+1?"))["session_id"]
        await received.wait_done(session_id)
        polled = await poll_all(mcp, session_id, limit=3)
    # The same answer the HTTP polling route gives.
    response = await client.get(f"/sessions/{session_id}/events/poll", params={"since_index": "0"})
    assert polled == (await response.json())["events"]
    assert ids(polled) == list(range(1, len(polled) + 1))


async def test_mixed_mode_loses_nothing_and_repeats_nothing(make_client: ClientFactory) -> None:
    client = await make_client(emulator_tokens_per_second=200)
    received = Notifications()
    async with connect(client, received) as mcp:
        await mcp.set_logging_level("debug")
        session_id = (await call(mcp, "session_message", content="what is 9*9? [emu:tokens=30]"))[
            "session_id"
        ]
        polled = await poll_all(mcp, session_id, limit=4)  # polls while the stream delivers
        streamed = await received.wait_done(session_id)
    expected = list(range(1, polled[-1]["id"] + 1))
    assert ids(polled) == expected
    assert ids(streamed) == expected
    for from_poll, from_stream in zip(polled, streamed, strict=True):
        assert from_stream == {"session_id": session_id, **from_poll, **pick_status(from_stream)}


def pick_status(event: dict[str, Any]) -> dict[str, Any]:
    """The ``status`` the stream adds to tool events (not a polling field)."""
    return {"status": event["status"]} if "status" in event and event["type"].startswith("tool_") else {}


# --- one session, three transports ---


async def test_one_session_followed_over_mcp_sse_and_websocket_with_the_same_ids(
    make_client: ClientFactory,
) -> None:
    client = await make_client(emulator_tokens_per_second=100)
    received = Notifications()
    async with connect(client, received) as mcp:
        await mcp.set_logging_level("debug")
        # Started over MCP; a browser and a script join it from its first event.
        session_id = (await call(mcp, "session_message", content="what is 3*4?"))["session_id"]
        ws = await client.ws_connect("/ws")
        await ws.send_json({"type": "subscribe", "session_id": session_id, "last_event_id": 0})
        sse = await client.get(f"/sessions/{session_id}/events", headers={"Last-Event-ID": "0"})
        assert sse.status == 200

        async def over_sse() -> list[tuple[int, str]]:
            return [(int(event["id"]), event["data"]["type"]) async for event in sse_events(sse)]

        async def over_ws() -> list[tuple[int, str]]:
            seen = []
            while True:
                frame = await ws.receive_json()
                if "id" in frame:
                    seen.append((frame["id"], frame["type"]))
                    if frame["type"] == "done":
                        return seen

        streamed = await received.wait_done(session_id)
        from_sse, from_ws = await asyncio.wait_for(asyncio.gather(over_sse(), over_ws()), WAIT_S)
        await ws.close()
    from_mcp = [(e["id"], e["type"]) for e in streamed]
    assert from_mcp == from_sse == from_ws
    assert [i for i, _ in from_mcp] == list(range(1, len(from_mcp) + 1))


# --- the tools ---


async def test_waiting_for_the_answer_reports_progress(client: TestClient) -> None:
    progress: list[float] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append(done)

    async with connect(client) as mcp:
        result = await mcp.call_tool(
            "session_message", {"content": "what is 5+5?", "wait": True}, progress_callback=on_progress
        )
    answer = result.structured_content
    assert answer is not None and not result.is_error
    assert answer["status"] == "idle" and answer["done"]["type"] == "done"
    assert "10" in answer["response"] and answer["response"] == answer["done"]["output"]
    assert progress and progress == sorted(progress)
    assert answer["next_index"] == (await mcp_status(client, answer["session_id"]))["last_event_id"]


async def mcp_status(client: TestClient, session_id: str) -> dict[str, Any]:
    response = await client.get(f"/sessions/{session_id}")
    return await response.json()


async def test_cancel_stops_the_running_query(client: TestClient) -> None:
    received = Notifications()
    async with connect(client, received) as mcp:
        await mcp.set_logging_level("info")
        session_id = (await call(mcp, "session_message", content="slow [emu:tps=5] [emu:tokens=500]"))[
            "session_id"
        ]
        await received.wait_for(lambda e: e["type"] == "assistant_text")
        cancelled = await call(mcp, "session_cancel", session_id=session_id)
        assert cancelled["cancelled"] is True
        events = await received.wait_done(session_id)
        status = await call(mcp, "session_status", session_id=session_id)
    assert events[-1]["type"] in ("done", "error") and events[-1].get("code") in ("cancelled", None)
    assert status["status"] == "idle" and status["running_query"] is None
    assert status["last_event_id"] == events[-1]["id"] and status["followed"] is True


async def test_tool_failures_are_results_the_model_can_read(client: TestClient) -> None:
    async with connect(client) as mcp:
        unknown = await mcp.call_tool("session_status", {"session_id": "nope"})
        assert unknown.is_error and unknown.structured_content["error"] == "Session not found"
        invalid = await mcp.call_tool("session_message", {"content": "   "})
        assert invalid.is_error and "content" in invalid.structured_content["error"]
        extra = await mcp.call_tool("session_events", {"session_id": "x", "since": 3})
        assert extra.is_error and "since" in extra.structured_content["error"]
        session_id = (await call(mcp, "session_message", content="slow [emu:tps=5] [emu:tokens=100]"))[
            "session_id"
        ]
        busy = await mcp.call_tool("session_message", {"session_id": session_id, "content": "again"})
        assert busy.is_error and "already running" in busy.structured_content["error"]
        ahead = await mcp.call_tool("session_events", {"session_id": session_id, "since_index": 10_000})
        assert ahead.is_error and "ahead" in ahead.structured_content["error"]
        with pytest.raises(MCPError) as raised:
            await mcp.call_tool("no_such_tool", {})
        assert raised.value.error.code == types.INVALID_PARAMS
        await call(mcp, "session_cancel", session_id=session_id)


async def test_the_tools_are_listed_with_schemas(client: TestClient) -> None:
    async with connect(client) as mcp:
        listed = {tool.name: tool for tool in (await mcp.list_tools()).tools}
        assert mcp.server_capabilities.logging is not None and mcp.server_capabilities.tools is not None
    assert set(listed) == {
        "session_create",
        "session_message",
        "session_events",
        "session_status",
        "session_cancel",
        "session_approve",
    }
    assert listed["session_message"].input_schema["required"] == ["content"]
    assert listed["session_events"].input_schema["properties"]["since_index"]["minimum"] == 0


async def test_the_level_filters_what_is_sent(client: TestClient) -> None:
    received = Notifications()
    async with connect(client, received) as mcp:
        await mcp.set_logging_level("error")
        failing = await call(mcp, "session_message", content="boom [emu:http=400]")
        await received.wait_for(lambda e: e["type"] == "error")
        quiet = await call(mcp, "session_message", content="fine")
        first_query = await poll_all(mcp, quiet["session_id"])
        await mcp.set_logging_level("info")
        await call(mcp, "session_message", session_id=quiet["session_id"], content="loud")
        await received.wait_done(quiet["session_id"])
    levels = {item.level for item in received.items if item.data["session_id"] == failing["session_id"]}
    assert levels == {"error"}
    # What the error level held back is not sent later; at info the next query arrives whole.
    loud = [e for e in received.events if e["session_id"] == quiet["session_id"]]
    assert ids(loud) == list(range(first_query[-1]["id"] + 1, loud[-1]["id"] + 1))


async def test_an_mcp_session_follows_several_agent_sessions_on_one_stream(client: TestClient) -> None:
    raw = await RawMcp(client).start()
    first = (await raw.tool("session_message", content="one"))["session_id"]
    second = (await raw.tool("session_message", content="two"))["session_id"]
    await raw.wait_idle(first)
    await raw.wait_idle(second)
    done: set[str] = set()
    cursor = None
    async with raw.stream() as response:
        async for sse_id, message in read_messages(response):
            data = message["params"]["data"]
            cursor = parse_cursor(sse_id)
            if data["type"] == "done":
                done.add(data["session_id"])
            if done == {first, second}:
                break
    last_first = (await raw.tool("session_status", session_id=first))["last_event_id"]
    last_second = (await raw.tool("session_status", session_id=second))["last_event_id"]
    assert cursor == {first: last_first, second: last_second}
    # A reconnect with that id replays nothing and waits for what comes next.
    async with raw.stream(format_cursor(cursor)) as response:
        await raw.tool("session_message", session_id=second, content="three")
        _, message = await anext(read_messages(response))
        assert message["params"]["data"]["session_id"] == second
        assert message["params"]["data"]["id"] == last_second + 1


# --- the transport's edges ---


async def test_a_new_get_stream_takes_over_from_the_old_one(client: TestClient) -> None:
    raw = await RawMcp(client).start()
    async with raw.stream() as old:
        assert old.status == 200
        async with raw.stream() as new:
            assert new.status == 200
            assert await old.content.read() is not None
            assert old.content.at_eof()  # the first stream was ended
            session_id = (await raw.tool("session_message", content="hi"))["session_id"]
            _, message = await anext(read_messages(new))
            assert message["params"]["data"]["session_id"] == session_id


async def test_delete_ends_the_mcp_session_and_its_stream(client: TestClient) -> None:
    raw = await RawMcp(client).start()
    async with raw.stream() as stream:
        response = await client.delete("/mcp", headers={"Mcp-Session-Id": raw.session_id})
        assert response.status == 204
        await stream.content.read()
        assert stream.content.at_eof()
    again = await client.post(
        "/mcp",
        json={"jsonrpc": "2.0", "id": 9, "method": "ping"},
        headers={"Mcp-Session-Id": raw.session_id, "Accept": "application/json, text/event-stream"},
    )
    assert again.status == 404 and "initialize" in (await again.json())["error"]


async def test_ping_and_protocol_negotiation(client: TestClient) -> None:
    raw = RawMcp(client)
    result = await raw.post(
        "initialize",
        {"protocolVersion": "1999-01-01", "capabilities": {}, "clientInfo": {"name": "old", "version": "1"}},
    )
    assert result["protocolVersion"] == HANDSHAKE_PROTOCOL_VERSIONS[-1]
    assert result["serverInfo"]["name"] == "agentstream" and result["capabilities"]["logging"] == {}
    await raw.post("notifications/initialized", notify=True)
    assert await raw.post("ping") == {}
    # The SDK client's probe for the 2026 protocol is told to use the handshake.
    probe = await client.post(
        "/mcp",
        json={"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {}},
        headers={"Accept": "application/json, text/event-stream", "Mcp-Session-Id": raw.session_id},
    )
    assert (await probe.json())["error"]["code"] == types.METHOD_NOT_FOUND


@pytest.mark.slow
@pytest.mark.parametrize(
    ("body", "headers", "status", "code"),
    [
        (b"{not json", {}, 400, types.PARSE_ERROR),
        (b'[{"jsonrpc": "2.0", "id": 1, "method": "ping"}]', {}, 400, types.INVALID_REQUEST),
        (b'{"jsonrpc": "1.0", "id": 1, "method": "ping"}', {}, 400, types.INVALID_REQUEST),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "ping"}', {"Content-Type": "text/plain"}, 415, None),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "ping"}', {"Accept": "text/html"}, 406, None),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "ping"}', {}, 400, None),  # no Mcp-Session-Id
    ],
)
async def test_bad_posts_get_clear_errors(
    client: TestClient, body: bytes, headers: dict[str, str], status: int, code: int | None
) -> None:
    sent = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream", **headers}
    response = await client.post("/mcp", data=body, headers=sent)
    assert response.status == status
    reply = await response.json()
    if code is None:
        assert isinstance(reply["error"], str) and reply["error"]
    else:
        assert reply["jsonrpc"] == "2.0" and reply["error"]["code"] == code


async def test_bad_session_headers_and_stream_requests(make_client: ClientFactory) -> None:
    client = await make_client(max_request_bytes=4096)
    raw = await RawMcp(client).start()
    accept = {"Accept": "application/json, text/event-stream"}
    unknown = await client.post(
        "/mcp",
        json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
        headers={**accept, "Mcp-Session-Id": "nope"},
    )
    assert unknown.status == 404
    version = await client.post(
        "/mcp",
        json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
        headers={**accept, "Mcp-Session-Id": raw.session_id, "MCP-Protocol-Version": "2099-01-01"},
    )
    assert version.status == 400 and "2099-01-01" in (await version.json())["error"]
    huge = await client.post(
        "/mcp",
        json={"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"x": "y" * 10_000}},
        headers={**accept, "Mcp-Session-Id": raw.session_id},
    )
    assert huge.status == 413
    not_sse = await client.get(
        "/mcp", headers={"Accept": "application/json", "Mcp-Session-Id": raw.session_id}
    )
    assert not_sse.status == 406
    for bad in ("12", "abc:", ":3", "a:1,b"):
        response = await client.get(
            "/mcp",
            headers={"Accept": "text/event-stream", "Mcp-Session-Id": raw.session_id, "Last-Event-ID": bad},
        )
        assert response.status == 400, bad
        assert "Last-Event-ID" in (await response.json())["error"]
    # The session still works after all that.
    assert await raw.post("ping") == {}


async def test_the_mcp_session_cap_answers_503(make_client: ClientFactory) -> None:
    client = await make_client(mcp_max_sessions=2)
    await RawMcp(client).start()
    await RawMcp(client).start()
    response = await client.post(
        "/mcp",
        json={
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "x", "version": "1"},
            },
        },
        headers={"Accept": "application/json, text/event-stream"},
    )
    assert response.status == 503 and response.headers["Retry-After"]
    assert (await response.json())["error"]["message"]


# --- access control ---


async def test_keys_and_ownership_apply_to_mcp(make_client: ClientFactory) -> None:
    client = await make_client(api_keys=["key-a", "key-b"])
    anonymous = await client.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert anonymous.status == 401
    a = await RawMcp(client, {"Authorization": "Bearer key-a"}).start()
    b = await RawMcp(client, {"Authorization": "Bearer key-b"}).start()
    session_id = (await a.tool("session_message", content="mine"))["session_id"]
    # B can't use A's MCP session...
    stolen = await client.post(
        "/mcp",
        json={"jsonrpc": "2.0", "id": 5, "method": "ping"},
        headers={
            "Authorization": "Bearer key-b",
            "Accept": "application/json",
            "Mcp-Session-Id": a.session_id,
        },
    )
    assert stolen.status == 404
    async with client.get(
        "/mcp",
        headers={
            "Authorization": "Bearer key-b",
            "Accept": "text/event-stream",
            "Mcp-Session-Id": a.session_id,
        },
    ) as response:
        assert response.status == 404
    # ...nor reach A's agent session through its own.
    for tool, args in [
        ("session_message", {"session_id": session_id, "content": "hi"}),
        ("session_events", {"session_id": session_id}),
        ("session_status", {"session_id": session_id}),
        ("session_cancel", {"session_id": session_id}),
    ]:
        result = await b.post("tools/call", {"name": tool, "arguments": args})
        assert result["isError"] and result["structuredContent"]["error"] == "Session not found", tool
    # The SDK client with a key works end to end.
    await a.wait_idle(session_id)
    received = Notifications()
    async with connect(client, received, headers={"Authorization": "Bearer key-a"}) as mcp:
        await mcp.set_logging_level("info")
        await call(mcp, "session_message", session_id=session_id, content="again")
        await received.wait_done(session_id)


async def test_a_foreign_origin_is_refused(client: TestClient) -> None:
    response = await client.post(
        "/mcp",
        json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
        headers={"Origin": "http://evil.example", "Accept": "application/json"},
    )
    assert response.status == 403


async def test_metrics_count_mcp_sessions_streams_and_notifications(client: TestClient) -> None:
    received = Notifications()
    async with connect(client, received) as mcp:
        await mcp.set_logging_level("info")
        session_id = (await call(mcp, "session_message", content="hello"))["session_id"]
        events = await received.wait_done(session_id)
        text = await (await client.get("/metrics")).text()
    assert "agentstream_mcp_sessions 1.0" in text
    assert 'agentstream_connections{transport="mcp"} 1.0' in text
    delivered = next(
        line
        for line in text.splitlines()
        if line.startswith('agentstream_events_delivered_total{transport="mcp"}')
    )
    assert float(delivered.split()[-1]) >= len(events)


# --- waiting calls, cancellation, expiry, fuzzing ---


async def open_waiting_call(raw: RawMcp, request_id: int, content: str) -> aiohttp.ClientResponse:
    """A ``session_message`` with ``wait: true``, answered as an SSE stream."""
    message = {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {
            "name": "session_message",
            "arguments": {"content": content, "wait": True},
            "_meta": {"progressToken": "p"},
        },
    }
    headers = {**raw.headers, "Mcp-Session-Id": raw.session_id}
    response = await raw.client.post("/mcp", json=message, headers=headers)
    assert response.status == 200 and response.content_type == "text/event-stream"
    return response


@pytest.mark.slow
async def test_a_waiting_call_whose_client_leaves_does_not_stop_the_query(client: TestClient) -> None:
    raw = await RawMcp(client).start()
    response = await open_waiting_call(raw, 77, "slow [emu:tps=50] [emu:tokens=30]")
    _, progress = await anext(read_messages(response))
    assert progress["method"] == "notifications/progress" and progress["params"]["progressToken"] == "p"
    response.close()  # the client goes away mid-answer
    (held,) = mcp_sessions(client)
    session_id = next(iter(held.followed))
    status = await raw.wait_idle(session_id)
    page = await raw.tool("session_events", session_id=session_id, since_index=0)
    assert page["events"][-1]["type"] == "done" and status["last_event_id"] == page["last_id"]
    assert held.in_flight == {}


async def test_notifications_cancelled_ends_a_waiting_call_without_a_reply(client: TestClient) -> None:
    raw = await RawMcp(client).start()
    response = await open_waiting_call(raw, 78, "slow [emu:tps=20] [emu:tokens=200]")
    messages = read_messages(response)
    await anext(messages)  # progress: the call is waiting
    await raw.post("notifications/cancelled", {"requestId": 78, "reason": "user gave up"}, notify=True)
    rest = [message async for _, message in messages]
    assert all("id" not in message for message in rest)  # progress at most, never a result
    (held,) = mcp_sessions(client)
    assert held.in_flight == {}
    # Cancelling the call is not cancelling the query: that is session_cancel's job.
    session_id = next(iter(held.followed))
    assert (await raw.tool("session_status", session_id=session_id))["status"] == "running"
    assert (await raw.tool("session_cancel", session_id=session_id))["cancelled"] is True


async def test_idle_mcp_sessions_expire_but_not_while_streaming(client: TestClient) -> None:
    idle = await RawMcp(client).start()
    streaming = await RawMcp(client).start()
    async with streaming.stream() as response:
        assert response.status == 200
        ttl = services_of(client).settings.mcp_session_ttl_s
        for held in mcp_sessions(client):
            held.last_seen -= ttl + 1  # both were last seen longer ago than the TTL
        gone = await client.post(
            "/mcp",
            json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
            headers={"Accept": "application/json", "Mcp-Session-Id": idle.session_id},
        )
        assert gone.status == 404
        assert await streaming.post("ping") == {}
    assert [held.id for held in mcp_sessions(client)] == [streaming.session_id]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
messages = st.fixed_dictionaries(
    {
        "jsonrpc": st.sampled_from(["2.0", "1.0", 2]),
        "method": st.sampled_from(METHODS) | st.text(max_size=12),
    },
    optional={"id": st.integers() | st.text(max_size=8) | st.none(), "params": json_values},
)


@pytest.fixture
async def started(client: TestClient) -> RawMcp:
    """An initialized MCP session (shared by a property test's examples)."""
    return await RawMcp(client).start()


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=messages | json_values)
async def test_no_message_gets_a_500(client: TestClient, started: RawMcp, body: Any) -> None:
    headers = {**started.headers, "Mcp-Session-Id": started.session_id, "Content-Type": "application/json"}
    response = await client.post("/mcp", data=json.dumps(body), headers=headers)
    assert response.status in (200, 202, 400, 404), await response.text()
    if response.status != 202:
        reply = await response.json()
        assert "error" in reply or "result" in reply
    assert await started.post("ping") == {}  # the session survives whatever came before


async def test_a_second_message_interrupts_or_queues_as_asked(client: TestClient) -> None:
    received = Notifications()
    async with connect(client, received) as mcp:
        await mcp.set_logging_level("info")
        first = await call(mcp, "session_message", content="slow [emu:tps=5] [emu:tokens=500]")
        session_id = first["session_id"]
        await received.wait_for(lambda e: e["type"] == "assistant_text")
        refused = await mcp.call_tool("session_message", {"session_id": session_id, "content": "again"})
        assert refused.is_error
        second = await call(
            mcp, "session_message", session_id=session_id, content="Hello", multitask_strategy="interrupt"
        )
        queued = await call(
            mcp, "session_message", session_id=session_id, content="Bye", multitask_strategy="enqueue"
        )
        assert second["run_id"] and queued["status"] in ("queued", "running")
        status = await call(mcp, "session_status", session_id=session_id)
        while status["messages"] < 6:
            await received.wait_for(lambda e: e["type"] == "done")
            status = await call(mcp, "session_status", session_id=session_id)
    body = await (await client.get(f"/sessions/{session_id}")).json()
    users = [m["content"][0]["text"] for m in body["messages"] if m["role"] == "user"]
    assert users == ["slow [emu:tps=5] [emu:tokens=500]", "Hello", "Bye"]
    assert body["messages"][1].get("interrupted") is True
