"""``/api/chat`` (AI SDK UI message stream) and ``/ag-ui`` (AG-UI) over HTTP: client-chosen session
ids, errors before and after a stream starts, resuming by id, and one session followed at once
over the session SSE dialect, WebSocket, the AI SDK and AG-UI (parity)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient

from tests.conftest import ClientFactory, services_of, sse_blocks, sse_events

ALICE = {"Authorization": "Bearer key-alice"}
BOB = {"Authorization": "Bearer key-bob"}
WAIT_S = 10.0


def chat_body(chat_id: str, text: str, **extra: Any) -> dict[str, Any]:
    message = {"id": "u1", "role": "user", "parts": [{"type": "text", "text": text}]}
    return {"id": chat_id, "messages": [message], "trigger": "submit-message", **extra}


def agui_body(thread_id: str, text: str, **extra: Any) -> dict[str, Any]:
    message = {"id": "u1", "role": "user", "content": text}
    return {
        "threadId": thread_id,
        "runId": "r1",
        "messages": [message],
        "tools": [],
        "context": [],
        "state": {},
        "forwardedProps": {},
        **extra,
    }


async def ai_sdk_parts(response: aiohttp.ClientResponse) -> list[tuple[str | None, Any]]:
    """(SSE id, parsed data) of each block; ``[DONE]`` as the string."""
    out = []
    async for block in sse_blocks(response):
        data = block["data"]
        out.append((block.get("id"), data if data == "[DONE]" else json.loads(data)))
    return out


async def test_chat_streams_the_query_with_ids_and_ends_with_done(client: TestClient) -> None:
    async with client.post("/api/chat", json=chat_body("c1", "What is 3+4?")) as response:
        assert response.status == 200
        assert response.headers["x-vercel-ai-ui-message-stream"] == "v1"
        parts = await ai_sdk_parts(response)
    assert parts[-1] == (None, "[DONE]")
    ids = [int(part_id) for part_id, _ in parts[:-1]]
    assert ids == sorted(ids) and ids[0] == 1
    types = [data["type"] for _, data in parts[:-1]]
    assert types[0] == "start" and types[-1] == "finish"
    assert types.count("start-step") == types.count("finish-step") == 2
    # The same session, by the id the client chose.
    session = await (await client.get("/sessions/c1")).json()
    assert session["status"] == "idle" and len(session["messages"]) == 4


@pytest.mark.slow
@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"id": "c", "messages": []}, 422),
        ({"id": "c"}, 422),
        ({"id": "", "messages": chat_body("c", "x")["messages"]}, 422),
        ({"id": "a/b", "messages": chat_body("c", "x")["messages"]}, 422),
        ({"id": "x" * 129, "messages": chat_body("c", "x")["messages"]}, 422),
        ({"id": "c", "messages": [{"role": "robot", "parts": [{"type": "text", "text": "hi"}]}]}, 422),
        ({"id": "c", "messages": [{"role": "assistant", "parts": [{"type": "text", "text": "hi"}]}]}, 422),
        ({"id": "c", "messages": [{"role": "user", "parts": [{"type": "file", "url": "x"}]}]}, 422),
        ({"id": "c", "messages": [{"role": "user", "parts": "hi"}]}, 422),
        ([1, 2], 422),
    ],
)
async def test_chat_refuses_bad_bodies(client: TestClient, body: Any, status: int) -> None:
    async with client.post("/api/chat", json=body) as response:
        assert response.status == status
        assert "error" in await response.json()
    async with client.post(
        "/api/chat", data=b"{not json", headers={"Content-Type": "application/json"}
    ) as response:
        assert response.status == 400


@pytest.mark.slow
@pytest.mark.parametrize(
    "body",
    [
        {**agui_body("t", "x"), "messages": []},
        {**agui_body("t", "x"), "messages": [{"id": "1", "role": "robot", "content": "hi"}]},
        {**agui_body("t", "x"), "messages": [{"id": "1", "role": "assistant", "content": "hi"}]},
        {**agui_body("t", "x"), "messages": [{"id": "1", "role": "user", "content": "  "}]},
        {**agui_body("t", "x"), "threadId": "a b"},
        {"threadId": "t", "messages": []},
    ],
)
async def test_ag_ui_refuses_bad_bodies(client: TestClient, body: Any) -> None:
    async with client.post("/ag-ui", json=body) as response:
        assert response.status == 422
        assert "error" in await response.json()


async def test_another_keys_chat_id_is_a_chat_of_ones_own_and_a_running_query_conflicts(
    make_client: ClientFactory,
) -> None:
    client = await make_client(api_keys=["key-alice", "key-bob"], tool_timeout_s=60)
    async with client.post(
        "/api/chat", json=chat_body("mine", "go [emu:tool=sleepy]"), headers=ALICE
    ) as first:
        assert first.status == 200
        # Bob cannot reach or guess into Alice's chat, by either protocol: the id names a chat of
        # his own (ids are per key), which does not see Alice's running query.
        async with client.get("/api/chat/mine/stream", headers=BOB) as response:
            assert response.status == 204
        for path, body in (("/api/chat", chat_body("mine", "hi")), ("/ag-ui", agui_body("mine", "hi"))):
            async with client.post(path, json=body, headers=BOB) as response:
                assert response.status == 200
                await response.read()
        # Alice's second query while the first runs: 409, in JSON, before any stream.
        for path, body in (("/api/chat", chat_body("mine", "hi")), ("/ag-ui", agui_body("mine", "hi"))):
            async with client.post(path, json=body, headers=ALICE) as response:
                assert response.status == 409
                assert "already running" in (await response.json())["error"]
        async with client.post("/api/chat", json=chat_body("mine", "hi")) as response:
            assert response.status == 401
        assert (await client.post("/sessions/mine/cancel", headers=ALICE)).status == 202
        parts = await ai_sdk_parts(first)
    assert [data["type"] for _, data in parts[-3:-1]] == ["abort", "finish"]


async def test_resume_routes_answer_204_when_nothing_runs(client: TestClient) -> None:
    async with client.post("/api/chat", json=chat_body("idle", "hello")) as response:
        await response.read()
    for path in ("/api/chat/idle/stream", "/ag-ui/idle/events"):
        async with client.get(path) as response:
            assert response.status == 204
    async with client.get("/ag-ui/nope/events") as response:
        assert response.status == 404


async def test_chat_resume_of_a_chat_not_posted_yet_or_another_keys_is_204(
    make_client: ClientFactory,
) -> None:
    """``useChat({resume: true})`` asks on every mount, a new chat's included."""
    client = await make_client(api_keys=["key-alice", "key-bob"])
    async with client.get("/api/chat/fresh/stream", headers=ALICE) as response:
        assert response.status == 204
    async with client.get("/sessions/fresh", headers=ALICE) as response:
        assert response.status == 404  # asking made nothing
    async with client.get("/api/chat/fresh/stream", headers={**ALICE, "Last-Event-ID": "x"}) as response:
        assert response.status == 400
    async with client.get("/api/chat/a%20b/stream", headers=ALICE) as response:
        assert response.status == 404  # no chat can have that id
    async with client.post("/api/chat", json=chat_body("fresh", "hello"), headers=ALICE) as response:
        await response.read()
    async with client.get("/api/chat/fresh/stream", headers=ALICE) as response:
        assert response.status == 204
    # Ids are per key: Alice's chat is a chat Bob has not posted yet, and tells him nothing.
    async with client.post("/api/chat", json=chat_body("fresh", "slow [emu:ttft=5000]"), headers=ALICE):
        pass
    async with client.get("/api/chat/fresh/stream", headers=BOB) as response:
        assert response.status == 204
    async with client.post("/sessions/fresh/cancel", headers=ALICE) as response:
        assert response.status == 202
    async with client.get("/api/chat/fresh/stream") as response:
        assert response.status == 401


async def test_resume_after_last_event_id_continues_the_open_blocks(make_client: ClientFactory) -> None:
    client = await make_client(tool_timeout_s=60)
    async with client.post(
        "/api/chat", json=chat_body("res", "go [emu:tool=sleepy] [emu:reasoning]")
    ) as first:
        seen = []
        async for block in sse_blocks(first):
            seen.append((int(block["id"]), json.loads(block["data"])))
            if seen[-1][1]["type"] == "tool-input-available":
                break
    # Resume from the middle of the reasoning block: the rest of it, with the block id seen.
    reasoning = [(entry_id, part) for entry_id, part in seen if part["type"] == "reasoning-delta"]
    middle, block_id = reasoning[1][0], reasoning[1][1]["id"]
    headers = {"Last-Event-ID": str(middle)}
    async with client.get("/api/chat/res/stream", headers=headers) as resumed:
        assert resumed.status == 200
        parts = []
        async for block in sse_blocks(resumed):
            parts.append((int(block["id"]), json.loads(block["data"])))
            if parts[-1][1]["type"] == "tool-input-available":
                break
    assert parts[0][0] == middle + 1
    assert all(
        part.get("id", block_id) == block_id for _, part in parts if part["type"].startswith("reasoning")
    )
    assert [part for _, part in parts] == [part for entry_id, part in seen if entry_id > middle]
    async with client.get("/ag-ui/res/events", headers=headers) as resumed:
        events = []
        async for block in sse_blocks(resumed):
            events.append((int(block["id"]), json.loads(block["data"])))
            if events[-1][1]["type"] == "TOOL_CALL_END":
                break
    assert events[0][0] == middle + 1 and events[0][1]["type"] == "REASONING_MESSAGE_CONTENT"
    async with client.get("/ag-ui/res/events", headers={"Last-Event-ID": "9999"}) as response:
        assert response.status == 400
    await client.post("/sessions/res/cancel")


# -- parity -------------------------------------------------------------------------------------

# Which session-dialect event each projected part stands for.
AI_SDK_OF = {
    "start": "processing",
    "reasoning-delta": "reasoning_text",
    "text-delta": "assistant_text",
    "tool-input-start": "tool_use_start",
    "tool-input-delta": "tool_input_delta",
    "tool-input-available": "tool_use",
    "tool-output-available": "tool_result",
    "tool-output-error": "tool_result",
    "finish": "done",
}
AG_UI_OF = {
    "RUN_STARTED": "processing",
    "REASONING_MESSAGE_CONTENT": "reasoning_text",
    "TEXT_MESSAGE_CONTENT": "assistant_text",
    "TOOL_CALL_START": "tool_use_start",
    "TOOL_CALL_ARGS": "tool_input_delta",
    "TOOL_CALL_END": "tool_use",
    "TOOL_CALL_RESULT": "tool_result",
    "RUN_FINISHED": "done",
}


async def _collect(
    frames: Any,
    out: list[tuple[int, dict[str, Any]]],
    marker: Callable[[dict[str, Any]], bool],
    seen: asyncio.Event,
) -> None:
    async for entry_id, payload in frames:
        out.append((entry_id, payload))
        if marker(payload):
            seen.set()


async def _sse(response: aiohttp.ClientResponse) -> Any:
    async for block in sse_blocks(response):
        if "id" in block and block["data"] != "[DONE]":
            yield int(block["id"]), json.loads(block["data"])


async def _ws(ws: aiohttp.ClientWebSocketResponse) -> Any:
    async for message in ws:
        frame = json.loads(message.data)
        if "id" in frame:
            yield frame["id"], frame
            if frame["type"] == "done":
                return


@pytest.mark.slow
async def test_one_session_over_four_dialects_in_the_same_order(make_client: ClientFactory) -> None:
    client = await make_client(tool_timeout_s=60)
    ai_sdk = await client.post("/api/chat", json=chat_body("par", "go [emu:tool=sleepy] [emu:reasoning]"))
    assert ai_sdk.status == 200
    ag_ui = await client.get("/ag-ui/par/events")
    session = await client.get("/sessions/par/events?last_event_id=0")
    ws = await client.ws_connect("/ws")
    await ws.send_json({"type": "subscribe", "session_id": "par", "last_event_id": 0})
    streams = {
        "ai_sdk": (_sse(ai_sdk), lambda p: p["type"] == "tool-input-available"),
        "ag_ui": (_sse(ag_ui), lambda p: p["type"] == "TOOL_CALL_END"),
        "session": (_sse(session), lambda p: p["type"] == "tool_use"),
        "ws": (_ws(ws), lambda p: p["type"] == "tool_use"),
    }
    got: dict[str, list[tuple[int, dict[str, Any]]]] = {name: [] for name in streams}
    seen = {name: asyncio.Event() for name in streams}
    tasks = [
        asyncio.create_task(_collect(frames, got[name], marker, seen[name]))
        for name, (frames, marker) in streams.items()
    ]
    async with asyncio.timeout(WAIT_S):
        await asyncio.gather(*(event.wait() for event in seen.values()))
        # Every reader is at the running tool: stop the query, and each sees the end.
        assert (await client.post("/sessions/par/cancel")).status == 202
        await asyncio.gather(*tasks)
    await ws.close()
    for response in (ai_sdk, ag_ui, session):
        response.release()

    timeline = [(entry_id, payload["type"]) for entry_id, payload in got["session"]]
    assert [(entry_id, payload["type"]) for entry_id, payload in got["ws"]] == timeline
    assert [payload for _, payload in got["ws"]] == [
        {**payload, "session_id": "par"} for _, payload in got["session"]
    ]
    kinds = dict(timeline)
    for name, table in (("ai_sdk", AI_SDK_OF), ("ag_ui", AG_UI_OF)):
        projected = [(entry_id, table[p["type"]]) for entry_id, p in got[name] if p["type"] in table]
        # Each part stands for the session event with its id, and every such event has its part.
        assert all(kinds[entry_id] == kind for entry_id, kind in projected), name
        assert projected == [(i, kind) for i, kind in timeline if kind in set(table.values())], name
    texts = {
        "session": "".join(p["text"] for _, p in got["session"] if p["type"] == "reasoning_text"),
        "ai_sdk": "".join(p["delta"] for _, p in got["ai_sdk"] if p["type"] == "reasoning-delta"),
        "ag_ui": "".join(p["delta"] for _, p in got["ag_ui"] if p["type"] == "REASONING_MESSAGE_CONTENT"),
    }
    assert len(set(texts.values())) == 1 and texts["session"]
    assert got["ag_ui"][-1][1]["result"]["cancelled"] is True


async def test_sse_events_helper_is_json(client: TestClient) -> None:
    # The AG-UI stream is plain JSON data lines, parsed as any SSE client would.
    async with client.post("/ag-ui", json=agui_body("plain", "hello")) as response:
        events = [event async for event in sse_events(response)]
    assert events[0]["data"]["type"] == "RUN_STARTED" and events[-1]["data"]["type"] == "RUN_FINISHED"
    assert all("id" in event for event in events)


# -- tool approvals through the protocols' own shapes -------------------------------------------

TWO_SUMS = "Two sums [emu:tools=2]"


@pytest.fixture
async def approving(make_client: ClientFactory) -> TestClient:
    return await make_client(tools_require_approval="calculator", approval_timeout_s=60)


async def responses_logged(client: TestClient, session_id: str) -> list[Any]:
    session = await services_of(client).sessions.get(session_id)
    return [
        entry.event for entry in await session.log.read(0) if entry.event.type == "tool_approval_response"
    ]


async def chat_waiting(client: TestClient, chat_id: str, text: str = TWO_SUMS) -> list[dict[str, Any]]:
    """A chat whose query waits on its approvals: their ``tool-approval-request`` parts."""
    async with client.post("/api/chat", json=chat_body(chat_id, text)) as response:
        assert response.status == 200
        parts = [data for _, data in await ai_sdk_parts(response) if data != "[DONE]"]
    assert parts[-1] == {"type": "finish", "finishReason": "tool-calls"}
    return [part for part in parts if part["type"] == "tool-approval-request"]


def chat_answers(chat_id: str, answers: list[tuple[dict[str, Any], dict[str, Any]]]) -> dict[str, Any]:
    """The request ``addToolApprovalResponse`` leads to: each (request part, approval) answered."""
    parts = [
        {
            "type": "dynamic-tool",
            "toolName": "calculator",
            "toolCallId": request["toolCallId"],
            "state": "approval-responded",
            "input": {},
            "approval": {"id": request["approvalId"], **approval},
        }
        for request, approval in answers
    ]
    return {"id": chat_id, "messages": [{"id": "a1", "role": "assistant", "parts": parts}]}


async def ag_ui_waiting(client: TestClient, thread_id: str, text: str = TWO_SUMS) -> list[dict[str, Any]]:
    """A thread whose query waits on its approvals: the interrupts its run finished with."""
    async with client.post("/ag-ui", json=agui_body(thread_id, text)) as response:
        assert response.status == 200
        events = [event["data"] async for event in sse_events(response)]
    assert events[-1]["type"] == "RUN_FINISHED" and events[-1]["outcome"]["type"] == "interrupt"
    return events[-1]["outcome"]["interrupts"]  # type: ignore[no-any-return]


def ag_ui_resume(thread_id: str, answers: list[tuple[str, Any]]) -> dict[str, Any]:
    resume = [
        {"interruptId": interrupt_id, "status": "resolved", "payload": payload}
        for interrupt_id, payload in answers
    ]
    return {**agui_body(thread_id, "unused"), "runId": "r2", "messages": [], "resume": resume}


@pytest.mark.parametrize("reason", ["r" * 2001, "\ud800"], ids=["too long", "lone surrogate"])
async def test_a_bad_reason_in_a_chat_answer_is_422_and_changes_nothing(
    approving: TestClient, caplog: pytest.LogCaptureFixture, reason: str
) -> None:
    caplog.set_level(logging.WARNING)
    first, second = await chat_waiting(approving, "bad-reason")
    body = chat_answers(
        "bad-reason", [(first, {"approved": True, "reason": reason}), (second, {"approved": True})]
    )
    async with approving.post("/api/chat", json=body) as response:
        assert response.status == 422, await response.text()
        error = (await response.json())["error"]
    assert "reason" in error and "messages.0.parts.0.approval" in error
    assert await responses_logged(approving, "bad-reason") == []
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR]


async def test_a_chat_answer_is_all_or_nothing_and_answers_the_whole_turn(
    approving: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    first, second = await chat_waiting(approving, "chat-two")
    # One of two answered: refused, naming the one left, and nothing applied.
    async with approving.post(
        "/api/chat", json=chat_answers("chat-two", [(first, {"approved": True})])
    ) as response:
        assert response.status == 409
        refused = await response.json()
    assert refused["unanswered"] == [second["approvalId"]] and second["approvalId"] in refused["error"]
    # A good answer beside one that names no approval: the 404, and the good one not applied either.
    unknown = {**second, "approvalId": "ap_nope"}
    mixed = chat_answers("chat-two", [(first, {"approved": True}), (unknown, {"approved": True})])
    async with approving.post("/api/chat", json=mixed) as response:
        assert response.status == 404
    assert await responses_logged(approving, "chat-two") == []
    assert (await (await approving.get("/sessions/chat-two")).json())["status"] == "waiting"
    both = chat_answers("chat-two", [(first, {"approved": True}), (second, {"approved": False})])
    async with approving.post("/api/chat", json=both) as response:
        assert response.status == 200
        parts = [data for _, data in await ai_sdk_parts(response) if data != "[DONE]"]
    assert {"type": "tool-output-denied", "toolCallId": second["toolCallId"]} in parts
    assert any(p["type"] == "tool-output-available" and p["toolCallId"] == first["toolCallId"] for p in parts)
    assert parts[-1]["type"] == "finish" and parts[-1]["finishReason"] == "stop"
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR]


@pytest.mark.slow
async def test_an_ag_ui_resume_is_all_or_nothing_and_answers_the_whole_turn(
    approving: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    first, second = await ag_ui_waiting(approving, "thread-two")
    async with approving.post(
        "/ag-ui", json=ag_ui_resume("thread-two", [(first["id"], {"approved": True})])
    ) as response:
        assert response.status == 409
        refused = await response.json()
    assert refused["unanswered"] == [second["id"]] and second["id"] in refused["error"]
    mixed = ag_ui_resume("thread-two", [(first["id"], {"approved": True}), ("ap_nope", {"approved": True})])
    async with approving.post("/ag-ui", json=mixed) as response:
        assert response.status == 404
    bad_input = ag_ui_resume(
        "thread-two",
        [(first["id"], {"approved": True}), (second["id"], {"approved": True, "input": {"expression": 5}})],
    )
    async with approving.post("/ag-ui", json=bad_input) as response:
        assert response.status == 422
    assert await responses_logged(approving, "thread-two") == []
    both = ag_ui_resume("thread-two", [(first["id"], {"approved": True}), (second["id"], {"approved": True})])
    async with approving.post("/ag-ui", json=both) as response:
        assert response.status == 200
        events = [event["data"] async for event in sse_events(response)]
    assert events[0]["type"] == "RUN_STARTED" and events[-1]["type"] == "RUN_FINISHED"
    assert [e["content"] for e in events if e["type"] == "TOOL_CALL_RESULT"] == ["2", "4"]
    assert len(await responses_logged(approving, "thread-two")) == 2
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR]
