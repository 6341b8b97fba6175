"""Tool calls that wait for a person's approval, over real HTTP, WebSocket and MCP.

The service runs with ``AGENT_TOOLS_REQUIRE_APPROVAL=calculator`` against the embedded emulator;
expiry is driven by a clock the test moves, never by sleeping.
"""

from __future__ import annotations

import asyncio
import json
from contextlib import aclosing
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from service.core.log import LogEntry
from tests.conftest import ClientFactory, services_of, sse_events
from tests.support.clock import ManualClock
from tests.support.sessions import new_session
from tests.transports.test_mcp import Notifications, connect
from tests.transports.test_sessions import send

SIX_BY_SEVEN = "What is 6*7?"


@pytest.fixture
async def approving(make_client: ClientFactory) -> TestClient:
    """The service with the calculator behind approval and a clock the test moves."""
    client = await make_client(tools_require_approval="calculator", approval_timeout_s=60)
    desk = services_of(client).runs.approvals
    desk.clock = ManualClock()
    return client


def clock_of(client: TestClient) -> ManualClock:
    return services_of(client).runs.approvals.clock  # type: ignore[no-any-return]


async def logged(client: TestClient, session_id: str, kind: str, count: int = 1) -> list[LogEntry]:
    """Wait (on the log itself) until ``count`` events of type ``kind`` are logged; all entries so far."""
    session = await services_of(client).sessions.get(session_id)
    seen: list[LogEntry] = []
    async with aclosing(session.log.subscribe(0)) as batches:
        async for batch in batches:
            seen += batch
            if sum(entry.event.type == kind for entry in seen) >= count:
                return seen
    raise AssertionError(f"the log ended before {count} {kind}")


async def requests_of(client: TestClient, session_id: str, count: int = 1) -> list[Any]:
    entries = await logged(client, session_id, "tool_approval_request", count)
    return [entry.event for entry in entries if entry.event.type == "tool_approval_request"]


async def answer(
    client: TestClient, session_id: str, approval_id: str, body: Any, status: int = 200, **kwargs: Any
) -> dict[str, Any]:
    async with client.post(
        f"/sessions/{session_id}/approvals/{approval_id}", json=body, **kwargs
    ) as response:
        assert response.status == status, await response.text()
        return await response.json()  # type: ignore[no-any-return]


async def events_until_done(client: TestClient, session_id: str) -> list[dict[str, Any]]:
    """The session's events from the start to the query's end, as a session SSE client sees them."""
    async with client.get(f"/sessions/{session_id}/events", headers={"Last-Event-ID": "0"}) as response:
        assert response.status == 200
        events = []
        async for event in sse_events(response):
            events.append(event["data"])
            if event["data"]["type"] in {"done", "error"}:
                return events
    raise AssertionError("the stream ended without done")


async def waiting(client: TestClient, content: str = SIX_BY_SEVEN, count: int = 1) -> tuple[str, list[Any]]:
    """A session whose query waits on ``count`` approvals."""
    session_id = await new_session(client)
    await send(client, session_id, content)
    return session_id, await requests_of(client, session_id, count)


async def test_approved_the_tool_runs_and_the_query_goes_on(approving: TestClient) -> None:
    session_id, [request] = await waiting(approving)
    assert request.tool == "calculator" and request.input == {"expression": "6*7"}
    assert request.expires_at == pytest.approx(clock_of(approving).now() + 60)
    async with approving.get(f"/sessions/{session_id}") as response:
        body = await response.json()
    assert body["status"] == "waiting"
    [pending] = body["pending_approvals"]
    assert pending["approval_id"] == request.approval_id and pending["toolInput"] == {"expression": "6*7"}
    assert pending["toolName"] == "calculator" and pending["toolUseId"] == request.tool_use_id
    reply = await answer(approving, session_id, request.approval_id, {"approved": True})
    assert reply == {"approval_id": request.approval_id, "approved": True}
    events = await events_until_done(approving, session_id)
    types = [event["type"] for event in events]
    start = types.index("tool_approval_request")
    assert types[start : start + 5] == [
        "tool_approval_request",
        "status_change",
        "tool_approval_response",
        "status_change",
        "tool_executing",
    ]
    assert [event["status"] for event in events if event["type"] == "status_change"] == [
        "running",
        "waiting",
        "running",
        "idle",
    ]
    response = next(event for event in events if event["type"] == "tool_approval_response")
    assert response == {**response, "approved": True, "reason": "", "by": "http"}
    result = next(event for event in events if event["type"] == "tool_result")
    assert result["result"] == "42" and not result["isError"]
    async with approving.get(f"/sessions/{session_id}") as response:
        body = await response.json()
    assert body["status"] == "idle" and body["pending_approvals"] == []


async def test_denied_the_model_hears_the_reason_and_goes_on(approving: TestClient) -> None:
    session_id, [request] = await waiting(approving)
    await answer(approving, session_id, request.approval_id, {"approved": False, "reason": "not today"})
    events = await events_until_done(approving, session_id)
    assert "tool_executing" not in [event["type"] for event in events]
    result = next(event for event in events if event["type"] == "tool_result")
    assert result["isError"] and "declined" in result["result"] and "not today" in result["result"]
    assert events[-1]["type"] == "done" and events[-1]["turns"] == 2
    session = await services_of(approving).sessions.get(session_id)
    blocks = session.messages[2]["content"]
    assert blocks[0]["toolResult"]["status"] == "error"


async def test_an_edited_input_is_checked_then_run_and_kept(approving: TestClient) -> None:
    session_id, [request] = await waiting(approving)
    refused = await answer(
        approving, session_id, request.approval_id, {"approved": True, "input": {"expression": 5}}, 422
    )
    assert "expression" in refused["error"]
    async with approving.get(f"/sessions/{session_id}") as response:
        assert len((await response.json())["pending_approvals"]) == 1  # still waiting
    edited = {"approved": True, "input": {"expression": "2+2"}}
    await answer(approving, session_id, request.approval_id, edited)
    events = await events_until_done(approving, session_id)
    result = next(event for event in events if event["type"] == "tool_result")
    assert result["result"] == "4"
    response = next(event for event in events if event["type"] == "tool_approval_response")
    assert response["toolInput"] == {"expression": "2+2"}
    session = await services_of(approving).sessions.get(session_id)
    assert session.messages[1]["content"][-1]["toolUse"]["input"] == {"expression": "2+2"}
    assert events[-1]["tool_calls"][0]["input"] == {"expression": "2+2"}


async def test_an_unanswered_request_expires_as_denied(approving: TestClient) -> None:
    session_id, [request] = await waiting(approving)
    clock = clock_of(approving)
    await clock.wait_sleepers(1)
    clock.advance(59)
    assert await services_of(approving).sessions.get(session_id)  # nothing changed yet
    clock.advance(2)
    events = await events_until_done(approving, session_id)
    response = next(event for event in events if event["type"] == "tool_approval_response")
    assert response == {**response, "approved": False, "reason": "expired", "by": "timeout"}
    result = next(event for event in events if event["type"] == "tool_result")
    assert result["isError"] and "expired" in result["result"]
    # Too late now, whichever the answer: the expiry answered it, and a denial is no repeat of it.
    for approved in (True, False):
        late = await answer(approving, session_id, request.approval_id, {"approved": approved}, 409)
        assert "expired" in late["error"]


async def test_a_second_answer_is_the_same_or_a_conflict(approving: TestClient) -> None:
    session_id, [request] = await waiting(approving)
    both = await asyncio.gather(
        *(answer(approving, session_id, request.approval_id, {"approved": True}) for _ in range(5))
    )
    assert all(reply == {"approval_id": request.approval_id, "approved": True} for reply in both)
    conflict = await answer(approving, session_id, request.approval_id, {"approved": False}, 409)
    assert "already answered: approved" in conflict["error"]
    events = await events_until_done(approving, session_id)
    assert [event["type"] for event in events].count("tool_approval_response") == 1


async def test_two_calls_in_one_turn_wait_for_both_answers(approving: TestClient) -> None:
    session_id, requests = await waiting(approving, "Two sums [emu:tools=2]", count=2)
    assert len({request.approval_id for request in requests}) == 2
    await answer(approving, session_id, requests[0].approval_id, {"approved": True})
    await logged(approving, session_id, "tool_approval_response")
    async with approving.get(f"/sessions/{session_id}") as response:
        body = await response.json()
    assert body["status"] == "waiting"
    assert [pending["approval_id"] for pending in body["pending_approvals"]] == [requests[1].approval_id]
    await answer(
        approving, session_id, requests[1].approval_id, {"approved": False, "reason": "one is enough"}
    )
    events = await events_until_done(approving, session_id)
    results = {event["toolUseId"]: event for event in events if event["type"] == "tool_result"}
    assert results[requests[0].tool_use_id]["result"] == "2"
    assert results[requests[1].tool_use_id]["isError"]
    assert events[-1]["type"] == "done"


async def test_cancel_while_waiting_ends_the_query_as_cancelled(approving: TestClient) -> None:
    session_id, [request] = await waiting(approving)
    async with approving.post(f"/sessions/{session_id}/cancel") as response:
        assert (await response.json())["cancelled"] is True
    events = await events_until_done(approving, session_id)
    assert events[-1]["type"] == "done" and events[-1]["cancelled"] is True
    assert clock_of(approving).sleepers == 0
    closed = await answer(approving, session_id, request.approval_id, {"approved": True}, 409)
    assert "no longer pending" in closed["error"]
    async with approving.get(f"/sessions/{session_id}") as response:
        body = await response.json()
    assert body["status"] == "idle" and body["pending_approvals"] == []
    # The session is free: the next query starts (and asks again).
    await send(approving, session_id, SIX_BY_SEVEN)
    [_, again] = await requests_of(approving, session_id, 2)
    await answer(approving, session_id, again.approval_id, {"approved": True})
    entries = await logged(approving, session_id, "done", 2)
    assert not entries[-1].event.cancelled  # type: ignore[union-attr]


async def test_unknown_approvals_and_other_keys_get_404(make_client: ClientFactory) -> None:
    client = await make_client(tools_require_approval="*", api_keys=["key-alice", "key-bob"])
    alice, bob = {"Authorization": "Bearer key-alice"}, {"Authorization": "Bearer key-bob"}
    async with client.post("/sessions", json={}, headers=alice) as response:
        session_id = (await response.json())["id"]
    async with client.post(f"/sessions/{session_id}/messages", json={"content": SIX_BY_SEVEN}, headers=alice):
        pass
    [request] = await requests_of(client, session_id)
    missing = await answer(client, session_id, "ap_nope", {"approved": True}, 404, headers=alice)
    assert "no approval" in missing["error"]
    theirs = await answer(client, session_id, request.approval_id, {"approved": True}, 404, headers=bob)
    assert theirs == {"error": "Session not found"}
    await answer(client, "no-such-session", request.approval_id, {"approved": True}, 404, headers=alice)
    await answer(client, session_id, request.approval_id, {"approved": True}, headers=alice)


@pytest.mark.slow
@pytest.mark.parametrize(
    "body",
    [
        {},
        {"approved": "yes"},
        {"approved": 1},
        {"approved": True, "input": [1]},
        {"approved": True, "reason": 5},
    ],
)
async def test_bad_bodies_are_422_and_change_nothing(approving: TestClient, body: Any) -> None:
    session_id, [request] = await waiting(approving)
    last = await (await services_of(approving).sessions.get(session_id)).log.last_id()
    await answer(approving, session_id, request.approval_id, body, 422)
    session = await services_of(approving).sessions.get(session_id)
    assert await session.log.last_id() == last and session.status == "waiting"


async def test_answer_over_websocket(approving: TestClient) -> None:
    session_id, [request] = await waiting(approving)
    async with approving.ws_connect("/ws") as ws:
        await ws.send_json(
            {"type": "approve", "session_id": session_id, "approval_id": "ap_nope", "approved": True}
        )
        refused = await ws.receive_json()
        assert (
            refused["type"] == "error"
            and refused["code"] == "not_found"
            and refused["approval_id"] == "ap_nope"
        )
        await ws.send_json({"type": "approve", "session_id": session_id, "approval_id": request.approval_id})
        invalid = await ws.receive_json()
        assert invalid["code"] == "invalid" and invalid["request_type"] == "approve"
        await ws.send_json({"type": "subscribe", "session_id": session_id, "last_event_id": 0})
        message = {"type": "approve", "session_id": session_id, "approval_id": request.approval_id}
        await ws.send_json({**message, "approved": True, "reason": "fine"})
        frames: list[dict[str, Any]] = []
        while not frames or frames[-1].get("type") != "done":
            frames.append(await ws.receive_json())
        answered = next(frame for frame in frames if frame["type"] == "approval_answered")
        assert answered == {"type": "approval_answered", "session_id": session_id, **answered}
        assert answered["approved"] is True
        types = [frame["type"] for frame in frames]
        assert "tool_approval_request" in types and "tool_approval_response" in types
        response = next(frame for frame in frames if frame["type"] == "tool_approval_response")
        assert response["by"] == "ws" and response["reason"] == "fine"
        await ws.send_json({**message, "approved": False})
        conflict = await ws.receive_json()
        assert conflict["code"] == "conflict"


async def test_answer_over_mcp_and_its_notifications(approving: TestClient) -> None:
    received = Notifications()
    async with connect(approving, received) as mcp:
        await mcp.set_logging_level("warning")
        started = await mcp.call_tool("session_message", {"content": SIX_BY_SEVEN})
        assert started.structured_content is not None
        session_id = started.structured_content["session_id"]
        notified = await received.wait_for(lambda data: data["type"] == "tool_approval_request")
        assert notified["session_id"] == session_id and notified["status"] == "awaiting_approval"
        assert notified["toolName"] == "calculator" and notified["toolInput"] == {"expression": "6*7"}
        assert next(item for item in received.items if item.data is notified).level == "warning"
        status = await mcp.call_tool("session_status", {"session_id": session_id})
        assert status.structured_content is not None
        assert status.structured_content["status"] == "waiting"
        [pending] = status.structured_content["pending_approvals"]
        assert pending["approval_id"] == notified["approval_id"]
        args = {"session_id": session_id, "approval_id": notified["approval_id"], "approved": True}
        result = await mcp.call_tool("session_approve", args)
        assert not result.is_error
        assert result.structured_content == {
            "session_id": session_id,
            "approval_id": notified["approval_id"],
            "approved": True,
        }
        again = await mcp.call_tool("session_approve", {**args, "approved": False})
        assert again.is_error and "already answered" in json.dumps(again.structured_content)
        unknown = await mcp.call_tool("session_approve", {**args, "approval_id": "ap_nope"})
        assert unknown.is_error
    events = await events_until_done(approving, session_id)
    assert next(event for event in events if event["type"] == "tool_approval_response")["by"] == "mcp"


async def test_polling_and_the_steps_dialect_carry_the_request(approving: TestClient) -> None:
    session_id = await new_session(approving)
    async with approving.get(f"/sessions/{session_id}/stream", params={"query": SIX_BY_SEVEN}) as stream:
        assert stream.status == 200
        steps = []
        async for event in sse_events(stream):
            steps.append(event["data"])
            if event["data"].get("step_type") == "approval":
                async with approving.get(f"/sessions/{session_id}/events/poll") as response:
                    poll = await response.json()
                polled = [event for event in poll["events"] if event["type"] == "tool_approval_request"]
                assert poll["status"] == "waiting" and len(polled) == 1
                assert polled[0]["approval_id"] == event["data"]["approval_id"]
                await answer(approving, session_id, event["data"]["approval_id"], {"approved": True})
    approval = next(step for step in steps if step.get("step_type") == "approval")
    assert approval["tool"] == "calculator" and approval["input"] == {"expression": "6*7"}
    assert [step["type"] for step in steps][-2:] == ["final", "done"]


async def test_ai_sdk_and_ag_ui_answers_are_checked_like_every_other(approving: TestClient) -> None:
    """An answer through /api/chat or /ag-ui that names no approval is a 404, a malformed one a
    422, and a second, different answer a 409; nothing is logged for them."""
    session_id = await new_session(approving)
    await send(approving, session_id, 'Sum [emu:tool=calculator] [emu:tool_input={"expression": "1+1"}]')
    (request,) = await requests_of(approving, session_id)

    def chat(approval_id: str, approved: Any) -> dict[str, Any]:
        part = {
            "type": "dynamic-tool",
            "toolName": "calculator",
            "toolCallId": request.tool_use_id,
            "state": "approval-responded",
            "input": {},
            "approval": {"id": approval_id, "approved": approved},
        }
        return {"id": session_id, "messages": [{"id": "a1", "role": "assistant", "parts": [part]}]}

    def resume(interrupt_id: str, payload: Any) -> dict[str, Any]:
        return {
            "threadId": session_id,
            "runId": "run-2",
            "messages": [],
            "resume": [{"interruptId": interrupt_id, "status": "resolved", "payload": payload}],
        }

    for path, body, status in [
        ("/api/chat", chat("nope", True), 404),
        ("/api/chat", chat(request.approval_id, "yes"), 422),
        ("/ag-ui", resume("nope", {"approved": True}), 404),
        ("/ag-ui", resume(request.approval_id, {"approved": "yes"}), 422),
        ("/ag-ui", resume(request.approval_id, None), 422),
    ]:
        async with approving.post(path, json=body) as response:
            assert response.status == status, (path, body, await response.text())
            assert "error" in await response.json()
    await answer(approving, session_id, request.approval_id, {"approved": False})
    async with approving.post("/ag-ui", json=resume(request.approval_id, {"approved": True})) as response:
        assert response.status == 409
    events = await events_until_done(approving, session_id)
    assert sum(event["type"] == "tool_approval_response" for event in events) == 1
