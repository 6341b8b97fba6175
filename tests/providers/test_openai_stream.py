"""Tests for the OpenAI-compatible chat-completions stream parser.

Streams are lists of chunk dicts shaped like the JSON of an OpenAI ``data:`` line, plus the
string ``"[DONE]"``. The tests named ``test_us<story>_s<scenario>_...`` are the acceptance
scenarios of seed 003 (streaming response); ``test_fr00N_...`` its functional requirements.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from service.core.events import (
    Event,
    ReasoningDelta,
    TextDelta,
    ToolInputDelta,
    ToolUse,
    ToolUseStart,
    Usage,
)
from service.errors import ModelStreamError, ProviderError
from service.providers.base import PendingToolUse, TurnResult
from service.providers.openai_stream import DONE, OpenAIStreamParser, SSELineReader, decode_data

# -- stream builders --------------------------------------------------------------------------


def chunk(delta: dict[str, Any] | None = None, finish_reason: str | None = None) -> dict[str, Any]:
    """One chat.completion.chunk with a single choice."""
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": "test-model",
        "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish_reason}],
    }


def role() -> dict[str, Any]:
    """The first chunk of every stream."""
    return chunk({"role": "assistant", "content": ""})


def text(value: str) -> dict[str, Any]:
    """A text token."""
    return chunk({"content": value})


def tool_open(index: int, call_id: str, name: str) -> dict[str, Any]:
    """The first piece of tool call ``index``: its id and name, no arguments yet."""
    call = {"index": index, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}
    return chunk({"tool_calls": [call]})


def tool_args(index: int, piece: str) -> dict[str, Any]:
    """A piece of tool call ``index``'s arguments."""
    return chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})


def finish(reason: str) -> dict[str, Any]:
    """The chunk that carries the finish reason."""
    return chunk({}, reason)


def usage_chunk(prompt: int, completion: int, total: int | None = None) -> dict[str, Any]:
    """The usage chunk sent with stream_options.include_usage: no choices."""
    usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion}
    if total is not None:
        usage["total_tokens"] = total
    return {"id": "chatcmpl-test", "object": "chat.completion.chunk", "choices": [], "usage": usage}


def feed_all(parser: OpenAIStreamParser, stream: list[Any]) -> list[Event]:
    """Feed every item, collecting the emitted events."""
    events: list[Event] = []
    for item in stream:
        events.extend(parser.feed(item))
    return events


def text_stream(*tokens: str) -> list[Any]:
    """A complete text answer."""
    return [role(), *(text(token) for token in tokens), finish("stop"), usage_chunk(10, len(tokens)), DONE]


def calculator_stream() -> list[Any]:
    """A complete answer with one calculator call whose arguments come in three pieces."""
    return [
        role(),
        tool_open(0, "call_abc", "calculator"),
        tool_args(0, '{"expre'),
        tool_args(0, 'ssion": "sq'),
        tool_args(0, 'rt(144)"}'),
        finish("tool_calls"),
        usage_chunk(80, 9, 89),
        DONE,
    ]


# -- seed 003, user story 1: token streaming ------------------------------------------------


def test_us1_s1_tokens_arrive_incrementally() -> None:
    parser = OpenAIStreamParser()
    assert parser.feed(role()) == []
    seen: list[str] = []
    for token in ("The", " answer", " is", " 12."):
        events = parser.feed(text(token))
        assert events == [TextDelta(text=token)]
        seen.append(token)
        assert parser.text_so_far() == "".join(seen)


def test_us1_s2_token_is_yielded_immediately_not_buffered() -> None:
    parser = OpenAIStreamParser(turn=2)
    parser.feed(role())
    # The first token comes back from the very feed that carried it, long before the stream ends.
    assert parser.feed(text("Hello")) == [TextDelta(text="Hello", turn=2)]
    assert parser.stop_reason is None and not parser.done
    with pytest.raises(ProviderError):
        parser.result()  # nothing is held back waiting for the end: the end simply has not come


def test_us1_s3_completion_signal_when_the_stream_ends() -> None:
    parser = OpenAIStreamParser()
    feed_all(parser, text_stream("Done", "."))
    assert parser.done
    result = parser.result()
    assert isinstance(result, TurnResult)
    assert result.stop_reason == "end_turn" and result.text == "Done."


# -- seed 003, user story 2: content delta parsing ------------------------------------------


def test_us2_s1_text_is_extracted_from_choices_delta_content() -> None:
    parser = OpenAIStreamParser()
    events = feed_all(parser, text_stream("Hi", " there"))
    assert [e for e in events if isinstance(e, TextDelta)] == [TextDelta(text="Hi"), TextDelta(text=" there")]
    assert parser.result().text == "Hi there"


def test_us2_s2_finish_reason_stop_marks_the_stream_complete() -> None:
    parser = OpenAIStreamParser()
    feed_all(parser, [role(), text("ok"), finish("stop")])  # no [DONE] needed
    assert parser.finish_reason == "stop"
    assert parser.result().stop_reason == "end_turn"


def test_us2_s3_done_ends_the_stream_gracefully() -> None:
    parser = OpenAIStreamParser()
    feed_all(parser, [role(), text("ok"), finish("stop")])
    assert parser.feed(DONE) == []
    assert parser.done
    # Nothing after [DONE] belongs to the answer.
    assert parser.feed(text("late")) == []
    assert parser.result().text == "ok"


# -- seed 003, user story 3: tool call detection in the stream ---------------------------------


def test_us3_s1_tool_call_is_extracted_with_id_name_and_arguments() -> None:
    parser = OpenAIStreamParser()
    events = feed_all(parser, calculator_stream())
    assert events[0] == ToolUseStart(tool="calculator", tool_use_id="call_abc")
    assert events[-1] == ToolUse(tool="calculator", tool_use_id="call_abc", input={"expression": "sqrt(144)"})
    assert parser.result().tool_uses == [
        PendingToolUse("calculator", "call_abc", {"expression": "sqrt(144)"})
    ]


def test_us3_s2_arguments_spanning_chunks_are_accumulated() -> None:
    parser = OpenAIStreamParser()
    events = feed_all(parser, calculator_stream())
    pieces = [e.delta for e in events if isinstance(e, ToolInputDelta)]
    assert pieces == ['{"expre', 'ssion": "sq', 'rt(144)"}']
    assert json.loads("".join(pieces)) == {"expression": "sqrt(144)"}


def test_us3_s3_multiple_tool_calls_are_captured_by_index() -> None:
    parser = OpenAIStreamParser()
    feed_all(
        parser,
        [
            role(),
            tool_open(0, "call_0", "calculator"),
            tool_args(0, '{"expression": "1+1"}'),
            tool_open(1, "call_1", "calculator"),
            tool_args(1, '{"expression": "2+2"}'),
            finish("tool_calls"),
            DONE,
        ],
    )
    uses = parser.result().tool_uses
    assert [(u.tool_use_id, u.input) for u in uses] == [
        ("call_0", {"expression": "1+1"}),
        ("call_1", {"expression": "2+2"}),
    ]


# -- seed 003, functional requirements --------------------------------------------------------


def test_fr003_sse_data_lines_with_json_payloads_are_parsed() -> None:
    raw = b"".join(
        b"data: " + json.dumps(item).encode() + b"\n\n" if isinstance(item, dict) else b"data: [DONE]\n\n"
        for item in text_stream("a", "b")
    )
    reader = SSELineReader()
    parser = OpenAIStreamParser()
    events: list[Event] = []
    for payload in reader.feed(raw):
        decoded = decode_data(payload)
        assert decoded is not None
        events.extend(parser.feed(decoded))
    assert events == [TextDelta(text="a"), TextDelta(text="b")]
    assert parser.done and parser.result().usage == Usage(input_tokens=10, output_tokens=2, total_tokens=12)


def test_fr004_text_comes_from_choices_0_delta_content() -> None:
    parser = OpenAIStreamParser()
    other_choice = {
        "choices": [
            {"index": 1, "delta": {"content": "not ours"}},
            {"index": 0, "delta": {"content": "ours"}},
        ]
    }
    assert parser.feed(other_choice) == [TextDelta(text="ours")]
    # An empty content (the role chunk's "") is no token.
    assert parser.feed(chunk({"content": ""})) == []
    assert parser.feed(chunk({"content": None})) == []


def test_fr005_tool_calls_come_from_choices_0_delta_tool_calls() -> None:
    parser = OpenAIStreamParser()
    events = parser.feed(tool_open(0, "call_x", "lookup"))
    assert events == [ToolUseStart(tool="lookup", tool_use_id="call_x")]


def test_fr006_partial_arguments_are_accumulated_until_complete() -> None:
    parser = OpenAIStreamParser()
    stream = calculator_stream()
    before_finish = feed_all(parser, stream[:5])
    assert not any(isinstance(e, ToolUse) for e in before_finish)  # not complete yet
    after = feed_all(parser, stream[5:])
    assert after == [ToolUse(tool="calculator", tool_use_id="call_abc", input={"expression": "sqrt(144)"})]


@pytest.mark.parametrize("ending", ["finish_reason", "done"])
def test_fr007_completion_is_detected_via_finish_reason_or_done(ending: str) -> None:
    parser = OpenAIStreamParser()
    feed_all(parser, [role(), text("x")])
    parser.feed(finish("stop") if ending == "finish_reason" else DONE)
    assert parser.result().stop_reason == "end_turn"


# -- more behaviour ---------------------------------------------------------------------------


def test_several_tool_calls_interleaved_by_index() -> None:
    parser = OpenAIStreamParser()
    events = feed_all(
        parser,
        [
            role(),
            text("Let me compute."),
            tool_open(0, "call_a", "calculator"),
            tool_open(1, "call_b", "lookup"),
            tool_args(1, '{"q": '),
            tool_args(0, '{"expression": '),
            tool_args(0, '"3*3"}'),
            tool_args(1, '"x"}'),
            finish("tool_calls"),
        ],
    )
    deltas = {(e.tool_use_id, e.delta) for e in events if isinstance(e, ToolInputDelta)}
    assert ("call_b", '{"q": ') in deltas and ("call_a", '"3*3"}') in deltas
    uses = [e for e in events if isinstance(e, ToolUse)]
    assert [(u.tool, u.input) for u in uses] == [
        ("calculator", {"expression": "3*3"}),
        ("lookup", {"q": "x"}),
    ]
    result = parser.result()
    assert result.stop_reason == "tool_use"
    assert result.message == {
        "role": "assistant",
        "content": [
            {"text": "Let me compute."},
            {"toolUse": {"toolUseId": "call_a", "name": "calculator", "input": {"expression": "3*3"}}},
            {"toolUse": {"toolUseId": "call_b", "name": "lookup", "input": {"q": "x"}}},
        ],
    }


def test_several_tool_calls_in_one_delta() -> None:
    parser = OpenAIStreamParser()
    both = chunk(
        {
            "tool_calls": [
                {"index": 0, "id": "c0", "type": "function", "function": {"name": "a", "arguments": "{}"}},
                {"index": 1, "id": "c1", "type": "function", "function": {"name": "b", "arguments": "{}"}},
            ]
        }
    )
    events = parser.feed(both)
    assert [type(e) for e in events] == [ToolUseStart, ToolInputDelta, ToolUseStart, ToolInputDelta]
    parser.feed(finish("tool_calls"))
    assert [u.tool for u in parser.result().tool_uses] == ["a", "b"]


def test_the_message_is_in_bedrock_format() -> None:
    parser = OpenAIStreamParser()
    feed_all(parser, calculator_stream())
    message = parser.result().message
    assert message == {
        "role": "assistant",
        "content": [
            {"toolUse": {"toolUseId": "call_abc", "name": "calculator", "input": {"expression": "sqrt(144)"}}}
        ],
    }


def test_usage_chunk_with_empty_choices() -> None:
    parser = OpenAIStreamParser()
    assert parser.feed(usage_chunk(120, 7, 127)) == []
    assert parser.usage == Usage(input_tokens=120, output_tokens=7, total_tokens=127)
    parser.feed(usage_chunk(5, 6))  # no total: it is the sum
    assert parser.usage == Usage(input_tokens=5, output_tokens=6, total_tokens=11)
    # A usage of null on ordinary chunks (what OpenAI sends with include_usage) changes nothing.
    parser.feed({**text("x"), "usage": None})
    assert parser.usage.total_tokens == 11


def test_reasoning_content_becomes_reasoning_delta() -> None:
    parser = OpenAIStreamParser()
    events = feed_all(
        parser,
        [
            role(),
            chunk({"reasoning_content": "Let me think."}),
            chunk({"reasoning": " More."}),
            text("42"),
            finish("stop"),
        ],
    )
    assert events == [
        ReasoningDelta(text="Let me think."),
        ReasoningDelta(text=" More."),
        TextDelta(text="42"),
    ]
    result = parser.result()
    assert result.text == "42"
    assert result.message["content"][0] == {
        "reasoningContent": {"reasoningText": {"text": "Let me think. More."}}
    }


def test_invalid_arguments_json_gives_empty_input_and_an_input_error() -> None:
    parser = OpenAIStreamParser()
    events = feed_all(
        parser,
        [
            role(),
            tool_open(0, "call_bad", "calculator"),
            tool_args(0, '{"expression": '),
            finish("tool_calls"),
        ],
    )
    assert events[-1] == ToolUse(tool="calculator", tool_use_id="call_bad", input={})
    use = parser.result().tool_uses[0]
    assert use.input == {} and use.input_error is not None and "not valid JSON" in use.input_error


@pytest.mark.parametrize("depth", [150, 5000])
def test_arguments_nested_too_deep_give_empty_input_and_an_input_error(depth: int) -> None:
    parser = OpenAIStreamParser()
    arguments = '{"a":' * depth + "1" + "}" * depth
    events = feed_all(
        parser, [tool_open(0, "c", "calculator"), tool_args(0, arguments), finish("tool_calls")]
    )
    assert events[-1] == ToolUse(tool="calculator", tool_use_id="c", input={})
    use = parser.result().tool_uses[0]
    assert use.input == {} and "not valid JSON" in (use.input_error or "")
    assert "nested" in (use.input_error or "")


def test_arguments_that_are_not_an_object_are_an_input_error() -> None:
    parser = OpenAIStreamParser()
    feed_all(parser, [tool_open(0, "c", "calculator"), tool_args(0, "[1, 2]"), finish("tool_calls")])
    use = parser.result().tool_uses[0]
    assert use.input == {} and "not a JSON object" in (use.input_error or "")


def test_empty_arguments_are_an_empty_input() -> None:
    parser = OpenAIStreamParser()
    feed_all(parser, [tool_open(0, "c", "now"), finish("tool_calls")])
    assert parser.result().tool_uses == [PendingToolUse("now", "c", {}, None)]


@pytest.mark.parametrize(
    ("finish_reason", "stop_reason"),
    [
        ("stop", "end_turn"),
        ("tool_calls", "tool_use"),
        ("function_call", "tool_use"),
        ("length", "max_tokens"),
        ("content_filter", "content_filtered"),
        ("guardrail_intervened", "guardrail_intervened"),
        ("something_new", "something_new"),
    ],
)
def test_finish_reason_mapping(finish_reason: str, stop_reason: str) -> None:
    parser = OpenAIStreamParser()
    feed_all(parser, [role(), text("x"), finish(finish_reason), DONE])
    assert parser.result().stop_reason == stop_reason


def test_done_without_finish_reason_infers_the_stop_reason() -> None:
    plain = OpenAIStreamParser()
    feed_all(plain, [role(), text("x"), DONE])
    assert plain.result().stop_reason == "end_turn"
    tools = OpenAIStreamParser()
    events = feed_all(tools, [role(), tool_open(0, "c", "calculator"), tool_args(0, "{}"), DONE])
    assert isinstance(events[-1], ToolUse)  # [DONE] completes the open tool calls
    assert tools.result().stop_reason == "tool_use"


def test_finish_reason_then_done_closes_tool_calls_once() -> None:
    parser = OpenAIStreamParser()
    events = feed_all(parser, calculator_stream())
    assert sum(isinstance(e, ToolUse) for e in events) == 1


def test_incomplete_stream_raises() -> None:
    parser = OpenAIStreamParser()
    feed_all(parser, [role(), text("half an ans")])
    with pytest.raises(ProviderError) as caught:
        parser.result()
    assert caught.value.code == "incomplete_stream" and not caught.value.retryable
    assert parser.text_so_far() == "half an ans"


def test_an_empty_stream_is_incomplete() -> None:
    with pytest.raises(ProviderError, match="finish_reason or \\[DONE\\]"):
        OpenAIStreamParser().result()


def test_gateway_error_chunk_raises_with_the_code_from_boto3_text() -> None:
    parser = OpenAIStreamParser()
    parser.feed(text("Here"))
    message = (
        "An error occurred (throttlingException) when calling the ConverseStream operation: Too many requests"
    )
    with pytest.raises(ModelStreamError) as caught:
        parser.feed({"error": {"message": message}})
    assert caught.value.code == "throttlingException" and caught.value.retryable
    assert "Too many requests" in str(caught.value)


@pytest.mark.parametrize(
    ("error", "code", "retryable"),
    [
        (
            {"message": "slow down", "type": "rate_limit_error", "code": "rate_limit_exceeded"},
            "rate_limit_exceeded",
            True,
        ),
        ({"message": "boom", "type": "server_error"}, "server_error", True),
        ({"message": "bad input", "type": "invalid_request_error"}, "invalid_request_error", False),
        ({"message": "upstream", "code": 503}, "http_503", True),
        ({"message": "no code at all"}, "stream_error", False),
        ("a bare string", "stream_error", False),
    ],
)
def test_error_chunks_of_other_servers(error: Any, code: str, retryable: bool) -> None:
    with pytest.raises(ModelStreamError) as caught:
        OpenAIStreamParser().feed({"error": error})
    assert caught.value.code == code and caught.value.retryable is retryable


def test_a_chunk_that_is_not_an_object_is_malformed() -> None:
    parser = OpenAIStreamParser()
    for bad in ("not json", ["a", "list"]):
        with pytest.raises(ProviderError) as caught:
            parser.feed(bad)  # type: ignore[arg-type]
        assert caught.value.code == "malformed_chunk"


def test_tool_calls_without_index_are_told_apart_by_id() -> None:
    parser = OpenAIStreamParser()
    events = feed_all(
        parser,
        [
            chunk({"tool_calls": [{"id": "g1", "function": {"name": "a", "arguments": '{"n": 1}'}}]}),
            chunk({"tool_calls": [{"id": "g2", "function": {"name": "b", "arguments": "{"}}]}),
            chunk({"tool_calls": [{"function": {"arguments": '"n": 2}'}}]}),
            finish("tool_calls"),
        ],
    )
    assert [e.tool_use_id for e in events if isinstance(e, ToolUseStart)] == ["g1", "g2"]
    assert [(u.tool_use_id, u.input) for u in parser.result().tool_uses] == [
        ("g1", {"n": 1}),
        ("g2", {"n": 2}),
    ]


def test_a_name_that_comes_late_holds_the_start_and_the_arguments_back() -> None:
    parser = OpenAIStreamParser(turn=3)
    assert parser.feed(chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"a"'}}]})) == []
    events = parser.feed(
        chunk({"tool_calls": [{"index": 0, "function": {"name": "f", "arguments": ": 1}"}}]})
    )
    # Without an id from the server the call gets one that is unique within the conversation.
    assert events == [
        ToolUseStart(tool="f", tool_use_id="call_t3_0", turn=3),
        ToolInputDelta(tool_use_id="call_t3_0", delta='{"a"', turn=3),
        ToolInputDelta(tool_use_id="call_t3_0", delta=": 1}", turn=3),
    ]
    parser.feed(finish("tool_calls"))
    assert parser.result().tool_uses[0].input == {"a": 1}


def test_the_deprecated_function_call_form() -> None:
    parser = OpenAIStreamParser()
    feed_all(
        parser,
        [
            chunk({"function_call": {"name": "calculator", "arguments": '{"expression": '}}),
            chunk({"function_call": {"arguments": '"1+1"}'}}),
            finish("function_call"),
        ],
    )
    result = parser.result()
    assert result.stop_reason == "tool_use" and result.tool_uses[0].input == {"expression": "1+1"}


def test_blank_text_is_left_out_of_the_message() -> None:
    parser = OpenAIStreamParser()
    feed_all(parser, [role(), text("\n"), tool_open(0, "c", "f"), finish("tool_calls")])
    assert [list(block) for block in parser.result().message["content"]] == [["toolUse"]]
    assert parser.result().text == "\n"  # the client saw it, so the text still says it
