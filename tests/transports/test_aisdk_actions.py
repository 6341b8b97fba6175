"""The AI SDK face's chat actions: message ids shared with the server, regenerate, edit, the
browser's own tools, ``multitask_strategy``, and ``GET /api/chat/{id}``.

The wire tests post what ``DefaultChatTransport`` posts and read the stream; the client tests run
npm ``ai`` 6 and 7's own ``AbstractChat`` (what ``useChat`` wraps) from tests/node/aisdk_*.mjs;
the fuzz test throws the new fields at ``POST /api/chat``. Every wait is on the log itself.
"""

from __future__ import annotations

import json
import logging
from contextlib import aclosing
from itertools import count
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient
from hypothesis import event, given
from hypothesis import strategies as st

from service.core.events import (
    ClientToolRequest,
    ClientToolResult,
    RunStarted,
    StatusChange,
    ToolResult,
    ToolUse,
    ToolUseStart,
)
from service.core.log import LogEntry
from service.transports.aisdk.projector import UIMessageStream
from tests.conftest import ClientFactory, services_of, sse_blocks
from tests.support.node import AI_MAJORS, require_node, run_node
from tests.transports.test_fuzz import FUZZ_SETTINGS, any_text, assert_error, finish, fuzz, json_values

fast = pytest.mark.fast
_chat_ids = count()

LOCATION_TOOL = {
    "description": "Where the user is",
    "inputSchema": {"type": "object", "properties": {}},
}
WHERE_AND_SUM = (
    'Where am I, and 2+2? [emu:tool=get_location,calculator] [emu:tool_input={"expression": "2+2"}]'
)


def user(text: str, message_id: str) -> dict[str, Any]:
    return {"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}]}


def body_of(chat_id: str, messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"id": chat_id, "messages": messages, "trigger": "submit-message", **extra}


async def parts_of(response: aiohttp.ClientResponse) -> list[dict[str, Any]]:
    """The parts of a UI message stream, which must end with ``[DONE]``."""
    assert response.status == 200, await response.text()
    assert response.headers["x-vercel-ai-ui-message-stream"] == "v1"
    data = [block["data"] async for block in sse_blocks(response)]
    assert data[-1] == "[DONE]"
    return [json.loads(item) for item in data[:-1]]


async def post_chat(client: TestClient, body: dict[str, Any]) -> list[dict[str, Any]]:
    async with client.post("/api/chat", json=body) as response:
        return await parts_of(response)


async def refused(client: TestClient, body: dict[str, Any], status: int) -> str:
    async with client.post("/api/chat", json=body) as response:
        text = await response.text()
        assert response.status == status, text
        assert response.content_type == "application/json", text
        error: str = json.loads(text)["error"]
        return error


async def session_of(client: TestClient, chat_id: str) -> dict[str, Any]:
    async with client.get(f"/sessions/{chat_id}") as response:
        assert response.status == 200
        return await response.json()  # type: ignore[no-any-return]


async def ui_chat(client: TestClient, chat_id: str, headers: dict[str, str] | None = None) -> list[Any]:
    async with client.get(f"/api/chat/{chat_id}", headers=headers) as response:
        assert response.status == 200, await response.text()
        return await response.json()  # type: ignore[no-any-return]


def of_type(parts: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [part for part in parts if part["type"] == kind]


def text(parts: list[dict[str, Any]]) -> str:
    return "".join(
        part.get("delta", part.get("text", "")) for part in parts if part["type"] in ("text-delta", "text")
    )


async def logged_until(client: TestClient, chat_id: str, kind: str, after: int = 0) -> list[LogEntry]:
    """The chat's log entries after ``after`` up to the first ``kind``."""
    session = await services_of(client).sessions.get(chat_id)
    seen: list[LogEntry] = []
    async with aclosing(session.log.subscribe(after)) as batches:
        async for batch in batches:
            for entry in batch:
                seen.append(entry)
                if entry.event.type == kind:
                    return seen
    raise AssertionError(f"the log ended before a {kind}")


# -- the projection, as a pure function of the log ---------------------------------------------------


def entries(events: list[Any]) -> list[LogEntry]:
    return [LogEntry(id=1 + n, event=event, size=0, ts=1.0) for n, event in enumerate(events)]


@fast
def test_browser_tools_project_as_static_parts_with_the_output_the_browser_gave() -> None:
    stream = UIMessageStream(server_tool=lambda name: name == "calculator")
    log = entries(
        [
            RunStarted(run_id="r1", message="Where?", max_turns=5, message_id="u1", reply_id="a1"),
            ToolUseStart(tool="get_location", tool_use_id="t1"),
            ToolUse(tool="get_location", tool_use_id="t1", input={}),
            ToolUseStart(tool="calculator", tool_use_id="t2"),
            ToolUse(tool="calculator", tool_use_id="t2", input={"expression": "2+2"}),
            ToolResult(tool="calculator", tool_use_id="t2", result="4"),
            ClientToolRequest(tool="get_location", tool_use_id="t1", input={}, expires_at=1.0),
            StatusChange(status="waiting"),
            ClientToolResult(tool_use_id="t1", output={"city": "Lyon"}, by="ai-sdk"),
            StatusChange(status="running"),
            ToolResult(tool="get_location", tool_use_id="t1", result='{"city":"Lyon"}'),
        ]
    )
    parts = [part for entry in log for part in stream.parts(entry)]
    assert parts[0] == {"type": "start", "messageId": "a1"}
    assert parts[2] == {"type": "tool-input-start", "toolCallId": "t1", "toolName": "get_location"}
    assert parts[3] == {
        "type": "tool-input-available",
        "toolCallId": "t1",
        "toolName": "get_location",
        "input": {},
    }
    assert parts[4]["dynamic"] is True and parts[6] == {
        "type": "tool-output-available",
        "toolCallId": "t2",
        "output": "4",
        "dynamic": True,
    }
    # The browser's output once, as it gave it (not the text the model was told).
    assert parts[7:] == [{"type": "tool-output-available", "toolCallId": "t1", "output": {"city": "Lyon"}}]
    # A run logged before reply ids existed keeps the old message id.
    [start] = UIMessageStream().parts(entries([RunStarted(run_id="r2", message="x", max_turns=1)])[0])
    assert start == {"type": "start", "messageId": "msg-r2"}


# -- ids, regenerate, edit -------------------------------------------------------------------------


@fast
async def test_the_stream_and_the_server_share_the_message_ids(client: TestClient) -> None:
    parts = await post_chat(client, body_of("ids", [user("Hello there", "u-hello")]))
    start = parts[0]
    assert start["type"] == "start" and start["messageId"].startswith("msg_")
    session = await session_of(client, "ids")
    assert [m["id"] for m in session["messages"]] == ["u-hello", start["messageId"]]
    # An id the chat holds already (a client that reuses one) is not taken twice.
    parts = await post_chat(
        client, body_of("ids", [user("Hello there", "u-hello"), user("Again", "u-hello")])
    )
    session = await session_of(client, "ids")
    ids = [m["id"] for m in session["messages"]]
    assert len(set(ids)) == 4 and ids[3] == parts[0]["messageId"]


@fast
async def test_regenerate_answers_the_last_question_again(client: TestClient) -> None:
    first = await post_chat(client, body_of("regen", [user("Tell me a story [emu:tokens=5]", "q1")]))
    again = await post_chat(
        client, body_of("regen", [user("Tell me a story [emu:tokens=5]", "q1")], trigger="regenerate-message")
    )
    assert again[0]["messageId"] != first[0]["messageId"] and again[-1]["type"] == "finish"
    session = await session_of(client, "regen")
    assert [m["id"] for m in session["messages"]] == ["q1", again[0]["messageId"]]
    chat = await ui_chat(client, "regen")
    assert [(m["id"], m["role"]) for m in chat] == [("q1", "user"), (again[0]["messageId"], "assistant")]
    assert text(chat[1]["parts"]) == text(again)


@fast
async def test_regenerate_names_an_earlier_answer_or_its_question(client: TestClient) -> None:
    q1, q2 = user("First [emu:tokens=3]", "q1"), user("Second [emu:tokens=3]", "q2")
    a1 = (await post_chat(client, body_of("regen2", [q1])))[0]["messageId"]
    await post_chat(client, body_of("regen2", [q1, {"id": a1, "role": "assistant", "parts": []}, q2]))
    # As AbstractChat.regenerate({messageId}) sends it: the messages before the answer.
    parts = await post_chat(client, body_of("regen2", [q1], trigger="regenerate-message", messageId=a1))
    session = await session_of(client, "regen2")
    assert [m["id"] for m in session["messages"]] == ["q1", parts[0]["messageId"]]
    # Naming the question: the same, the question kept.
    parts = await post_chat(client, body_of("regen2", [q1], trigger="regenerate-message", messageId="q1"))
    session = await session_of(client, "regen2")
    assert [m["id"] for m in session["messages"]] == ["q1", parts[0]["messageId"]]


@fast
async def test_an_edit_replaces_the_question_and_what_followed(client: TestClient) -> None:
    messages = [user("Name a fruit", "a"), user("Name a city", "b")]
    for n in range(2):
        await post_chat(client, body_of("edit", messages[: n + 1]))
    parts = await post_chat(client, body_of("edit", [user("Name a tree", "a")], messageId="a"))
    session = await session_of(client, "edit")
    assert [m["id"] for m in session["messages"]] == ["a", parts[0]["messageId"]]
    assert session["messages"][0]["content"] == [{"text": "Name a tree"}]


@fast
@pytest.mark.parametrize(
    ("extra", "status"),
    [
        ({"trigger": "regenerate-message", "messageId": "nope"}, 404),
        ({"messageId": "nope"}, 404),
        ({"trigger": "regenerate-message", "messageId": "<answer>-2"}, 404),
        ({"multitask_strategy": "sometimes"}, 422),
        ({"tools": {"calculator": LOCATION_TOOL}}, 422),
        ({"tools": {"has space": LOCATION_TOOL}}, 422),
        ({"tools": {"ok": {"inputSchema": "not a schema"}}}, 422),
        ({"tools": ["get_location"]}, 422),
    ],
)
async def test_bad_actions_are_json_errors_and_nothing_is_lost(
    client: TestClient, extra: dict[str, Any], status: int
) -> None:
    await post_chat(client, body_of("bad", [user("Hello", "h")]))
    before = await session_of(client, "bad")
    if extra.get("messageId") == "<answer>-2":
        extra = {**extra, "messageId": f"{before['messages'][1]['id']}-2"}
    error = await refused(client, body_of("bad", [user("Hi", "h2")], **extra), status)
    assert error
    after = await session_of(client, "bad")
    assert after["messages"] == before["messages"] and after["status"] == "idle"


@fast
async def test_regenerate_of_an_empty_chat_is_a_404(client: TestClient) -> None:
    await refused(client, body_of("empty", [user("Hi", "h")], trigger="regenerate-message"), 404)


# -- the browser's own tools ---------------------------------------------------------------------


def answered(message_id: str, waiting: list[dict[str, Any]], outputs: dict[str, Any]) -> dict[str, Any]:
    """The assistant message a chat holds once ``addToolOutput`` answered the browser's calls in
    ``waiting`` (the parts of the stream that stopped): one step, its tool parts."""
    tools: dict[str, dict[str, Any]] = {}
    for part in waiting:
        if part["type"] == "tool-input-available":
            call = part["toolCallId"]
            kind = "dynamic-tool" if part.get("dynamic") else f"tool-{part['toolName']}"
            tools[call] = {
                "type": kind,
                "toolCallId": call,
                "state": "input-available",
                "input": part["input"],
            }
        elif part["type"] == "tool-output-available":
            tools[part["toolCallId"]].update(state="output-available", output=part["output"])
    for call, output in outputs.items():
        tools[call].update(state="output-available", output=output)
    return {"id": message_id, "role": "assistant", "parts": [{"type": "step-start"}, *tools.values()]}


@fast
async def test_a_browser_tool_is_static_waits_and_its_result_goes_on_with_the_query(
    client: TestClient,
) -> None:
    question = user(WHERE_AND_SUM, "q1")
    waiting = await post_chat(client, body_of("tools", [question], tools={"get_location": LOCATION_TOOL}))
    starts = {part["toolName"]: part for part in of_type(waiting, "tool-input-start")}
    assert "dynamic" not in starts["get_location"] and starts["calculator"]["dynamic"] is True
    # The service's own tool ran; the stream ends as a step awaiting the browser's result.
    [output] = of_type(waiting, "tool-output-available")
    assert output["toolCallId"] == starts["calculator"]["toolCallId"] and output["output"] == "4"
    assert [p["type"] for p in waiting[-2:]] == ["finish-step", "finish"]
    assert waiting[-1]["finishReason"] == "tool-calls"
    session = await session_of(client, "tools")
    call = starts["get_location"]["toolCallId"]
    assert session["status"] == "waiting"
    assert [c["toolUseId"] for c in session["pending_tool_calls"]] == [call]

    reply = answered(waiting[0]["messageId"], waiting, {call: {"city": "Lyon"}})
    body = body_of("tools", [question, reply], messageId=reply["id"], tools={"get_location": LOCATION_TOOL})
    rest = await post_chat(client, body)
    assert "start" not in [p["type"] for p in rest]
    assert rest[0] == {"type": "tool-output-available", "toolCallId": call, "output": {"city": "Lyon"}}
    assert rest[-1]["type"] == "finish" and rest[-1]["finishReason"] == "stop"
    assert text(rest)
    # The same results again: that call has its result already.
    await refused(client, body, 409)
    entries = await logged_until(client, "tools", "client_tool_result")
    assert entries[-1].event.by == "ai-sdk"
    chat = await ui_chat(client, "tools")
    [assistant] = [m for m in chat if m["role"] == "assistant"]
    assert assistant["id"] == waiting[0]["messageId"]
    kinds = [(p["type"], p.get("state")) for p in assistant["parts"] if p["type"] != "text"]
    assert kinds == [
        ("step-start", None),
        ("tool-get_location", "output-available"),
        ("dynamic-tool", "output-available"),
        ("step-start", None),
    ]
    assert assistant["parts"][1]["output"] == {"city": "Lyon"}


@fast
async def test_a_result_for_a_call_the_chat_does_not_wait_on_is_a_4xx(client: TestClient) -> None:
    question = user("Where am I? [emu:tool=get_location]", "q1")
    waiting = await post_chat(client, body_of("tools2", [question], tools={"get_location": LOCATION_TOOL}))
    call = of_type(waiting, "tool-input-available")[0]["toolCallId"]
    reply = answered(waiting[0]["messageId"], waiting, {call: "Lyon"})
    unknown = json.loads(json.dumps(reply).replace(call, "call_unknown"))
    await refused(client, body_of("tools2", [question, unknown], messageId=reply["id"]), 404)
    error_part = json.loads(json.dumps(reply))
    error_part["parts"][1].update(state="output-error", errorText="x" * 30_000)
    await refused(client, body_of("tools2", [question, error_part]), 422)
    assert (await session_of(client, "tools2"))["status"] == "waiting"
    # An error result is told to the model, and to the stream as the browser gave it.
    error_part["parts"][1]["errorText"] = "no GPS here"
    rest = await post_chat(client, body_of("tools2", [question, error_part]))
    assert rest[0] == {"type": "tool-output-error", "toolCallId": call, "errorText": "no GPS here"}
    chat = await ui_chat(client, "tools2")
    tool = chat[1]["parts"][1]
    assert (tool["type"], tool["state"], tool["errorText"]) == (
        "tool-get_location",
        "output-error",
        "no GPS here",
    )


# -- multitask_strategy and GET /api/chat/{id} ------------------------------------------------------


@fast
async def test_a_second_message_while_one_runs_is_a_409_by_default(client: TestClient) -> None:
    async with client.post(
        "/api/chat", json=body_of("busy", [user("Long [emu:tokens=4000] [emu:tps=20]", "q1")])
    ) as response:
        assert response.status == 200
        await logged_until(client, "busy", "text_delta")
        await refused(client, body_of("busy", [user("Again", "q2")]), 409)
        await refused(client, body_of("busy", [user("Again", "q2")], multitask_strategy="reject"), 409)
        async with client.post("/sessions/busy/cancel") as cancel:
            assert cancel.status == 202
        parts = await parts_of(response)
    assert [p["type"] for p in parts[-2:]] == ["abort", "finish"]


@fast
async def test_get_chat_is_404_for_a_chat_one_has_not_made(make_client: ClientFactory) -> None:
    client = await make_client(api_keys=["key-alice", "key-bob"])
    alice, bob = {"Authorization": "Bearer key-alice"}, {"Authorization": "Bearer key-bob"}
    async with client.post("/api/chat", json=body_of("hers", [user("Hi", "q1")]), headers=alice) as response:
        await parts_of(response)
    for chat_id, headers in (("hers", bob), ("nobody", alice), ("a.b", alice)):
        async with client.get(f"/api/chat/{chat_id}", headers=headers) as response:
            assert response.status == 404, chat_id
            assert "error" in await response.json()
    chat = await ui_chat(client, "hers", alice)
    assert [m["role"] for m in chat] == ["user", "assistant"]
    assert chat[1]["metadata"]["usage"]["total_tokens"] > 0


# -- with npm ai 6 and 7's own chat --------------------------------------------------------------


@pytest.fixture(params=AI_MAJORS, ids=[f"ai{major}" for major in AI_MAJORS])
def ai(request: pytest.FixtureRequest) -> int:
    """The major version of npm ``ai`` the scripts run on: every such test runs on both."""
    return int(request.param)


def base_url(client: TestClient) -> str:
    return str(client.make_url("")).rstrip("/")


async def actions(client: TestClient, chat_id: str, ai: int, *steps: dict[str, Any]) -> list[dict[str, Any]]:
    """Run ``steps`` in one AbstractChat (tests/node/aisdk_actions.mjs); each step's chat after it."""
    require_node()
    result = await run_node("aisdk_actions.mjs", base_url(client), chat_id, json.dumps(steps), ai=ai)
    assert result["errors"] == []
    assert all(step["status"] == "ready" for step in result["steps"])
    return result["steps"]  # type: ignore[no-any-return]


def shape(messages: list[dict[str, Any]]) -> list[tuple[str, str, list[tuple[Any, ...]]]]:
    """What a chat shows of its messages: ids, roles, and each part's kind, state and content."""
    return [
        (
            message["id"],
            message["role"],
            [
                (part["type"], part.get("state"), part.get("text"), part.get("input"), part.get("output"))
                for part in message["parts"]
            ],
        )
        for message in messages
    ]


async def test_regenerate_leaves_the_question_and_the_new_answer(client: TestClient, ai: int) -> None:
    first, again = await actions(
        client, "c-regen", ai, {"send": "Tell me a story [emu:tokens=6]"}, {"regenerate": None}
    )
    question, answer = again["messages"]
    assert question["id"] == first["messages"][0]["id"]
    assert answer["id"] != first["messages"][1]["id"]
    session = await session_of(client, "c-regen")
    assert [m["id"] for m in session["messages"]] == [question["id"], answer["id"]]
    chat = await ui_chat(client, "c-regen")
    assert shape(chat) == shape(again["messages"])
    assert chat[1]["metadata"]["usage"] == answer["metadata"]["usage"]


async def test_an_edit_of_the_first_question_costs_what_a_fresh_chat_does(
    client: TestClient, ai: int
) -> None:
    (control,) = await actions(client, "c-fresh", ai, {"send": "Name a colour"})
    steps = await actions(
        client,
        "c-edit",
        ai,
        {"send": "Name a fruit"},
        {"send": "Name a city"},
        {"send": "Name a tree"},
        {"edit": 0, "text": "Name a colour"},
    )
    edited = steps[-1]["messages"]
    assert [m["role"] for m in edited] == ["user", "assistant"]
    assert edited[0]["id"] == steps[0]["messages"][0]["id"]
    assert edited[0]["parts"][0]["text"] == "Name a colour"
    session = await session_of(client, "c-edit")
    assert [m["id"] for m in session["messages"]] == [m["id"] for m in edited]
    assert shape(await ui_chat(client, "c-edit")) == shape(edited)
    fresh_usage = control["messages"][1]["metadata"]["usage"]
    assert edited[1]["metadata"]["usage"]["input_tokens"] == fresh_usage["input_tokens"]
    # The log agrees: the edited question's model turn was sent what a fresh chat's was.
    entries = await logged_until(client, "c-edit", "conversation_rewound")
    after = await logged_until(client, "c-edit", "turn_completed", entries[-1].id)
    assert after[-1].event.usage.input_tokens == fresh_usage["input_tokens"]


async def test_a_chat_loaded_from_get_api_chat_goes_on_in_the_same_session(
    client: TestClient, ai: int
) -> None:
    steps = await actions(
        client,
        "c-load",
        ai,
        {"send": "What is 12*7?"},
        {"send": "Think first [emu:reasoning]"},
        {"load": True},
        {"send": "Say hello"},
    )
    live, loaded, went_on = steps[1], steps[2], steps[3]
    assert shape(loaded["loaded"]) == shape(live["messages"])
    tool = loaded["loaded"][1]["parts"][1]
    assert (tool["type"], tool["toolName"], tool["output"]) == ("dynamic-tool", "calculator", "84")
    assert any(part["type"] == "reasoning" for part in loaded["loaded"][3]["parts"])
    assert [m["role"] for m in went_on["messages"]] == ["user", "assistant"] * 3
    assert went_on["messages"][:4] == loaded["loaded"]
    session = await session_of(client, "c-load")
    assert [m["id"] for m in session["messages"] if m["role"] == "user" and "text" in m["content"][0]] == [
        m["id"] for m in went_on["messages"] if m["role"] == "user"
    ]
    assert shape(await ui_chat(client, "c-load")) == shape(went_on["messages"])


async def test_a_browser_tool_answered_by_on_tool_call_while_another_tab_follows(
    client: TestClient, ai: int
) -> None:
    require_node()
    result = await run_node("aisdk_browser_tool.mjs", base_url(client), "c-tool", WHERE_AND_SUM, ai=ai)
    assert result["errors"] == [] and result["status"] == "ready"
    # onToolCall saw the browser's tool only (the calculator is the service's: dynamic).
    [call] = result["calls"]
    assert call["toolName"] == "get_location" and not call.get("dynamic")
    waited, rest = result["chunks"]
    assert waited[0] == "start" and waited[-2:] == ["finish-step", "finish"]
    assert "start" not in rest and rest[0] == "tool-output-available" and rest[-1] == "finish"
    # One assistant message: the tool turn (both tools), then the answer.
    question, answer = result["messages"]
    tools = [(p["type"], p["state"], p.get("output")) for p in answer["parts"] if "toolCallId" in p]
    assert tools == [
        ("tool-get_location", "output-available", {"city": "Lyon"}),
        ("dynamic-tool", "output-available", "4"),
    ]
    assert text(answer["parts"])
    # The other tab's resumed stream ended where the query waited, the call in the same state.
    [resumed] = result["watcherChunks"]
    assert resumed == waited
    [watched] = result["watching"]
    assert watched["id"] == answer["id"]
    assert [(p["type"], p["state"]) for p in watched["parts"] if "toolCallId" in p] == [
        ("tool-get_location", "input-available"),
        ("dynamic-tool", "output-available"),
    ]
    # The session's own events tell the same query: the request, the browser's answer, the end.
    events = result["events"]
    [started] = [e["data"] for e in events if e["type"] == "processing"]
    assert (started["message_id"], started["reply_id"]) == (question["id"], answer["id"])
    [asked] = [e["data"] for e in events if e["type"] == "client_tool_request"]
    [told] = [e["data"] for e in events if e["type"] == "client_tool_result"]
    assert asked["toolUseId"] == told["toolUseId"] == call["toolCallId"]
    assert (told["output"], told["by"]) == ({"city": "Lyon"}, "ai-sdk")
    assert "waiting" in [e["data"]["status"] for e in events if e["type"] == "status_change"]
    ids = [e["id"] for e in events]
    assert ids == list(range(ids[0], ids[0] + len(ids)))
    # And the chat as the server keeps it is the chat the first tab holds.
    assert shape(result["loaded"]) == shape(result["messages"])


async def two_tabs(client: TestClient, chat_id: str, ai: int, strategy: str, first: str) -> dict[str, Any]:
    require_node()
    result = await run_node(
        "aisdk_multitask.mjs", base_url(client), chat_id, strategy, first, "Say hello [emu:tokens=3]", ai=ai
    )
    assert result["errors"] == []
    assert result["first"]["status"] == result["second"]["status"] == "ready"
    return result


async def test_enqueue_over_api_chat_streams_the_message_once_its_turn_comes(
    client: TestClient, ai: int
) -> None:
    result = await two_tabs(client, "c-enqueue", ai, "enqueue", "Count [emu:tokens=20] [emu:tps=10]")
    first, second = result["first"]["messages"], result["second"]["messages"]
    assert first[1]["metadata"].get("cancelled") is None and second[1]["metadata"].get("cancelled") is None
    assert result["second"]["chunks"][0] == "start" and result["second"]["chunks"][-1] == "finish"
    session = await session_of(client, "c-enqueue")
    assert [m["id"] for m in session["messages"]] == [m["id"] for m in first + second]
    # The second query started once the first had ended: nothing of it interleaved.
    entries = await logged_until(client, "c-enqueue", "done")
    later = await logged_until(client, "c-enqueue", "run_started", entries[-1].id)
    assert later[-1].event.message_id == second[0]["id"]


async def test_interrupt_over_api_chat_stops_the_running_answer(client: TestClient, ai: int) -> None:
    result = await two_tabs(client, "c-interrupt", ai, "interrupt", "Long [emu:tokens=4000] [emu:tps=20]")
    first, second = result["first"]["messages"], result["second"]["messages"]
    assert result["first"]["chunks"][-2:] == ["abort", "finish"]
    assert first[1]["metadata"]["cancelled"] is True
    assert second[1]["metadata"].get("cancelled") is None and text(second[1]["parts"])
    chat = await ui_chat(client, "c-interrupt")
    assert [m["id"] for m in chat] == [m["id"] for m in first + second]
    assert chat[1]["metadata"]["interrupted"] is True and "interrupted" not in chat[3]["metadata"]
    assert text(chat[1]["parts"]) == text(first[1]["parts"])


# -- fuzz ----------------------------------------------------------------------------------------

# Placeholders the example fills in with the ids of a query that waits on a browser tool.
CALL, REPLY, QUESTION = "$call", "$reply", "$question"


def mostly(good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly ``good``: enough bodies get past the shape checks to reach the actions."""
    return st.sampled_from([good] * 7 + [bad]).flatmap(lambda chosen: chosen)


ids = mostly(st.sampled_from([CALL, REPLY, QUESTION, "u", "nope"]), any_text | json_values)
tool_parts = st.fixed_dictionaries(
    {
        "type": mostly(
            st.sampled_from(["tool-get_location", "tool-calculator", "dynamic-tool", "step-start", "text"]),
            any_text | json_values,
        ),
        "state": mostly(
            st.sampled_from(["input-available", "output-available", "output-error", "approval-responded"]),
            json_values,
        ),
    },
    optional={
        "toolCallId": mostly(st.just(CALL), ids),
        "output": json_values,
        "errorText": mostly(st.just("no GPS"), any_text | json_values),
        "text": any_text,
        "approval": st.fixed_dictionaries({"id": ids, "approved": st.booleans() | json_values}) | json_values,
    },
)
user_parts = st.just([{"type": "text", "text": "Hi [emu:tokens=2]"}]) | st.lists(
    st.fixed_dictionaries({"type": st.just("text"), "text": any_text}), max_size=2
)
chat_messages = st.fixed_dictionaries(
    {
        "role": mostly(st.sampled_from(["user", "assistant"]), json_values),
        "parts": mostly(user_parts | st.lists(tool_parts, max_size=3), json_values),
    },
    optional={"id": ids},
)
chat_tools = mostly(
    st.just({"get_location": LOCATION_TOOL}),
    st.dictionaries(
        st.sampled_from(["get_location", "calculator", "has space", ""]) | any_text,
        st.fixed_dictionaries(
            {}, optional={"description": any_text | json_values, "inputSchema": json_values}
        )
        | json_values,
        max_size=2,
    )
    | json_values,
)
# The last message: a question, or the browser's answer to a waiting call (as the chat sends them).
last_messages = mostly(
    st.fixed_dictionaries(
        {
            "role": st.just("user"),
            "parts": st.sampled_from(["Hi [emu:tokens=2]", "Where? [emu:tool=get_location]"]).map(
                lambda text: [{"type": "text", "text": text}]
            ),
        },
        optional={"id": ids},
    )
    | st.fixed_dictionaries(
        {
            "id": st.just(REPLY),
            "role": st.just("assistant"),
            "parts": st.lists(tool_parts, max_size=2).map(lambda parts: [{"type": "step-start"}, *parts]),
        }
    ),
    chat_messages,
)
fuzzed_fields = st.fixed_dictionaries(
    {"messages": st.tuples(st.lists(chat_messages, max_size=2), last_messages).map(lambda m: [*m[0], m[1]])},
    optional={
        "trigger": mostly(st.sampled_from(["submit-message", "regenerate-message"]), json_values),
        "messageId": ids,
        "tools": chat_tools,
        "multitask_strategy": mostly(
            st.sampled_from(["reject", "enqueue", "interrupt", "rollback"]), json_values
        ),
    },
)


def filled(value: Any, ids: dict[str, str]) -> Any:
    """``value`` with the placeholders replaced by the waiting query's ids."""
    if isinstance(value, str):
        return ids.get(value, value)
    if isinstance(value, list):
        return [filled(item, ids) for item in value]
    if isinstance(value, dict):
        return {key: filled(item, ids) for key, item in value.items()}
    return value


@pytest.fixture
async def fuzzed(make_client: ClientFactory, caplog: pytest.LogCaptureFixture) -> TestClient:
    """The service with the fuzz tests' small limits; a browser tool's call unanswered for a
    second gets its error result, so a message queued behind one (``enqueue``) soon runs."""
    caplog.set_level(logging.WARNING)
    return await make_client(**FUZZ_SETTINGS, client_tool_timeout_s=1)


@pytest.mark.slow
@fuzz
@given(fields=fuzzed_fields, waiting=st.booleans())
async def test_chat_actions_fuzz(
    fuzzed: TestClient,
    caplog: pytest.LogCaptureFixture,
    fields: dict[str, Any],
    waiting: bool,
) -> None:
    caplog.clear()
    chat_id = f"fa{next(_chat_ids)}"
    known = {CALL: "none", REPLY: "none", QUESTION: "q0"}
    if waiting:
        # A query that waits on the browser: the fuzzed body may answer it, edit or regenerate.
        question = user("Where? [emu:tool=get_location]", "q0")
        parts = await post_chat(fuzzed, body_of(chat_id, [question], tools={"get_location": LOCATION_TOOL}))
        known.update(
            {CALL: of_type(parts, "tool-input-available")[0]["toolCallId"], REPLY: parts[0]["messageId"]}
        )
    body = {"id": chat_id, **filled(fields, known)}
    raw = json.dumps(body).encode()
    async with fuzzed.post("/api/chat", data=raw, headers={"Content-Type": "application/json"}) as response:
        event(f"status {response.status}")
        if response.status == 200:
            data = [block["data"] async for block in sse_blocks(response)]
            assert data[-1] == "[DONE]"
            assert json.loads(data[-2])["type"] in ("finish", "error")
        else:
            await assert_error(response, {400, 404, 409, 413, 422, 429})
    async with fuzzed.post(f"/sessions/{chat_id}/cancel"):
        pass  # a query left waiting on the browser ends here
    await finish(fuzzed, caplog)
