"""The Responses projection as pure functions: the events a query's log becomes, their numbers,
and the response object they build; the same from any reader and from any point."""

from __future__ import annotations

import json
from typing import Any

from service.core.events import (
    ReasoningDelta,
    RunDone,
    RunError,
    RunStarted,
    StatusChange,
    TextDelta,
    ToolApprovalRequest,
    ToolExecuting,
    ToolInputDelta,
    ToolResult,
    ToolUse,
    ToolUseStart,
    Usage,
)
from service.core.log import LogEntry
from service.transports.responses.projector import ResponseProjection, ResponseStream
from service.transports.responses.stored import from_conversation
from service.transports.stream.follow import Ending

RESPONSE = "resp_0123456789abcdefSESSION"
REQUEST = {
    "model": "m",
    "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}],
    "metadata": {"k": "v"},
    "instructions": "Be brief.",
    "background": True,
}
USAGE = Usage(input_tokens=3, output_tokens=4, total_tokens=7)


def query_events() -> list[Any]:
    return [
        RunStarted(run_id="r", message="q", max_turns=5, reply_id=RESPONSE, request=REQUEST, at=100.0),
        StatusChange(status="running"),
        ReasoningDelta(text="hmm"),
        TextDelta(text="Let me ", turn=1),
        TextDelta(text="add.", turn=1),
        ToolUseStart(tool="calculator", tool_use_id="t1"),
        ToolInputDelta(tool_use_id="t1", delta='{"expression":"1+1"}'),
        ToolUse(tool="calculator", tool_use_id="t1", input={"expression": "1+1"}),
        ToolExecuting(tool="calculator", tool_use_id="t1"),
        ToolResult(tool="calculator", tool_use_id="t1", result="2"),
        TextDelta(text="It is 2.", turn=2),
        ToolUseStart(tool="get_weather", tool_use_id="t2", turn=2),
        ToolInputDelta(tool_use_id="t2", delta='{"city":', turn=2),
        ToolInputDelta(tool_use_id="t2", delta='"Oslo"}', turn=2),
        ToolUse(tool="get_weather", tool_use_id="t2", input={"city": "Oslo"}, turn=2),
        RunDone(turns=2, usage=USAGE, stop_reason="tool_use"),
    ]


def entries(events: list[Any], first: int = 11) -> list[LogEntry]:
    return [LogEntry(first + n, event, 0, ts=200.0 + n) for n, event in enumerate(events)]


def sse_events(stream: ResponseStream, log: list[LogEntry]) -> list[dict[str, Any]]:
    raw = b"".join(stream.frames(entry) for entry in log).decode()
    return [
        json.loads(line.removeprefix("data: "))
        for block in raw.split("\n\n")
        for line in block.split("\n")
        if line.startswith("data: ")
    ]


def test_a_query_becomes_items_in_order_each_event_numbered() -> None:
    projection = ResponseProjection(RESPONSE, "SESSION")
    events = [event for entry in entries(query_events()) for event in projection.feed(entry.event, entry.ts)]
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    kinds = [event["type"] for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert "response.reasoning_summary_text.delta" in kinds and "response.mcp_call.completed" in kinds
    assert kinds.count("response.function_call_arguments.delta") == 2
    response = projection.response()
    assert [(item["type"], item["status"]) for item in response["output"]] == [
        ("reasoning", "completed"),
        ("message", "completed"),
        ("mcp_call", "completed"),
        ("message", "completed"),
        ("function_call", "completed"),
    ]
    reasoning, first, call, second, handed = response["output"]
    assert reasoning["summary"] == [{"type": "summary_text", "text": "hmm"}]
    assert first["content"][0]["text"] == "Let me add." and second["content"][0]["text"] == "It is 2."
    assert first["id"] != second["id"]  # one item per model turn
    assert (call["name"], call["arguments"], call["output"]) == ("calculator", '{"expression":"1+1"}', "2")
    assert (handed["call_id"], handed["arguments"]) == ("t2", '{"city":"Oslo"}')
    assert response["usage"]["total_tokens"] == 7 and response["status"] == "completed"
    assert (response["metadata"], response["instructions"], response["tools"]) == (
        {"k": "v"},
        "Be brief.",
        REQUEST["tools"],
    )
    assert response["created_at"] == 100.0 and response["completed_at"] == 215.0
    # Every item event points at the item it belongs to.
    for event in events:
        if "output_index" in event and "item_id" in event:
            assert response["output"][event["output_index"]]["id"] == event["item_id"]


def test_every_reader_writes_the_same_bytes_and_a_resumed_one_the_rest() -> None:
    log = entries(query_events())
    first = sse_events(ResponseStream(ResponseProjection(RESPONSE, "SESSION")), log)
    second = sse_events(ResponseStream(ResponseProjection(RESPONSE, "SESSION")), log)  # from the cache
    assert first == second
    for cut in (0, 5, 9, len(first) - 2):
        resumed = sse_events(ResponseStream(ResponseProjection(RESPONSE, "SESSION"), starting_after=cut), log)
        assert resumed == first[cut + 1 :]


def test_an_approval_shows_as_a_request_item_while_the_response_waits() -> None:
    projection = ResponseProjection(RESPONSE, "SESSION")
    events = [
        RunStarted(run_id="r", message="q", max_turns=5, reply_id=RESPONSE, request={"model": "m"}),
        ToolUseStart(tool="calculator", tool_use_id="t1"),
        ToolUse(tool="calculator", tool_use_id="t1", input={"expression": "2"}),
        ToolApprovalRequest(
            approval_id="ap1", tool="calculator", tool_use_id="t1", input={"expression": "2"}, expires_at=0
        ),
        StatusChange(status="waiting"),
    ]
    for event in events:
        projection.feed(event)
    response = projection.response()
    assert response["status"] == "in_progress"
    request = response["output"][-1]
    assert (request["type"], request["approval_id"], request["name"]) == (
        "mcp_approval_request",
        "ap1",
        "calculator",
    )


def test_failed_cancelled_and_cut_short_responses() -> None:
    started = RunStarted(run_id="r", message="q", max_turns=5, reply_id=RESPONSE, request={"model": "m"})
    failed = ResponseProjection(RESPONSE, "S")
    for event in (started, TextDelta(text="par"), RunError(error="boom", code="ThrottlingException")):
        *_, last = failed.feed(event) or [None]
    assert last is not None and last["type"] == "response.failed"
    assert failed.response()["error"] == {"code": "ThrottlingException", "message": "boom"}
    assert failed.response()["output"][0]["status"] == "incomplete"
    cancelled = ResponseProjection(RESPONSE, "S")
    for event in (started, TextDelta(text="par"), RunDone(turns=1, cancelled=True)):
        cancelled.feed(event)
    assert cancelled.response()["status"] == "cancelled"
    truncated = ResponseProjection(RESPONSE, "S")
    for event in (started, TextDelta(text="par"), RunDone(turns=1, truncated=True, stop_reason="max_tokens")):
        truncated.feed(event)
    assert truncated.response()["incomplete_details"] == {"reason": "max_output_tokens"}
    stream = ResponseStream(ResponseProjection(RESPONSE, "S"))
    stream.frames(entries([started])[0])
    ending = stream.end(Ending("purged", 11, "events purged", 40))
    assert '"type":"error"' in ending and '"code":"events_purged"' in ending


def test_a_response_is_told_from_the_conversation_once_its_events_are_gone() -> None:
    messages = [
        {"role": "user", "content": [{"text": "q"}], "id": f"{RESPONSE}-input"},
        {
            "role": "assistant",
            "id": RESPONSE,
            "usage": {"input_tokens": 1, "output_tokens": 2, "total_tokens": 3},
            "content": [
                {"text": "Let me add."},
                {"toolUse": {"toolUseId": "t1", "name": "calculator", "input": {}}},
            ],
        },
        {
            "role": "user",
            "id": f"{RESPONSE}-1-results",
            "content": [{"toolResult": {"toolUseId": "t1", "content": [{"text": "2"}]}}],
        },
        {
            "role": "assistant",
            "id": f"{RESPONSE}-2",
            "content": [
                {"text": "It is 2."},
                {"toolUse": {"toolUseId": "t2", "name": "get_weather", "input": {"city": "Oslo"}}},
            ],
        },
    ]
    response = from_conversation(RESPONSE, "SESSION", messages)
    assert [item["type"] for item in response["output"]] == [
        "message",
        "mcp_call",
        "message",
        "function_call",
    ]
    live = ResponseProjection(RESPONSE, "SESSION")
    for entry in entries(query_events()):
        live.feed(entry.event, entry.ts)
    # The items keep the ids the live stream gave them.
    told = {item["id"] for item in response["output"]}
    assert told <= {item["id"] for item in live.response()["output"]}
    assert response["usage"]["total_tokens"] == 3 and response["status"] == "completed"


def test_text_after_reasoning_in_one_turn_is_a_new_item_with_its_own_id() -> None:
    projection = ResponseProjection(RESPONSE, "SESSION")
    started = RunStarted(run_id="r", message="q", max_turns=5, reply_id=RESPONSE, request={"model": "m"})
    for event in (
        started,
        TextDelta(text="a"),
        ReasoningDelta(text="b"),
        TextDelta(text="c"),
        RunDone(turns=1),
    ):
        projection.feed(event)
    ids = [item["id"] for item in projection.response()["output"]]
    assert len(ids) == 3 and len(set(ids)) == 3
    told = from_conversation(
        RESPONSE,
        "SESSION",
        [
            {
                "role": "assistant",
                "id": RESPONSE,
                "content": [
                    {"text": "a"},
                    {"reasoningContent": {"reasoningText": {"text": "b"}}},
                    {"text": "c"},
                ],
            }
        ],
    )
    assert [item["id"] for item in told["output"]] == ids
