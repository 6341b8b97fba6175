"""The AI SDK and AG-UI projections as pure functions of the log entries they are fed."""

from __future__ import annotations

import json
from typing import Any

from service.core.events import (
    Event,
    ReasoningDelta,
    RunDone,
    RunError,
    RunStarted,
    StatusChange,
    StepCompleted,
    TextDelta,
    ToolExecuting,
    ToolInputDelta,
    ToolResult,
    ToolUse,
    ToolUseStart,
    TurnCompleted,
    Usage,
)
from service.core.log import LogEntry
from service.transports.agui import models as agui_models
from service.transports.agui import projector as agui
from service.transports.aisdk import projector as aisdk

USAGE = Usage(input_tokens=5, output_tokens=3, total_tokens=8)
RUN: list[Event] = [
    RunStarted(run_id="r1", message="What is 2+2?", max_turns=5),
    StatusChange(status="running"),
    ReasoningDelta(text="Let me"),
    ReasoningDelta(text=" think"),
    ToolUseStart(tool="calculator", tool_use_id="t1"),
    ToolInputDelta(tool_use_id="t1", delta='{"expression": '),
    ToolInputDelta(tool_use_id="t1", delta='"2+2"}'),
    ToolUse(tool="calculator", tool_use_id="t1", input={"expression": "2+2"}),
    TurnCompleted(turn=1, stop_reason="tool_use", usage=USAGE, total_usage=USAGE),
    ToolExecuting(tool="calculator", tool_use_id="t1"),
    ToolResult(tool="calculator", tool_use_id="t1", result="4"),
    StepCompleted(turn=1),
    TextDelta(text="It is", turn=2),
    TextDelta(text=" 4.", turn=2),
    StepCompleted(turn=2),
    StatusChange(status="idle"),
    RunDone(turns=2, output="It is 4.", usage=USAGE),
]


def entries(events: list[Event], first: int = 1) -> list[LogEntry]:
    return [LogEntry(id=first + n, event=event, size=0, ts=1.0) for n, event in enumerate(events)]


def ai_sdk(log: list[LogEntry]) -> list[tuple[int, dict[str, Any]]]:
    stream = aisdk.UIMessageStream()
    return [(entry.id, part) for entry in log for part in stream.parts(entry)]


def test_ai_sdk_parts_of_a_tool_turn_and_an_answer() -> None:
    parts = ai_sdk(entries(RUN))
    assert [part["type"] for _, part in parts] == [
        "start",
        "start-step",
        "reasoning-start",
        "reasoning-delta",
        "reasoning-delta",
        "reasoning-end",
        "tool-input-start",
        "tool-input-delta",
        "tool-input-delta",
        "tool-input-available",
        "tool-output-available",
        "finish-step",
        "start-step",
        "text-start",
        "text-delta",
        "text-delta",
        "text-end",
        "finish-step",
        "finish",
    ]
    by_type = {part["type"]: (entry_id, part) for entry_id, part in parts}
    assert by_type["start"] == (1, {"type": "start", "messageId": "msg-r1"})
    assert by_type["tool-input-available"][1] == {
        "type": "tool-input-available",
        "toolCallId": "t1",
        "toolName": "calculator",
        "input": {"expression": "2+2"},
        "dynamic": True,
    }
    assert by_type["tool-output-available"][1]["output"] == "4"
    assert by_type["text-start"] == (13, {"type": "text-start", "id": "text-13"})
    assert by_type["finish"][1] == {
        "type": "finish",
        "finishReason": "stop",
        "messageMetadata": {
            "usage": {"input_tokens": 5, "output_tokens": 3, "total_tokens": 8},
            "turns": 2,
            "stop_reason": "end_turn",
        },
    }


def test_ai_sdk_failures_and_cancellation() -> None:
    failed = ai_sdk(entries([*RUN[:3], RunError(error="boom", code="provider_error")]))
    assert [part["type"] for _, part in failed][-3:] == ["reasoning-end", "finish-step", "error"]
    assert failed[-1][1]["errorText"] == "boom"
    errored = ai_sdk(
        entries([*RUN[:11], ToolResult(tool="x", tool_use_id="t1", result="bad", is_error=True)])
    )
    assert errored[-1][1] == {
        "type": "tool-output-error",
        "toolCallId": "t1",
        "errorText": "bad",
        "dynamic": True,
    }
    cancelled = ai_sdk(entries([*RUN[:4], RunDone(turns=1, cancelled=True)]))
    assert [part["type"] for _, part in cancelled][-2:] == ["abort", "finish"]
    assert cancelled[-1][1]["messageMetadata"]["cancelled"] is True


def test_ai_sdk_primed_stream_continues_where_the_client_was() -> None:
    log = entries(RUN)
    whole = ai_sdk(log)
    stream = aisdk.UIMessageStream()
    stream.prime(log[:13])  # the client saw the first text delta
    rest = [(entry.id, part) for entry in log[13:] for part in stream.parts(entry)]
    assert rest == [(entry_id, part) for entry_id, part in whole if entry_id > 13]


def test_ai_sdk_blocks_carry_the_entry_id_and_cache_text() -> None:
    log = entries(RUN)
    stream, other = aisdk.UIMessageStream(), aisdk.UIMessageStream()
    text = [stream.frames(entry).decode() for entry in log][13]
    assert text == 'id: 14\r\ndata: {"type":"text-delta","id":"text-13","delta":" 4."}\r\n\r\n'
    assert [other.frames(entry).decode() for entry in log][13] == text
    for block in [aisdk.UIMessageStream().frames(entry).decode() for entry in log[:1]]:
        assert block.startswith("id: 1\r\n")


def test_ag_ui_text_blocks_are_encoded_once_per_entry_and_match_the_encoder() -> None:
    log = entries(RUN)
    reader, second = agui.AgUiStream("thread", []), agui.AgUiStream("thread", [])
    first = [reader.frames(entry).decode() for entry in log]
    cached = [entry for entry in log if "ag-ui" in entry.encoded]
    assert cached and all(type(entry.event) is TextDelta for entry in cached)
    # A second reader of the same entries gets the kept blocks, the same as the encoder's own.
    assert [second.frames(entry).decode() for entry in log] == first
    uncached = agui.AgUiStream("thread", [])
    by_encoder = ["".join(agui.encode(e, entry.id) for e in uncached.events(entry)) for entry in entries(RUN)]
    assert by_encoder == first


def test_ag_ui_events_of_a_run() -> None:
    history = [
        {"role": "user", "content": [{"text": "hi"}]},
        {"role": "assistant", "content": [{"text": "hello"}]},
    ]
    stream = agui.AgUiStream("thread", history, run_id="client-run")
    events = [(entry.id, event) for entry in entries(RUN) for event in stream.events(entry)]
    types = [event.type.value for _, event in events]
    assert types == [
        "RUN_STARTED",
        "MESSAGES_SNAPSHOT",
        "STEP_STARTED",
        "REASONING_START",
        "REASONING_MESSAGE_START",
        "REASONING_MESSAGE_CONTENT",
        "REASONING_MESSAGE_CONTENT",
        "REASONING_MESSAGE_END",
        "REASONING_END",
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
        "TOOL_CALL_RESULT",
        "STEP_FINISHED",
        "STEP_STARTED",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "STEP_FINISHED",
        "RUN_FINISHED",
    ]
    snapshot = json.loads(events[1][1].model_dump_json(by_alias=True))
    assert snapshot["messages"] == [
        {"id": "m0", "role": "user", "content": "hi"},
        {"id": "m1", "role": "assistant", "content": "hello"},
        {"id": "m2", "role": "user", "content": "What is 2+2?"},
    ]
    finished = json.loads(events[-1][1].model_dump_json(by_alias=True))
    assert finished["runId"] == "client-run" and finished["threadId"] == "thread"
    assert finished["usage"] == [{"inputTokens": 5, "outputTokens": 3, "totalTokens": 8}]
    encoded = agui.encode(events[-1][1], events[-1][0])
    assert encoded.startswith("id: 17\ndata: {") and encoded.endswith("}\n\n") and "\r" not in encoded


def test_ag_ui_history_of_tool_turns_and_of_a_running_query() -> None:
    conversation = [
        {"role": "user", "content": [{"text": "2+2?"}]},
        {
            "role": "assistant",
            "content": [{"toolUse": {"toolUseId": "t1", "name": "calculator", "input": {"a": 1}}}],
        },
        {
            "role": "user",
            "content": [{"toolResult": {"toolUseId": "t1", "content": [{"text": "no"}], "status": "error"}}],
        },
        {"role": "assistant", "content": [{"text": "It failed."}]},
        {"role": "user", "content": [{"text": "again"}]},
    ]
    messages = [json.loads(m.model_dump_json(by_alias=True)) for m in agui_models.messages_of(conversation)]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant", "user"]
    assert messages[1]["toolCalls"][0]["function"] == {"name": "calculator", "arguments": '{"a": 1}'}
    assert messages[2] == {
        "id": "t1-result",
        "role": "tool",
        "content": "no",
        "toolCallId": "t1",
        "error": "no",
    }
    assert [m["id"] for m in messages] == ["m0", "m1", "t1-result", "m3", "m4"]  # stored before ids
    # A running query's own user message (and what follows it) is not history.
    conversation[4]["id"] = "u-again"
    assert agui_models.history_before(conversation, "u-again") == conversation[:4]
    assert agui_models.history_before(conversation, "unseen") == conversation


def test_ag_ui_error_ends_the_run_at_once() -> None:
    stream = agui.AgUiStream("t", [])
    log = entries([*RUN[:13], RunError(error="boom", code="provider_error")])
    events = [event for entry in log for event in stream.events(entry)]
    assert events[-1].type.value == "RUN_ERROR" and events[-1].message == "boom"
    assert events[-2].type.value == "TEXT_MESSAGE_CONTENT"
