"""The OpenAI Chat Completions dialect as pure functions: requests to the canonical conversation,
events to chunks, and the completion folded from the same chunks."""

from __future__ import annotations

import json
from typing import Any

import pytest

from service.core.conversation import tool_use_id
from service.core.events import (
    ReasoningDelta,
    RunDone,
    RunError,
    TextDelta,
    ToolExecuting,
    ToolInputDelta,
    ToolResult,
    ToolUse,
    ToolUseStart,
    Usage,
)
from service.transports.edge.openai_errors import InvalidParam, run_error_status
from service.transports.openai.models import ChatCompletionRequest
from service.transports.openai.projector import (
    NO_OUTPUT,
    ChatProjection,
    to_query,
)
from service.transports.openai.routes import _param


def request(messages: list[dict[str, Any]], **extra: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": messages, **extra})


def call(call_id: str, name: str = "f", arguments: str = '{"a": 1}') -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def test_a_conversation_maps_onto_the_canonical_one() -> None:
    query = to_query(
        request(
            [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "first"}]},
                {"role": "assistant", "content": "ok"},
                {"role": "developer", "content": "Use metric units."},
                {"role": "user", "content": "second"},
            ],
            max_completion_tokens=50,
        )
    )
    assert query.text == "second"
    assert query.messages == [
        {"role": "user", "content": [{"text": "first"}]},
        {"role": "assistant", "content": [{"text": "ok"}]},
    ]
    assert query.options.system == "Be brief.\n\nUse metric units."
    assert query.options.max_tokens == 50
    assert not query.options.resume and query.options.client_tools == ()


def test_tool_results_resume_the_conversation() -> None:
    odd = "call id with spaces"
    query = to_query(
        request(
            [
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": None, "tool_calls": [call("call_1"), call(odd, "g", "")]},
                {"role": "tool", "tool_call_id": odd, "content": ""},
                {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "sunny"}]},
            ],
            tools=[{"type": "function", "function": {"name": "f"}}],
        )
    )
    mapped = tool_use_id(odd)
    assert mapped != odd and mapped == tool_use_id(odd)  # one mapping, wherever the id appears
    assert query.options.resume and query.text == ""
    assert query.messages == [
        {"role": "user", "content": [{"text": "weather?"}]},
        {
            "role": "assistant",
            "content": [
                {"toolUse": {"toolUseId": "call_1", "name": "f", "input": {"a": 1}}},
                {"toolUse": {"toolUseId": mapped, "name": "g", "input": {}}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"toolResult": {"toolUseId": mapped, "content": [{"text": NO_OUTPUT}]}},
                {"toolResult": {"toolUseId": "call_1", "content": [{"text": "sunny"}]}},
            ],
        },
    ]
    assert query.options.client_tools == (
        {"name": "f", "description": "", "input_schema": {"type": "object", "properties": {}}},
    )


def test_thousands_of_tool_results_keep_their_turns_and_order() -> None:
    """Each run of tool messages is one message of results, in the order they came (8,000 of them,
    in two turns, answered out of order); gathering them costs one append each."""
    first = [f"a{n}" for n in range(5000)]
    second = [f"b {n}" for n in range(3000)]  # ids Bedrock would not take: mapped
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "tool_calls": [call(call_id) for call_id in first]},
        *({"role": "tool", "tool_call_id": call_id, "content": call_id} for call_id in reversed(first)),
        {"role": "assistant", "content": "more", "tool_calls": [call(call_id) for call_id in second]},
        *({"role": "tool", "tool_call_id": call_id, "content": f"r{n}"} for n, call_id in enumerate(second)),
    ]
    query = to_query(request(messages))
    assert [message["role"] for message in query.messages] == [
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    answered = query.messages[2]["content"]
    assert [block["toolResult"]["toolUseId"] for block in answered] == list(reversed(first))
    assert [block["toolResult"]["content"] for block in answered] == [[{"text": i}] for i in reversed(first)]
    later = query.messages[4]["content"]
    assert [block["toolResult"]["toolUseId"] for block in later] == [tool_use_id(i) for i in second]
    assert later[-1]["toolResult"]["content"] == [{"text": "r2999"}]
    assert query.options.resume and query.text == ""


@pytest.mark.parametrize(
    ("messages", "extra", "param"),
    [
        ([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], {}, "messages.[1]"),
        ([{"role": "system", "content": "a"}], {}, "messages.[0]"),
        ([{"role": "user", "content": [{"type": "input_audio"}]}], {}, "messages.[0].content.[0]"),
        (
            [
                {"role": "user", "content": "a"},
                {"role": "assistant", "tool_calls": [call("c", arguments="[1]")]},
            ],
            {},
            "messages.[1].tool_calls.[0].function.arguments",
        ),
        (
            [
                {"role": "user", "content": "a"},
                {"role": "assistant", "tool_calls": [call("c"), call("c")]},
            ],
            {},
            "messages.[1].tool_calls",
        ),
        (
            [{"role": "user", "content": "a"}],
            {"tools": [{"type": "function", "function": {"name": "f"}}] * 2},
            "tools.[1]",
        ),
    ],
)
def test_what_no_model_could_take_is_refused(
    messages: list[dict[str, Any]], extra: dict[str, Any], param: str
) -> None:
    with pytest.raises(InvalidParam) as caught:
        to_query(request(messages, **extra))
    assert caught.value.param == param


def test_pydantic_locations_become_openai_params() -> None:
    assert _param(("messages", 0, "user", "content", "str")) == "messages.[0].content"
    assert _param(("messages", 2, "assistant", "tool_calls", 0, "function", "name")) == (
        "messages.[2].tool_calls.[0].function.name"
    )
    assert _param(("stream",)) == "stream"
    assert _param(()) == "body"


def project_all(projection: ChatProjection, events: list[Any]) -> list[dict[str, Any]]:
    return [chunk for event in events if (chunk := projection.project(event)) is not None]  # type: ignore[misc]


def test_chunks_show_text_reasoning_and_client_calls_only() -> None:
    projection = ChatProjection("chatcmpl-1", "m", 7, frozenset({"get_weather"}))
    usage = Usage(input_tokens=3, output_tokens=4, total_tokens=7)
    events = [
        ReasoningDelta(text="hmm"),
        TextDelta(text="Let me add.", turn=1),
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
        RunDone(turns=2, usage=usage, stop_reason="tool_use"),
    ]
    chunks = project_all(projection, events)
    deltas = [chunk["choices"][0]["delta"] for chunk in chunks]
    assert deltas == [
        {"reasoning_content": "hmm"},
        {"content": "Let me add."},
        {"content": "\n\nIt is 2."},
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "t2",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": ""},
                }
            ]
        },
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"city":'}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '"Oslo"}'}}]},
        {},
    ]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert all(chunk["id"] == "chatcmpl-1" and chunk["created"] == 7 for chunk in chunks)
    completion = projection.completion()
    message = completion["choices"][0]["message"]
    assert message["content"] == "Let me add.\n\nIt is 2."
    assert message["reasoning_content"] == "hmm"
    assert message["tool_calls"] == [
        {"id": "t2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}}
    ]
    assert completion["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    usage_chunk = projection.usage_chunk()
    assert usage_chunk["choices"] == [] and usage_chunk["usage"] == completion["usage"]


def test_a_call_whose_start_was_not_seen_comes_whole() -> None:
    projection = ChatProjection("c", "m", 0, frozenset({"f"}))
    [chunk] = project_all(projection, [ToolUse(tool="f", tool_use_id="t", input={"x": [1]})])
    piece = chunk["choices"][0]["delta"]["tool_calls"][0]
    assert json.loads(piece["function"]["arguments"]) == {"x": [1]}


@pytest.mark.parametrize(
    ("done", "reason"),
    [
        (RunDone(turns=1), "stop"),
        (RunDone(turns=1, stop_reason="max_tokens", truncated=True), "length"),
        (RunDone(turns=3, stop_reason="max_turns", max_turns_reached=True), "length"),
        (RunDone(turns=1, stop_reason="content_filtered"), "content_filter"),
        (RunDone(turns=1, stop_reason="cancelled", cancelled=True), "stop"),
        (RunDone(turns=1, stop_reason="tool_use"), "stop"),  # no client call was handed back
    ],
)
def test_finish_reasons(done: RunDone, reason: str) -> None:
    projection = ChatProjection("c", "m", 0, frozenset())
    chunk = projection.project(done)
    assert chunk is not None and chunk["choices"][0]["finish_reason"] == reason


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (RunError(error="bad", code="ValidationException"), 400),
        (RunError(error="bad", code="http_400"), 400),
        (RunError(error="slow down", code="throttlingException", recoverable=True), 503),
        (RunError(error="down", code="InternalServerException"), 502),
    ],
)
def test_a_failed_run_answers_with_a_fitting_status(error: RunError, status: int) -> None:
    assert run_error_status(error) == status
