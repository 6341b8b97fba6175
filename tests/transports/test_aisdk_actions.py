"""The AI SDK face's chat actions: message ids shared with the server, regenerate, edit, the
browser's own tools, ``multitask_strategy``, and ``GET /api/chat/{id}``.

The wire tests post what ``DefaultChatTransport`` posts and read the stream; the client tests run
npm ``ai`` 6 and 7's own ``AbstractChat`` (what ``useChat`` wraps) from tests/node/aisdk_*.mjs;
the fuzz test throws the new fields at ``POST /api/chat``. Every wait is on the log itself.
"""

from __future__ import annotations

import json
from contextlib import aclosing
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient

from service.core.log import LogEntry
from tests.conftest import ClientFactory, services_of, sse_blocks

fast = pytest.mark.fast

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
