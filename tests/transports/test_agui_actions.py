"""AG-UI's part of a chat UI's actions over ``POST /ag-ui``: message ids that stay the same across
runs, the client's own tools (``tools``, answered by ``role: "tool"`` messages), and
``forwardedProps.multitask_strategy``.

With AG-UI's own client (npm ``@ag-ui/client``'s ``HttpAgent``, run by node from tests/node/) where
it matters what that client makes of the stream, over plain HTTP for the refusals; every wait is
on the session's log. A Hypothesis fuzz of the new fields closes the file.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest
from ag_ui.core import RunAgentInput, Tool, ToolMessage, UserMessage
from aiohttp.test_utils import TestClient
from hypothesis import event as note
from hypothesis import example, given
from hypothesis import strategies as st
from pydantic import ValidationError

from service.core.events import (
    ClientToolRequest,
    ClientToolResult,
    RunDone,
    RunStarted,
    StatusChange,
    StepCompleted,
    TextDelta,
    ToolInputDelta,
    ToolResult,
    ToolUse,
    ToolUseStart,
)
from service.transports.agui import projector as agui
from tests.conftest import ClientFactory, services_of, sse_events
from tests.support.node import require_node, run_node
from tests.transports.test_actions import SLOW, logged
from tests.transports.test_fuzz import (
    MALFORMED,
    MAX_BYTES,
    MAX_CHARS,
    any_text,
    assert_error,
    contains_surrogate,
    encoded,
    finish,
    fuzz,
    fuzzed,  # noqa: F401 (the fixture)
    good_text,
    has_surrogate,
    json_values,
    read_sse,
)
from tests.transports.test_protocol_clients import base_url
from tests.transports.test_protocol_projections import entries
from tests.transports.test_protocols import agui_body

pytestmark = pytest.mark.fast

LOCATION = {"name": "get_location", "description": "Where the user is", "parameters": {"type": "object"}}
WHERE = "Where am I? [emu:tool=get_location]"


async def run(client: TestClient, body: dict[str, Any], status: int = 200) -> list[dict[str, Any]]:
    """POST /ag-ui: the events of the run (or the error body, at another status)."""
    async with client.post("/ag-ui", json=body) as response:
        if status != 200 or response.status != 200:
            assert response.status == status, await response.text()
            return [await response.json()]
        return [event["data"] async for event in sse_events(response)]


async def stored(client: TestClient, session_id: str) -> dict[str, Any]:
    async with client.get(f"/sessions/{session_id}") as response:
        assert response.status == 200
        return await response.json()  # type: ignore[no-any-return]


def of_type(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [event for event in events if event["type"] == kind]


def streamed_ids(events: list[dict[str, Any]]) -> set[str]:
    """Every message id a run's events gave the client (its snapshot apart)."""
    ids = set()
    for event in events:
        if event["type"] in ("TEXT_MESSAGE_START", "TOOL_CALL_RESULT"):
            ids.add(event["messageId"])
        elif event["type"] == "TOOL_CALL_START":
            ids.add(event["parentMessageId"])
    return ids


def comparable(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as a snapshot and a client's state both hold them (the client's reasoning aside)."""
    return [
        {key: message.get(key) or None for key in ("id", "role", "content", "toolCallId")}
        | {"calls": [call["id"] for call in message.get("toolCalls") or []]}
        for message in messages
        if message["role"] != "reasoning"
    ]


# -- ids ------------------------------------------------------------------------------------------


def test_the_projection_of_a_wait_on_a_client_tool_and_of_its_continuation() -> None:
    """As pure functions of the log: the ids come from the query's own, the run that stops at the
    wait names the call pending, and a continued run starts with what the first one showed."""
    log = entries(
        [
            RunStarted(run_id="r1", message="Where?", max_turns=5, message_id="u1", reply_id="msg_a"),
            TextDelta(text="Let me look."),
            ToolUseStart(tool="get_location", tool_use_id="c1"),
            ToolInputDelta(tool_use_id="c1", delta="{}"),
            ToolUse(tool="get_location", tool_use_id="c1", input={}),
            ClientToolRequest(tool="get_location", tool_use_id="c1", input={}, expires_at=1e10),
            StatusChange(status="waiting"),
            ClientToolResult(tool_use_id="c1", output="Lyon", by="ag-ui"),
            ToolResult(tool="get_location", tool_use_id="c1", result="Lyon"),
            StepCompleted(turn=1),
            TextDelta(text="Lyon.", turn=2),
            StepCompleted(turn=2),
            RunDone(turns=2, output="Lyon."),
        ]
    )
    history = [
        {"id": "u0", "role": "user", "content": [{"text": "Hi"}]},
        {"id": "a0", "role": "assistant", "content": [{"text": "Hello"}]},
    ]
    conversation = [*history, {"id": "u1", "role": "user", "content": [{"text": "Where?"}]}]
    stream = agui.AgUiStream("t", conversation, "run-1")
    first = [event for entry in log[:7] for event in stream.events(entry)]
    snapshot = next(e for e in first if e.type.value == "MESSAGES_SNAPSHOT")
    assert [m.id for m in snapshot.messages] == ["u0", "a0", "u1"]  # the query's own message cut
    assert [e.message_id for e in first if e.type.value == "TEXT_MESSAGE_START"] == ["msg_a"]
    assert [e.parent_message_id for e in first if e.type.value == "TOOL_CALL_START"] == ["msg_a"]
    (finished,) = [e for e in stream.paused() if e.type.value == "RUN_FINISHED"]
    assert finished.outcome.pending_tool_call_ids == ["c1"]
    continued = agui.AgUiStream("t", conversation, "run-2", continued=True)
    continued.prime(log[:7])
    continued.paused()
    head = [json.loads(line[6:]) for line in continued.head().splitlines() if line.startswith("data: ")]
    assert [e["type"] for e in head] == ["RUN_STARTED", "MESSAGES_SNAPSHOT"] and head[0]["runId"] == "run-2"
    shown = head[1]["messages"]
    assert [(m["id"], m.get("content")) for m in shown] == [
        ("u0", "Hi"),
        ("a0", "Hello"),
        ("u1", "Where?"),
        ("msg_a", "Let me look."),
    ]
    assert shown[-1]["toolCalls"][0]["function"] == {"name": "get_location", "arguments": "{}"}
    rest = [event for entry in log[7:] for event in continued.events(entry)]
    (result,) = [e for e in rest if e.type.value == "TOOL_CALL_RESULT"]
    assert result.message_id == "c1-result"
    assert [e.message_id for e in rest if e.type.value == "TEXT_MESSAGE_START"] == ["msg_a-2"]
    assert rest[-1].type.value == "RUN_FINISHED" and rest[-1].outcome is None


async def test_ids_in_the_next_snapshot_are_those_the_client_holds(client: TestClient) -> None:
    require_node()
    result = await run_node(
        "agui_run.mjs", base_url(client), "ids-1", "What is 12*7?", "Say hello [emu:reasoning]"
    )
    first, second = result["runs"]
    snapshot = of_type(second["events"], "MESSAGES_SNAPSHOT")[0]["messages"]
    # What the client built from run 1's stream is, id for id, what run 2's snapshot says.
    assert comparable(snapshot[:-1]) == comparable(first["messages"])
    assert snapshot[-1]["id"] == "u2" and snapshot[0]["id"] == "u1"
    assert streamed_ids(first["events"]) <= {message["id"] for message in snapshot}
    (call,) = of_type(first["events"], "TOOL_CALL_START")
    (answer,) = of_type(first["events"], "TOOL_CALL_RESULT")
    assert answer["messageId"] == f"{call['toolCallId']}-result"
    # Run 1's answer: turn 1 (the call) under the reply's id, turn 2 (the text) under "<id>-2".
    reply = call["parentMessageId"]
    assert [e["messageId"] for e in of_type(first["events"], "TEXT_MESSAGE_START")] == [f"{reply}-2"]
    # The session keeps the same ids, and the client's state after run 2 agrees with it too.
    body = await stored(client, "ids-1")
    assert [m["id"] for m in body["messages"]][:3] == ["u1", reply, f"{reply}-1-results"]
    final = of_type(second["events"], "TEXT_MESSAGE_START")[0]["messageId"]
    assert [m["id"] for m in second["messages"] if m["role"] != "reasoning"] == [
        "u1",
        reply,
        answer["messageId"],
        f"{reply}-2",
        "u2",
        final,
    ]


async def test_a_user_message_sent_again_under_its_id_is_an_edit(client: TestClient) -> None:
    await run(client, agui_body("edit-1", "Name a fruit [emu:tokens=3]"))
    await run(
        client,
        {
            **agui_body("edit-1", "Name a tree [emu:tokens=3]"),
            "messages": [{"id": "u2", "role": "user", "content": "Name a tree [emu:tokens=3]"}],
        },
    )
    events = await run(client, agui_body("edit-1", "Name a city [emu:tokens=3]"))  # "u1" again
    snapshot = of_type(events, "MESSAGES_SNAPSHOT")[0]["messages"]
    assert [(m["id"], m["content"]) for m in snapshot] == [("u1", "Name a city [emu:tokens=3]")]
    body = await stored(client, "edit-1")
    assert [m["id"] for m in body["messages"]][0] == "u1" and len(body["messages"]) == 2
    # An id that is an answer's, not the user's: refused, and nothing changes.
    reply = body["messages"][1]["id"]
    bad = {**agui_body("edit-1", "x"), "messages": [{"id": reply, "role": "user", "content": "x"}]}
    assert "error" in (await run(client, bad, 409))[0]
    assert (await stored(client, "edit-1"))["messages"] == body["messages"]


# -- the client's own tools -----------------------------------------------------------------------


async def test_http_agent_answers_a_frontend_tool_and_the_query_goes_on(client: TestClient) -> None:
    require_node()
    result = await run_node("agui_tools.mjs", base_url(client), "tools-1", WHERE, "Lyon")
    first, second, third = result["runs"]
    # Run 1: the call streamed, no result, and the run ends with it pending.
    types = [event["type"] for event in first["events"]]
    assert "TOOL_CALL_END" in types and "TOOL_CALL_RESULT" not in types
    (call,) = of_type(first["events"], "TOOL_CALL_START")
    assert call["toolCallName"] == "get_location"
    finished = first["events"][-1]
    assert finished["type"] == "RUN_FINISHED" and finished["outcome"] == {
        "type": "success",
        "pendingToolCallIds": [call["toolCallId"]],
    }
    assert first["pending"] == [call["toolCallId"]]
    # Run 2: the rest of the same query, from a snapshot of what run 1 showed.
    assert [e["type"] for e in second["events"][:2]] == ["RUN_STARTED", "MESSAGES_SNAPSHOT"]
    assert second["events"][0]["runId"] == "run-2"
    assert comparable(second["events"][1]["messages"]) == comparable(first["messages"])
    (answer,) = of_type(second["events"], "TOOL_CALL_RESULT")
    assert answer["toolCallId"] == call["toolCallId"] and answer["content"] == "Lyon"
    assert "Lyon" in second["result"]["output"] and second["events"][-1]["type"] == "RUN_FINISHED"
    assert second["pending"] == []
    # The client's own tool message gave way to the service's, in its place: one per call.
    tools = [m for m in second["messages"] if m["role"] == "tool"]
    assert [m["id"] for m in tools] == [f"{call['toolCallId']}-result"]
    # Run 3's snapshot: every id as run 1 and 2 streamed them, and the client's own.
    snapshot = of_type(third["events"], "MESSAGES_SNAPSHOT")[0]["messages"]
    assert comparable(snapshot[:-1]) == comparable(second["messages"])
    assert snapshot[0]["id"] == "u1" and snapshot[-1]["id"] == "u2"
    assert streamed_ids(first["events"]) | streamed_ids(second["events"]) <= {m["id"] for m in snapshot}
    poll = await (await client.get("/sessions/tools-1/events/poll?since_index=0")).json()
    results = of_type(poll["events"], "client_tool_result")
    assert [(r["toolUseId"], r["output"], r["by"]) for r in results] == [
        (call["toolCallId"], "Lyon", "ag-ui")
    ]


async def test_a_frontend_tool_beside_a_server_tool(client: TestClient) -> None:
    tools = {"tools": [LOCATION]}
    first = await run(
        client, agui_body("tools-2", "Where and 2+2? [emu:tool=get_location,calculator]", **tools)
    )
    finished = first[-1]
    (pending,) = finished["outcome"]["pendingToolCallIds"]
    (server,) = of_type(first, "TOOL_CALL_RESULT")  # the server's own tool ran before the wait
    assert server["toolCallId"] != pending
    calls = {e["toolCallId"]: e for e in of_type(first, "TOOL_CALL_START")}
    assert set(calls) == {pending, server["toolCallId"]}
    assert len({e["parentMessageId"] for e in calls.values()}) == 1  # one assistant message
    # The next input as HttpAgent sends it: the whole thread, the server's result under its id.
    reply = calls[pending]["parentMessageId"]
    messages = [
        {"id": "u1", "role": "user", "content": "Where and 2+2?"},
        {"id": reply, "role": "assistant", "toolCalls": []},
        {"id": server["messageId"], "role": "tool", "toolCallId": server["toolCallId"], "content": "4"},
        {"id": "mine", "role": "tool", "toolCallId": pending, "content": "Paris"},
    ]
    second = await run(client, {**agui_body("tools-2", "", **tools), "runId": "r2", "messages": messages})
    assert [e["toolCallId"] for e in of_type(second, "TOOL_CALL_RESULT")] == [pending]
    assert second[-1]["type"] == "RUN_FINISHED" and "outcome" not in second[-1]
    body = await stored(client, "tools-2")
    assert body["status"] == "idle" and body["pending_tool_calls"] == []


async def test_tool_results_that_cannot_be_taken_are_refused(client: TestClient) -> None:
    first = await run(client, agui_body("tools-3", WHERE, tools=[LOCATION]))
    (pending,) = first[-1]["outcome"]["pendingToolCallIds"]

    def answering(*calls: tuple[str, dict[str, Any]]) -> dict[str, Any]:
        messages = [{"id": "u1", "role": "user", "content": WHERE}]
        messages += [{"id": f"a{n}", "role": "tool", "toolCallId": c, **f} for n, (c, f) in enumerate(calls)]
        return {**agui_body("tools-3", ""), "runId": "r2", "messages": messages}

    assert (await run(client, answering(("nope", {"content": "x"})), 404))[0]["error"]
    # Beside a good one: the unknown call's 404, and the good one not taken either.
    await run(client, answering((pending, {"content": "x"}), ("nope", {"content": "x"})), 404)
    await run(client, answering((pending, {"content": "a"}), (pending, {"content": "b"})), 409)
    await run(client, answering((pending, {"content": "\ud800"})), 422)
    await run(client, {**answering((pending, {"content": "x"})), "threadId": "elsewhere"}, 404)
    assert (await stored(client, "tools-3"))["pending_tool_calls"][0]["toolUseId"] == pending
    # An error result is the model's to see; then the call is answered, and a second answer a 409.
    second = await run(client, answering((pending, {"content": "", "error": "denied by the user"})))
    (result,) = of_type(second, "TOOL_CALL_RESULT")
    assert result["content"] == "denied by the user" and second[-1]["type"] == "RUN_FINISHED"
    await run(client, answering((pending, {"content": "late"})), 409)
    # Only the service's own results at the end, nothing new: not a query.
    own = {
        **answering(),
        "messages": [{"id": f"{pending}-result", "role": "tool", "toolCallId": pending, "content": "x"}],
    }
    await run(client, own, 422)


@pytest.mark.parametrize(
    ("tools", "problem"),
    [
        ([{"name": "calculator", "description": "mine"}], "calculator"),
        ([LOCATION, LOCATION], "twice"),
        ([{"name": "has space", "description": ""}], "tools.0.name"),
        ([{**LOCATION, "parameters": "object"}], "tools.0.parameters"),
        ([{**LOCATION, "parameters": {"type": "object", "default": float("inf")}}], None),
    ],
)
async def test_bad_tools_are_a_422_and_make_no_thread(
    client: TestClient, tools: list[dict[str, Any]], problem: str | None
) -> None:
    async with client.post(
        "/ag-ui",
        data=json.dumps(agui_body("tools-bad", "hi", tools=tools)),
        headers={"Content-Type": "application/json"},
    ) as response:
        assert response.status in ((422,) if problem else (400, 422)), await response.text()
        if problem:
            assert problem in (await response.json())["error"]
    async with client.get("/sessions/tools-bad") as response:
        assert response.status == 404


# -- multitask_strategy ---------------------------------------------------------------------------


async def test_http_agent_interrupts_the_running_query(client: TestClient) -> None:
    require_node()
    result = await run_node(
        "agui_multitask.mjs", base_url(client), "multi-1", "interrupt", SLOW, "Then this [emu:tokens=3]"
    )
    first, second = result["first"], result["second"]
    assert first["events"][-1]["type"] == "RUN_FINISHED" and first["result"]["cancelled"] is True
    assert second["events"][-1]["type"] == "RUN_FINISHED" and "cancelled" not in second["result"]
    snapshot = of_type(second["events"], "MESSAGES_SNAPSHOT")[0]["messages"]
    partial = of_type(first["events"], "TEXT_MESSAGE_START")[0]["messageId"]
    assert [m["id"] for m in snapshot] == ["run-1-user", partial, "run-2-user"]


async def test_reject_is_a_409_and_a_bad_strategy_a_422(client: TestClient) -> None:
    await run(client, agui_body("multi-2", WHERE, tools=[LOCATION]))  # it waits on its tool
    for props, status in (
        ({}, 409),
        ({"multitask_strategy": "reject"}, 409),
        ({"multitask_strategy": "x"}, 422),
    ):
        body = agui_body("multi-2", "again", forwardedProps=props)
        body["messages"][0]["id"] = "u2"
        assert "error" in (await run(client, body, status))[0]
    assert (await stored(client, "multi-2"))["status"] == "waiting"
    async with client.post("/sessions/multi-2/cancel") as response:
        assert response.status == 202


async def reply(client: TestClient, body: dict[str, Any]) -> tuple[int, Any]:
    """POST /ag-ui: the status, and the events (or the error body)."""
    async with client.post("/ag-ui", json=body) as response:
        if response.status != 200:
            return response.status, await response.json()
        return 200, [event["data"] async for event in sse_events(response)]


async def test_enqueue_waits_for_the_running_query_then_streams(make_client: ClientFactory) -> None:
    client = await make_client(max_queued=1)
    first = await run(client, agui_body("multi-3", WHERE, tools=[LOCATION]))
    (pending,) = first[-1]["outcome"]["pendingToolCallIds"]  # the query waits until it is answered
    session = await services_of(client).sessions.get("multi-3")
    last = await session.log.last_id()
    sends = []
    for message_id in ("u2", "u3"):
        body = agui_body("multi-3", "Next [emu:tokens=3]", forwardedProps={"multitask_strategy": "enqueue"})
        body["messages"][0]["id"] = message_id
        sends.append(asyncio.ensure_future(reply(client, body)))
    # One place in the queue: whichever came second is refused, so the other one waits in it now.
    done, _ = await asyncio.wait(sends, return_when=asyncio.FIRST_COMPLETED)
    (full,) = done
    status, error = full.result()
    assert status == 429 and error["quota"] == "queued"
    (queued,) = [send for send in sends if send is not full]
    answer = {
        **agui_body("multi-3", ""),
        "messages": [{"id": "a", "role": "tool", "toolCallId": pending, "content": "Oslo"}],
    }
    rest = await run(client, answer)
    assert rest[-1]["type"] == "RUN_FINISHED"
    status, events = await queued
    assert status == 200
    snapshot = of_type(events, "MESSAGES_SNAPSHOT")[0]["messages"]
    assert [m["role"] for m in snapshot] == ["user", "assistant", "tool", "assistant", "user"]
    assert events[-1]["type"] == "RUN_FINISHED"
    started = await logged(client, "multi-3", "run_started", last)
    assert started.event.message_id == snapshot[-1]["id"]
    ended = await logged(client, "multi-3", "done", last)
    assert ended.id < started.id  # it started once the first query was over


# -- fuzz -----------------------------------------------------------------------------------------

SERVICE_TOOLS = ("calculator",)
STRATEGIES = ("reject", "enqueue", "interrupt", "rollback")
CHAT_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
tool_names = st.sampled_from(["get_location", "calculator", "a b", "", "x" * 65, "ok_2"]) | any_text
tools = st.fixed_dictionaries(
    {"name": tool_names, "description": st.just("d") | any_text},
    optional={"parameters": st.just({"type": "object"}) | json_values},
)
tool_messages = st.fixed_dictionaries(
    {
        "id": st.sampled_from(["t", "call-result"]) | any_text,
        "role": st.just("tool"),
        "toolCallId": st.just("call") | any_text,
        "content": st.just("ok") | any_text | json_values,
    },
    optional={"error": any_text},
)
user_messages = st.fixed_dictionaries(
    {"id": st.just("u") | any_text, "role": st.just("user"), "content": good_text | any_text}
)
new_fields = st.fixed_dictionaries(
    {
        "threadId": st.uuids().map(lambda uuid: f"fz-agui-{uuid.hex}"),  # a thread of its own
        "runId": st.just("r"),
        "messages": st.lists(user_messages | tool_messages, min_size=1, max_size=3),
    },
    optional={
        "tools": st.lists(tools, max_size=3) | json_values,
        "forwardedProps": st.fixed_dictionaries(
            {
                "multitask_strategy": st.sampled_from(["reject", "enqueue", "interrupt", "rollback", "x"])
                | json_values
            }
        )
        | json_values,
    },
).map(encoded)


def _text(content: Any) -> str:
    return content if isinstance(content, str) else "".join(getattr(p, "text", "") or "" for p in content)


def _tools_refused(tools: list[Tool]) -> bool:
    names = [tool.name for tool in tools]
    for tool in tools:
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", tool.name) or tool.name in SERVICE_TOOLS:
            return True
        if names.count(tool.name) > 1 or has_surrogate(tool.description) or len(tool.description) > 10_000:
            return True
        params = tool.parameters
        if params is not None and (not isinstance(params, dict) or contains_surrogate(params)):
            return True
    return len(tools) > 64


def ag_ui_status(value: Any) -> int:
    """The status ``POST /ag-ui`` gives a parsed body in a thread where no query runs (the
    fuzzers' oracle; tests/transports/test_fuzz_protocols.py uses it too)."""
    if "\\u0000" in json.dumps(value):
        return 422  # U+0000 anywhere in a body
    try:
        body = RunAgentInput.model_validate(value)
    except ValidationError:
        return 422
    if not CHAT_ID.fullmatch(body.thread_id) or has_surrogate(body.run_id) or not body.messages:
        return 422
    props = body.forwarded_props
    if isinstance(props, dict) and props.get("multitask_strategy", "reject") not in STRATEGIES:
        return 422
    if _tools_refused(body.tools or []):
        return 422
    trailing = []
    for message in reversed(body.messages):
        if not isinstance(message, ToolMessage):
            break
        trailing.append(message)
    answers = [m for m in trailing if m.id != f"{m.tool_call_id}-result"]
    if answers:
        # Results of client tool calls, which no query waits on: unknown calls.
        return 422 if any(has_surrogate(m.error or _text(m.content)) for m in answers) else 404
    last = body.messages[-1]
    if not isinstance(last, UserMessage):
        return 422
    text = _text(last.content)
    if not text.strip() or has_surrogate(text) or len(text) > MAX_CHARS:
        return 422
    if not 1 <= len(last.id) <= 128 or has_surrogate(last.id):  # kept as the message's id
        return 422
    return 200


@pytest.mark.slow
@fuzz
@example(
    body=encoded(
        {"runId": "r", "messages": [{"id": "u", "role": "user", "content": "hi"}], "tools": [LOCATION]}
    )
)
@example(
    body=encoded(
        {
            "threadId": "fz-agui-b",
            "runId": "r",
            "messages": [{"id": "t", "role": "tool", "toolCallId": "c", "content": "x"}],
            "forwardedProps": {"multitask_strategy": "enqueue"},
        }
    )
)
@given(body=new_fields)
async def test_ag_ui_new_fields(
    fuzzed: TestClient,  # noqa: F811 (the fixture imported above)
    caplog: pytest.LogCaptureFixture,
    body: Any,
) -> None:
    caplog.clear()
    raw, value = body
    if len(raw) > MAX_BYTES:
        allowed = {413}
    else:
        allowed = {400} if value is MALFORMED else {ag_ui_status(value)}
    async with fuzzed.post("/ag-ui", data=raw, headers={"Content-Type": "application/json"}) as response:
        note(f"status {response.status}")
        if response.status == 200 and 200 in allowed:
            events = [item["data"]["type"] for item in await read_sse(response)]
            assert events[0] == "RUN_STARTED" and events[-1] in ("RUN_FINISHED", "RUN_ERROR"), events
        else:
            await assert_error(response, allowed)
    await finish(fuzzed, caplog)
