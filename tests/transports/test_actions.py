"""A chat UI's actions over the native HTTP routes and the WebSocket: regenerate, edit,
browser-side tools and a second message while a query runs (``multitask_strategy``).

Run against the embedded emulator, on memory (and on Redis in the suite's Redis pass); every wait
is on the log itself.
"""

from __future__ import annotations

import asyncio
from contextlib import aclosing
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from service.core.log import LogEntry
from tests.conftest import services_of
from tests.support.clock import ManualClock
from tests.support.sessions import new_session

pytestmark = pytest.mark.fast


async def post(
    client: TestClient, session_id: str, body: dict[str, Any], status: int = 202
) -> dict[str, Any]:
    async with client.post(f"/sessions/{session_id}/messages", json=body) as response:
        assert response.status == status, await response.text()
        return await response.json()  # type: ignore[no-any-return]


async def entries_until(client: TestClient, session_id: str, done: int, after: int = 0) -> list[LogEntry]:
    """The session's entries after ``after`` until ``done`` queries have ended (``done``/``error``)."""
    session = await services_of(client).sessions.get(session_id)
    seen: list[LogEntry] = []
    async with aclosing(session.log.subscribe(after)) as batches:
        async for batch in batches:
            seen += batch
            if sum(entry.event.type in ("done", "error") for entry in seen) >= done:
                return seen
    raise AssertionError("the log ended first")


async def logged(client: TestClient, session_id: str, kind: str, after: int = 0) -> LogEntry:
    session = await services_of(client).sessions.get(session_id)
    async with aclosing(session.log.subscribe(after)) as batches:
        async for batch in batches:
            for entry in batch:
                if entry.event.type == kind:
                    return entry
    raise AssertionError(f"the log ended before a {kind}")


async def ask(client: TestClient, session_id: str, body: dict[str, Any]) -> list[LogEntry]:
    reply = await post(client, session_id, body)
    return await entries_until(client, session_id, 1, reply["after_id"])


async def conversation(client: TestClient, session_id: str) -> dict[str, Any]:
    async with client.get(f"/sessions/{session_id}") as response:
        assert response.status == 200
        return await response.json()  # type: ignore[no-any-return]


def texts(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(role, text) of each message, the messages carrying tool results left out."""
    return [
        (message["role"], "".join(block.get("text", "") for block in message["content"]))
        for message in messages
        if not any("toolResult" in block for block in message["content"])
    ]


def of_type(entries: list[LogEntry], kind: str) -> list[Any]:
    return [entry.event for entry in entries if entry.event.type == kind]


async def test_messages_keep_their_ids_and_the_answer_has_the_streamed_one(client: TestClient) -> None:
    session_id = await new_session(client)
    entries = await ask(client, session_id, {"content": "Hello there", "id": "u-1"})
    [started] = of_type(entries, "run_started")
    assert started.message_id == "u-1" and started.reply_id.startswith("msg_")
    body = await conversation(client, session_id)
    assert [message["id"] for message in body["messages"]] == ["u-1", started.reply_id]
    # The ids never reach the model: the emulator's request would refuse a key it does not know.
    assert of_type(entries, "done")[0].stop_reason == "end_turn"


async def test_regenerate_answers_the_question_again_in_place(client: TestClient) -> None:
    session_id = await new_session(client)
    await ask(client, session_id, {"content": "Tell me a story [emu:tokens=6]", "id": "q1"})
    first = await conversation(client, session_id)
    entries = await ask(client, session_id, {"regenerate": True})
    [rewound] = of_type(entries, "conversation_rewound")
    [started] = of_type(entries, "run_started")
    assert rewound.message_id == first["messages"][1]["id"] and rewound.kept == 1 and rewound.removed == 1
    assert started.message_id == "q1" and started.message == "Tell me a story [emu:tokens=6]"
    after = await conversation(client, session_id)
    assert [m["role"] for m in after["messages"]] == ["user", "assistant"]
    assert after["messages"][0] == first["messages"][0]
    assert after["messages"][1]["id"] == started.reply_id != first["messages"][1]["id"]
    # The session's usage counts the answer kept, not the one regenerated away.
    assert after["usage"]["input_tokens"] == first["usage"]["input_tokens"]


async def test_an_edit_cuts_back_and_the_model_sees_only_what_is_kept(make_client: Any) -> None:
    client = await make_client()
    fresh = await new_session(client)
    control = of_type(await ask(client, fresh, {"content": "Name a colour"}), "turn_completed")[0]
    session_id = await new_session(client)
    for text, message_id in (("Name a fruit", "a"), ("Name a city", "b"), ("Name a tree", "c")):
        await ask(client, session_id, {"content": text, "id": message_id})
    entries = await ask(client, session_id, {"content": "Name a colour", "edit": "a"})
    [rewound] = of_type(entries, "conversation_rewound")
    assert (rewound.message_id, rewound.kept, rewound.removed) == ("a", 0, 6)
    body = await conversation(client, session_id)
    assert texts(body["messages"])[0] == ("user", "Name a colour")
    assert [m["id"] for m in body["messages"]][0] == "a" and len(body["messages"]) == 2
    [turn] = of_type(entries, "turn_completed")
    assert turn.usage.input_tokens == control.usage.input_tokens


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"regenerate": "nope"}, 404),
        ({"content": "x", "edit": "nope"}, 404),
        ({"regenerate": True, "content": "x"}, 422),
        ({"regenerate": False}, 422),
        ({"content": "x", "multitask_strategy": "sometimes"}, 422),
        ({"content": "x", "tools": [{"name": "calculator"}]}, 422),
        ({"content": "x", "tools": [{"name": "a"}, {"name": "a"}]}, 422),
        ({"content": "x", "tools": [{"name": "has space"}]}, 422),
        ({"content": "x", "id": "bad id"}, 422),
    ],
)
async def test_bad_actions_are_refused_and_nothing_is_lost(
    client: TestClient, body: dict[str, Any], status: int
) -> None:
    session_id = await new_session(client)
    await ask(client, session_id, {"content": "Hello", "id": "h"})
    before = await conversation(client, session_id)
    reply = await post(client, session_id, body, status)
    assert isinstance(reply["error"], str)
    after = await conversation(client, session_id)
    assert after["messages"] == before["messages"] and after["status"] == "idle"


async def test_regenerate_of_an_empty_session_is_a_404(client: TestClient) -> None:
    session_id = await new_session(client)
    await post(client, session_id, {"regenerate": True}, 404)


LOCATION = {"name": "get_location", "description": "Where the user is", "input_schema": {"type": "object"}}


async def test_a_browser_tool_waits_for_its_result_beside_a_server_tool(client: TestClient) -> None:
    session_id = await new_session(client)
    reply = await post(
        client,
        session_id,
        {"content": "Where and what is 2+2? [emu:tool=get_location,calculator]", "tools": [LOCATION]},
    )
    request = (await logged(client, session_id, "client_tool_request", reply["after_id"])).event
    assert request.tool == "get_location"
    body = await conversation(client, session_id)
    assert body["status"] == "waiting"
    assert [call["toolUseId"] for call in body["pending_tool_calls"]] == [request.tool_use_id]
    # The server's own tool of that turn ran before the wait.
    session = await services_of(client).sessions.get(session_id)
    so_far = await session.log.read(reply["after_id"])
    assert [r.tool for r in of_type(so_far, "tool_result")] == ["calculator"]
    # An unknown call is a 404; the answer is taken once.
    async with client.post(f"/sessions/{session_id}/tool-results/nope", json={"output": 1}) as response:
        assert response.status == 404
    url = f"/sessions/{session_id}/tool-results/{request.tool_use_id}"
    async with client.post(url, json={"output": {"city": "Lyon"}}) as response:
        assert response.status == 200, await response.text()
    async with client.post(url, json={"output": {"city": "Paris"}}) as response:
        assert response.status == 409
    entries = await entries_until(client, session_id, 1, reply["after_id"])
    results = {r.tool: r for r in of_type(entries, "tool_result")}
    assert results["get_location"].result == '{"city":"Lyon"}' and not results["get_location"].is_error
    assert of_type(entries, "done")[0].stop_reason == "end_turn"
    assert (await conversation(client, session_id))["status"] == "idle"


async def test_an_unanswered_browser_tool_gets_an_error_result_at_its_timeout(make_client: Any) -> None:
    client = await make_client(client_tool_timeout_s=30)
    clock = ManualClock()
    services_of(client).runs.approvals.clock = clock
    session_id = await new_session(client)
    reply = await post(
        client, session_id, {"content": "Where am I? [emu:tool=get_location]", "tools": [LOCATION]}
    )
    request = (await logged(client, session_id, "client_tool_request", reply["after_id"])).event
    clock.advance(31)
    entries = await entries_until(client, session_id, 1, reply["after_id"])
    [answer] = of_type(entries, "client_tool_result")
    assert answer.by == "timeout" and answer.error
    [result] = of_type(entries, "tool_result")
    assert result.is_error and result.tool_use_id == request.tool_use_id
    url = f"/sessions/{session_id}/tool-results/{request.tool_use_id}"
    async with client.post(url, json={"output": "late"}) as response:
        assert response.status == 409


@pytest.mark.parametrize("body", [{}, {"output": 1, "error": "x"}, {"error": ""}, {"output": float("nan")}])
async def test_a_malformed_tool_result_is_a_422(client: TestClient, body: dict[str, Any]) -> None:
    session_id = await new_session(client)
    async with client.post(
        f"/sessions/{session_id}/tool-results/x",
        data=_dumps(body),
        headers={"Content-Type": "application/json"},
    ) as response:
        assert response.status in (400, 422), await response.text()


def _dumps(body: dict[str, Any]) -> str:
    import json

    return json.dumps(body)


# Slow enough to be running when the next message comes, however fast the machine; each such query
# ends by a cancel, never by its pace.
SLOW = "Long answer [emu:tokens=4000] [emu:tps=20]"


async def running(client: TestClient, session_id: str, content: str = SLOW) -> int:
    """Start a long query; return the id its events come after once it is streaming."""
    reply = await post(client, session_id, {"content": content, "id": "first"})
    await logged(client, session_id, "text_delta", reply["after_id"])
    return int(reply["after_id"])


async def test_reject_is_a_409(client: TestClient) -> None:
    session_id = await new_session(client)
    await running(client, session_id)
    await post(client, session_id, {"content": "again"}, 409)
    await post(client, session_id, {"content": "again", "multitask_strategy": "reject"}, 409)
    await client.post(f"/sessions/{session_id}/cancel")


async def test_enqueue_runs_after_the_current_query_in_order(make_client: Any) -> None:
    client = await make_client(max_queued=2)
    session_id = await new_session(client)
    # The first query waits on a browser tool until the queue is full, then goes on.
    first = await post(
        client, session_id, {"content": "Where? [emu:tool=get_location]", "tools": [LOCATION], "id": "first"}
    )
    after = first["after_id"]
    request = (await logged(client, session_id, "client_tool_request", after)).event
    one = await post(client, session_id, {"content": "Second", "multitask_strategy": "enqueue", "id": "s2"})
    two = await post(client, session_id, {"content": "Third", "multitask_strategy": "enqueue", "id": "s3"})
    assert (one["status"], one["queued"], two["queued"]) == ("queued", 1, 2)
    full = await post(client, session_id, {"content": "Fourth", "multitask_strategy": "enqueue"}, 429)
    assert full["quota"] == "queued"
    async with client.post(
        f"/sessions/{session_id}/tool-results/{request.tool_use_id}", json={"output": "here"}
    ):
        pass
    entries = await entries_until(client, session_id, 3, after)
    assert [s.message_id for s in of_type(entries, "run_started")] == ["first", "s2", "s3"]
    ids = [entry.id for entry in entries]
    assert ids == list(range(ids[0], ids[0] + len(ids)))  # nothing lost, nothing twice
    body = await conversation(client, session_id)
    users = [text for role, text in texts(body["messages"]) if role == "user"]
    assert users == ["Where? [emu:tool=get_location]", "Second", "Third"]


async def test_interrupt_keeps_the_partial_answer_marked(client: TestClient) -> None:
    session_id = await new_session(client)
    after = await running(client, session_id)
    reply = await post(
        client, session_id, {"content": "Stop, new question", "multitask_strategy": "interrupt"}
    )
    assert reply["run_id"]
    entries = await entries_until(client, session_id, 2, after)
    dones = of_type(entries, "done")
    assert dones[0].cancelled and not dones[1].cancelled
    body = await conversation(client, session_id)
    roles = [(m["role"], m.get("interrupted", False)) for m in body["messages"]]
    assert roles == [("user", False), ("assistant", True), ("user", False), ("assistant", False)]


async def test_rollback_cancels_and_rewinds_the_running_query(client: TestClient) -> None:
    session_id = await new_session(client)
    await ask(client, session_id, {"content": "Keep this", "id": "kept"})
    after = await running(client, session_id)
    await post(client, session_id, {"content": "Instead this", "multitask_strategy": "rollback", "id": "new"})
    entries = await entries_until(client, session_id, 2, after)
    [rewound] = of_type(entries, "conversation_rewound")
    assert rewound.message_id == "first" and rewound.kept == 2
    body = await conversation(client, session_id)
    assert [m["id"] for m in body["messages"]][:3] == ["kept", body["messages"][1]["id"], "new"]
    assert texts(body["messages"])[2] == ("user", "Instead this") and len(body["messages"]) == 4


@pytest.mark.parametrize("strategy", ["enqueue", "interrupt", "rollback"])
async def test_two_concurrent_sends_over_http_and_websocket(client: TestClient, strategy: str) -> None:
    session_id = await new_session(client)
    busy = "Busy [emu:tool=get_location]"
    reply = await post(client, session_id, {"content": busy, "tools": [LOCATION]})
    after = reply["after_id"]
    request = (await logged(client, session_id, "client_tool_request", after)).event
    async with client.ws_connect("/ws") as ws:
        await ws.send_json(
            {
                "type": "message",
                "session_id": session_id,
                "content": "From the socket",
                "multitask_strategy": strategy,
            }
        )
        http = asyncio.ensure_future(
            post(client, session_id, {"content": "From HTTP", "multitask_strategy": strategy})
        )
        frame = await ws.receive_json()
        await http
        assert frame["type"] in ("accepted", "queued"), frame
    if strategy == "enqueue":
        url = f"/sessions/{session_id}/tool-results/{request.tool_use_id}"
        async with client.post(url, json={"output": "here"}) as response:
            assert response.status == 200
    entries = await entries_until(client, session_id, 3, after)
    ids = [entry.id for entry in entries]
    assert ids == list(range(ids[0], ids[0] + len(ids)))
    started = [s.message for s in of_type(entries, "run_started")]
    assert sorted(started[1:]) == ["From HTTP", "From the socket"]
    body = await conversation(client, session_id)
    users = [text for role, text in texts(body["messages"]) if role == "user"]
    if strategy == "rollback":
        assert busy not in users
    else:
        assert users[0] == busy
    if strategy == "enqueue":
        assert users == [busy, *started[1:]]


async def test_websocket_tool_result_and_regenerate(client: TestClient) -> None:
    session_id = await new_session(client)
    async with client.ws_connect("/ws") as ws:
        await ws.send_json({"type": "subscribe", "session_id": session_id})
        await ws.send_json(
            {
                "type": "message",
                "session_id": session_id,
                "content": "Where am I? [emu:tool=get_location]",
                "tools": [LOCATION],
            }
        )
        request = await _frame(ws, "client_tool_request")
        await ws.send_json(
            {
                "type": "tool_result",
                "session_id": session_id,
                "tool_call_id": request["toolUseId"],
                "output": "Lyon",
            }
        )
        assert (await _frame(ws, "tool_result_accepted"))["tool_call_id"] == request["toolUseId"]
        await _frame(ws, "done")
        await ws.send_json({"type": "message", "session_id": session_id, "regenerate": True})
        rewound = await _frame(ws, "conversation_rewound")
        assert rewound["kept"] == 1
        await _frame(ws, "done")
        await ws.send_json({"type": "message", "session_id": session_id, "regenerate": "nope"})
        error = await _frame(ws, "error")
        assert error["code"] == "message_not_found"
        await ws.send_json(
            {"type": "tool_result", "session_id": session_id, "tool_call_id": "x", "output": 1}
        )
        assert (await _frame(ws, "error"))["code"] == "not_found"


async def _frame(ws: Any, kind: str) -> dict[str, Any]:
    while True:
        frame = await ws.receive_json()
        if frame.get("type") == kind:
            return frame  # type: ignore[no-any-return]


async def test_a_browser_tool_call_cannot_be_answered_as_an_approval(client: TestClient) -> None:
    session_id = await new_session(client)
    reply = await post(client, session_id, {"content": "Where? [emu:tool=get_location]", "tools": [LOCATION]})
    request = (await logged(client, session_id, "client_tool_request", reply["after_id"])).event
    key = f"ct:{request.tool_use_id}"
    async with client.post(f"/sessions/{session_id}/approvals/{key}", json={"approved": True}) as response:
        assert response.status == 404
    async with client.ws_connect("/ws") as ws:
        await ws.send_json(
            {"type": "approve", "session_id": session_id, "approval_id": key, "approved": True}
        )
        assert (await _frame(ws, "error"))["code"] == "not_found"
    body = await conversation(client, session_id)
    assert body["status"] == "waiting" and body["pending_approvals"] == []
    await client.post(f"/sessions/{session_id}/cancel")


async def test_deleting_a_session_drops_its_queue(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    session_id = await new_session(client)
    reply = await post(client, session_id, {"content": "Where? [emu:tool=get_location]", "tools": [LOCATION]})
    await logged(client, session_id, "client_tool_request", reply["after_id"])
    queued = await post(client, session_id, {"content": "Next", "multitask_strategy": "enqueue"})
    assert queued["queued"] == 1
    async with client.delete(f"/sessions/{session_id}") as response:
        assert response.status == 204
    await services_of(client).runs.wait_idle()
    assert services_of(client).multitask.queued(session_id) == 0
    assert services_of(client).runs.get(session_id) is None
    assert not [record for record in caplog.records if record.levelname == "ERROR"]
