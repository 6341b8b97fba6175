"""Tests for the Bedrock ConverseStream parser and the mapping of the client's errors.

Streams are plain lists of dicts shaped like what botocore's parser makes of ConverseStream
events; botocore and aiohttp exceptions are built directly from their constructors.
"""

from __future__ import annotations

import gc
import json
import weakref
from typing import Any

import aiohttp
import pytest
import urllib3.exceptions
from botocore.exceptions import (
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    EventStreamError,
    NoCredentialsError,
    NoRegionError,
    ReadTimeoutError,
)

from service.core.events import (
    ReasoningDelta,
    TextDelta,
    ToolInputDelta,
    ToolUse,
    ToolUseStart,
    Usage,
)
from service.errors import ModelStreamError, ProviderError
from service.providers.base import PendingToolUse, TurnResult
from service.providers.bedrock_stream import BedrockStreamParser, stream_error_from_exception

# -- stream builders --------------------------------------------------------------------------


def message_start() -> dict[str, Any]:
    """The first event of every stream."""
    return {"messageStart": {"role": "assistant"}}


def text_delta(index: int, text: str) -> dict[str, Any]:
    """A text delta for block ``index``."""
    return {"contentBlockDelta": {"delta": {"text": text}, "contentBlockIndex": index}}


def tool_start(index: int, name: str, tool_use_id: str) -> dict[str, Any]:
    """The start of a tool-use block."""
    return {
        "contentBlockStart": {
            "start": {"toolUse": {"toolUseId": tool_use_id, "name": name}},
            "contentBlockIndex": index,
        }
    }


def tool_delta(index: int, fragment: str) -> dict[str, Any]:
    """A fragment of a tool use's JSON input."""
    delta = {"toolUse": {"input": fragment}}
    return {"contentBlockDelta": {"delta": delta, "contentBlockIndex": index}}


def reasoning_delta(index: int, **value: Any) -> dict[str, Any]:
    """A reasoningContent delta (text, signature or redactedContent)."""
    return {"contentBlockDelta": {"delta": {"reasoningContent": value}, "contentBlockIndex": index}}


def block_stop(index: int) -> dict[str, Any]:
    """The end of block ``index``."""
    return {"contentBlockStop": {"contentBlockIndex": index}}


def message_stop(reason: str = "end_turn") -> dict[str, Any]:
    """The end of the message."""
    return {"messageStop": {"stopReason": reason}}


def metadata(input_tokens: int = 10, output_tokens: int = 5, latency: int = 321) -> dict[str, Any]:
    """Usage and metrics, the last event of a stream."""
    return {
        "metadata": {
            "usage": {
                "inputTokens": input_tokens,
                "outputTokens": output_tokens,
                "totalTokens": input_tokens + output_tokens,
            },
            "metrics": {"latencyMs": latency},
        }
    }


def run(events: list[dict[str, Any]], turn: int = 1) -> tuple[list[Any], TurnResult]:
    """Feed a whole stream; return every emitted event and the turn's result."""
    parser = BedrockStreamParser(turn=turn)
    emitted: list[Any] = []
    for event in events:
        emitted.extend(parser.feed(event))
    return emitted, parser.result()


# -- text -------------------------------------------------------------------------------------


def test_text_without_block_start() -> None:
    emitted, result = run(
        [
            message_start(),
            text_delta(0, "Hello"),
            text_delta(0, ""),
            text_delta(0, ", world"),
            block_stop(0),
            message_stop("end_turn"),
            metadata(),
        ],
        turn=3,
    )
    assert emitted == [TextDelta(text="Hello", turn=3), TextDelta(text=", world", turn=3)]
    assert result.message == {"role": "assistant", "content": [{"text": "Hello, world"}]}
    assert result.text == "Hello, world"
    assert result.stop_reason == "end_turn"
    assert result.tool_uses == []


def test_text_with_block_start_older_style() -> None:
    emitted, result = run(
        [
            message_start(),
            {"contentBlockStart": {"start": {"text": ""}, "contentBlockIndex": 0}},
            text_delta(0, "Hi"),
            block_stop(0),
            message_stop(),
        ]
    )
    assert emitted == [TextDelta(text="Hi")]
    assert result.message["content"] == [{"text": "Hi"}]


def test_text_with_empty_block_start() -> None:
    emitted, result = run(
        [
            message_start(),
            {"contentBlockStart": {"start": {}, "contentBlockIndex": 0}},
            text_delta(0, "Hi"),
            block_stop(0),
            message_stop(),
        ]
    )
    assert emitted == [TextDelta(text="Hi")]
    assert result.message["content"] == [{"text": "Hi"}]


def test_blank_text_block_is_dropped_from_message() -> None:
    _, result = run(
        [
            message_start(),
            text_delta(0, "\n\n"),
            block_stop(0),
            tool_start(1, "calc", "t1"),
            block_stop(1),
            message_stop("tool_use"),
        ]
    )
    assert result.message["content"] == [{"toolUse": {"toolUseId": "t1", "name": "calc", "input": {}}}]


# -- tool use ---------------------------------------------------------------------------------


def test_tool_use_gathered_over_several_deltas() -> None:
    emitted, result = run(
        [
            message_start(),
            tool_start(0, "calculator", "tooluse_1"),
            tool_delta(0, '{"expr'),
            tool_delta(0, 'ession": "sqrt'),
            tool_delta(0, '(144)"}'),
            block_stop(0),
            message_stop("tool_use"),
            metadata(),
        ],
        turn=2,
    )
    assert emitted == [
        ToolUseStart(tool="calculator", tool_use_id="tooluse_1", turn=2),
        ToolInputDelta(tool_use_id="tooluse_1", delta='{"expr', turn=2),
        ToolInputDelta(tool_use_id="tooluse_1", delta='ession": "sqrt', turn=2),
        ToolInputDelta(tool_use_id="tooluse_1", delta='(144)"}', turn=2),
        ToolUse(tool="calculator", tool_use_id="tooluse_1", input={"expression": "sqrt(144)"}, turn=2),
    ]
    assert result.tool_uses == [PendingToolUse("calculator", "tooluse_1", {"expression": "sqrt(144)"}, None)]
    assert result.message["content"] == [
        {
            "toolUse": {
                "toolUseId": "tooluse_1",
                "name": "calculator",
                "input": {"expression": "sqrt(144)"},
            }
        }
    ]
    assert result.stop_reason == "tool_use"


def test_text_then_two_tool_uses_in_one_message() -> None:
    emitted, result = run(
        [
            message_start(),
            text_delta(0, "Let me check "),
            text_delta(0, "both."),
            block_stop(0),
            tool_start(1, "weather", "t1"),
            tool_delta(1, '{"city": "Paris"}'),
            block_stop(1),
            tool_start(2, "time", "t2"),
            tool_delta(2, '{"tz": "CET"}'),
            block_stop(2),
            message_stop("tool_use"),
            metadata(),
        ]
    )
    assert [type(e).__name__ for e in emitted] == [
        "TextDelta",
        "TextDelta",
        "ToolUseStart",
        "ToolInputDelta",
        "ToolUse",
        "ToolUseStart",
        "ToolInputDelta",
        "ToolUse",
    ]
    assert result.message["content"] == [
        {"text": "Let me check both."},
        {"toolUse": {"toolUseId": "t1", "name": "weather", "input": {"city": "Paris"}}},
        {"toolUse": {"toolUseId": "t2", "name": "time", "input": {"tz": "CET"}}},
    ]
    assert [(t.tool, t.tool_use_id, t.input) for t in result.tool_uses] == [
        ("weather", "t1", {"city": "Paris"}),
        ("time", "t2", {"tz": "CET"}),
    ]
    assert result.text == "Let me check both."


def test_invalid_tool_json_records_input_error() -> None:
    emitted, result = run(
        [
            message_start(),
            tool_start(0, "calc", "t1"),
            tool_delta(0, '{"expression": "1+'),
            block_stop(0),
            message_stop("tool_use"),
        ]
    )
    assert emitted[-1] == ToolUse(tool="calc", tool_use_id="t1", input={})
    (pending,) = result.tool_uses
    assert pending.input == {}
    assert pending.input_error is not None
    assert pending.input_error.startswith("tool input is not valid JSON: ")
    assert result.message["content"][0]["toolUse"]["input"] == {}


def nested(depth: int) -> str:
    """A JSON object holding objects ``depth`` levels deep."""
    return '{"a":' * depth + "1" + "}" * depth


# 150 parses with json.loads but could not be stored or sent on as an event; 5000 overflows the parser.
@pytest.mark.parametrize("depth", [150, 5000])
def test_tool_json_nested_too_deep_records_input_error(depth: int) -> None:
    emitted, result = run(
        [message_start(), tool_start(0, "calc", "t1"), tool_delta(0, nested(depth)), block_stop(0)]
        + [message_stop("tool_use")]
    )
    assert emitted[-1] == ToolUse(tool="calc", tool_use_id="t1", input={})
    (pending,) = result.tool_uses
    assert pending.input == {}
    assert pending.input_error is not None
    assert pending.input_error.startswith("tool input is not valid JSON: ")
    assert "nested" in pending.input_error


def test_tool_json_nested_up_to_the_limit_is_kept() -> None:
    _, result = run(
        [message_start(), tool_start(0, "calc", "t1"), tool_delta(0, nested(100)), block_stop(0)]
        + [message_stop("tool_use")]
    )
    (pending,) = result.tool_uses
    assert pending.input_error is None and pending.input == json.loads(nested(100))


def test_tool_json_that_is_not_an_object_records_input_error() -> None:
    _, result = run(
        [message_start(), tool_start(0, "calc", "t1"), tool_delta(0, "[1, 2]"), block_stop(0)]
        + [message_stop("tool_use")]
    )
    (pending,) = result.tool_uses
    assert pending.input == {}
    assert pending.input_error == "tool input is not a JSON object: got list"


def test_empty_tool_input_is_an_empty_object() -> None:
    emitted, result = run(
        [
            message_start(),
            tool_start(0, "now", "t1"),
            block_stop(0),
            message_stop("tool_use"),
        ]
    )
    assert emitted == [
        ToolUseStart(tool="now", tool_use_id="t1"),
        ToolUse(tool="now", tool_use_id="t1", input={}),
    ]
    assert result.tool_uses == [PendingToolUse("now", "t1", {}, None)]


def test_block_still_open_at_message_stop_is_closed() -> None:
    emitted, result = run(
        [
            message_start(),
            text_delta(0, "Sure."),
            tool_start(1, "calc", "t1"),
            tool_delta(1, '{"x": 1}'),
            message_stop("tool_use"),
        ]
    )
    assert emitted[-1] == ToolUse(tool="calc", tool_use_id="t1", input={"x": 1})
    assert result.tool_uses == [PendingToolUse("calc", "t1", {"x": 1}, None)]
    assert len(result.message["content"]) == 2


def test_tool_delta_without_its_start_is_ignored() -> None:
    emitted, result = run([message_start(), tool_delta(0, '{"x": 1}'), message_stop()])
    assert emitted == []
    assert result.tool_uses == []
    assert result.message["content"] == []


# -- reasoning --------------------------------------------------------------------------------


def test_reasoning_text_and_signature_kept_in_message() -> None:
    emitted, result = run(
        [
            message_start(),
            reasoning_delta(0, text="Think "),
            reasoning_delta(0, text="hard."),
            reasoning_delta(0, signature="sig-abc"),
            block_stop(0),
            text_delta(1, "42"),
            block_stop(1),
            message_stop(),
        ]
    )
    assert emitted == [
        ReasoningDelta(text="Think "),
        ReasoningDelta(text="hard."),
        TextDelta(text="42"),
    ]
    assert result.message["content"] == [
        {"reasoningContent": {"reasoningText": {"text": "Think hard.", "signature": "sig-abc"}}},
        {"text": "42"},
    ]
    assert result.text == "42"


def test_reasoning_without_signature_has_no_signature_key() -> None:
    _, result = run([message_start(), reasoning_delta(0, text="hm"), block_stop(0), message_stop()])
    assert result.message["content"] == [{"reasoningContent": {"reasoningText": {"text": "hm"}}}]


def test_redacted_reasoning_is_kept_and_not_emitted() -> None:
    emitted, result = run(
        [
            message_start(),
            reasoning_delta(0, redactedContent=b"\x00opaque"),
            block_stop(0),
            text_delta(1, "ok"),
            message_stop(),
        ]
    )
    assert emitted == [TextDelta(text="ok")]
    assert result.message["content"] == [
        {"reasoningContent": {"redactedContent": b"\x00opaque"}},
        {"text": "ok"},
    ]


def test_odd_reasoning_deltas_never_raise() -> None:
    parser = BedrockStreamParser()
    for value in (None, "text", 3, {}, {"text": None}, {"signature": 7}, {"redactedContent": 1}):
        delta = {"reasoningContent": value}
        event = {"contentBlockDelta": {"delta": delta, "contentBlockIndex": 0}}
        assert parser.feed(event) == []


# -- unknown input ----------------------------------------------------------------------------


def test_unknown_event_keys_and_delta_kinds_are_ignored() -> None:
    emitted, result = run(
        [
            message_start(),
            {"somethingNew": {"x": 1}},
            {"contentBlockStart": {"start": {"image": {"format": "png"}}, "contentBlockIndex": 0}},
            {"contentBlockDelta": {"delta": {"citation": {"title": "t"}}, "contentBlockIndex": 0}},
            block_stop(0),
            text_delta(1, "done"),
            message_stop(),
        ]
    )
    assert emitted == [TextDelta(text="done")]
    assert result.message["content"] == [{"text": "done"}]


# -- stop reasons, usage ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "reason",
    [
        "end_turn",
        "tool_use",
        "max_tokens",
        "stop_sequence",
        "guardrail_intervened",
        "content_filtered",
        "some_future_reason",
    ],
)
def test_every_stop_reason_is_stored_as_is(reason: str) -> None:
    _, result = run([message_start(), text_delta(0, "x"), message_stop(reason)])
    assert result.stop_reason == reason


def test_metadata_usage_and_latency() -> None:
    _, result = run([message_start(), message_stop(), metadata(12, 34, latency=567)])
    assert result.usage == Usage(input_tokens=12, output_tokens=34, total_tokens=46)
    assert result.latency_ms == 567


def test_missing_total_tokens_is_computed() -> None:
    _, result = run(
        [
            message_start(),
            message_stop(),
            {"metadata": {"usage": {"inputTokens": 7, "outputTokens": 8}, "metrics": {}}},
        ]
    )
    assert result.usage == Usage(input_tokens=7, output_tokens=8, total_tokens=15)
    assert result.latency_ms is None


def test_no_metadata_means_zero_usage() -> None:
    _, result = run([message_start(), message_stop()])
    assert result.usage == Usage()
    assert result.latency_ms is None


def test_a_parser_is_freed_when_dropped_without_the_garbage_collector() -> None:
    # One parser per model turn: in a reference cycle, each would keep the answer's blocks until a
    # collection, and every collection would have it to walk.
    gc.disable()
    try:
        parser = BedrockStreamParser()
        for event in [
            message_start(),
            text_delta(0, "Let me check."),
            block_stop(0),
            tool_start(1, "weather", "t1"),
            tool_delta(1, '{"city": "Paris"}'),
            block_stop(1),
            reasoning_delta(2, text="hmm", signature="s"),
            block_stop(2),
            message_stop("tool_use"),
            metadata(),
        ]:
            parser.feed(event)
        parser.text(3, "more")
        assert parser.result().tool_uses
        dropped = weakref.ref(parser)
        del parser
        assert dropped() is None
    finally:
        gc.enable()


# -- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "retryable"),
    [
        ("throttlingException", True),
        ("serviceUnavailableException", True),
        ("internalServerException", True),
        ("modelStreamErrorException", True),
        ("validationException", False),
        ("brandNewException", False),
    ],
)
def test_exception_events_raise_model_stream_error(key: str, retryable: bool) -> None:
    parser = BedrockStreamParser()
    parser.feed(message_start())
    parser.feed(text_delta(0, "partial"))
    with pytest.raises(ModelStreamError) as info:
        parser.feed({key: {"message": "boom happened"}})
    assert info.value.code == key
    assert info.value.retryable is retryable
    assert "boom happened" in info.value.message


def test_throttling_event_message_is_clear() -> None:
    with pytest.raises(ModelStreamError) as info:
        BedrockStreamParser().feed({"throttlingException": {"message": "Too many requests"}})
    assert str(info.value) == ("Bedrock throttled the request (throttlingException): Too many requests")


def test_result_without_message_stop_raises() -> None:
    parser = BedrockStreamParser()
    parser.feed(message_start())
    parser.feed(text_delta(0, "cut off"))
    with pytest.raises(ProviderError) as info:
        parser.result()
    assert not isinstance(info.value, ModelStreamError)
    assert info.value.code == "incomplete_stream"
    assert info.value.retryable is False
    assert info.value.message == "model stream ended without messageStop"


# -- stream_error_from_exception ---------------------------------------------------------------


def client_error_response(code: str, message: str, status: int) -> dict[str, Any]:
    """The response dict botocore attaches to a ClientError."""
    return {
        "Error": {"Code": code, "Message": message},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }


@pytest.mark.parametrize(
    ("code", "retryable"),
    [
        ("throttlingException", True),
        ("serviceUnavailableException", True),
        ("internalServerException", True),
        ("modelStreamErrorException", True),
        ("validationException", False),
    ],
)
def test_event_stream_error_becomes_model_stream_error(code: str, retryable: bool) -> None:
    exc = EventStreamError(client_error_response(code, "Too many requests", 200), "ConverseStream")
    error = stream_error_from_exception(exc)
    assert isinstance(error, ModelStreamError)
    assert error.code == code
    assert error.retryable is retryable
    assert "Too many requests" in error.message


def test_event_stream_throttling_message() -> None:
    exc = EventStreamError(
        client_error_response("throttlingException", "Too many requests", 200), "ConverseStream"
    )
    assert stream_error_from_exception(exc).message == (
        "Bedrock throttled the request (throttlingException): Too many requests"
    )


@pytest.mark.parametrize(
    ("code", "status", "retryable"),
    [
        ("ThrottlingException", 429, True),
        ("ServiceUnavailableException", 503, True),
        ("InternalServerException", 500, True),
        ("ModelNotReadyException", 429, True),
        ("ValidationException", 400, False),
        ("AccessDeniedException", 403, False),
        ("ResourceNotFoundException", 404, False),
        ("SomethingOddException", 502, True),
    ],
)
def test_client_error_becomes_provider_error(code: str, status: int, retryable: bool) -> None:
    exc = ClientError(client_error_response(code, "details here", status), "ConverseStream")
    error = stream_error_from_exception(exc)
    assert type(error) is ProviderError
    assert error.code == code
    assert error.retryable is retryable
    assert error.message.endswith(f"({code}): details here")


def test_client_error_without_error_body() -> None:
    error = stream_error_from_exception(ClientError({}, "ConverseStream"))
    assert type(error) is ProviderError
    assert error.code == "Unknown"
    assert error.retryable is False


@pytest.mark.parametrize(
    ("exc", "code", "retryable"),
    [
        (EndpointConnectionError(endpoint_url="https://bedrock.example"), "connection_error", True),
        (ConnectTimeoutError(endpoint_url="https://bedrock.example"), "connect_timeout", True),
        (ReadTimeoutError(endpoint_url="https://bedrock.example"), "read_timeout", True),
        (urllib3.exceptions.ProtocolError("Connection broken"), "connection_error", True),
        (NoCredentialsError(), "no_credentials", False),
        (NoRegionError(), "no_region", False),
        (RuntimeError("weird"), "provider_error", False),
        # What aiohttp raises while aiobotocore reads the stream, unwrapped.
        (aiohttp.SocketTimeoutError("Timeout on reading data from socket"), "read_timeout", True),
        (aiohttp.ConnectionTimeoutError("Connection timeout"), "connect_timeout", True),
        (aiohttp.ServerDisconnectedError(), "connection_error", True),
        (aiohttp.ClientPayloadError("Response payload is not completed"), "connection_error", True),
    ],
)
def test_botocore_errors_become_provider_errors(exc: BaseException, code: str, retryable: bool) -> None:
    error = stream_error_from_exception(exc)
    assert type(error) is ProviderError
    assert error.code == code
    assert error.retryable is retryable
    assert error.message


def test_endpoint_connection_error_message_names_the_url() -> None:
    exc = EndpointConnectionError(endpoint_url="https://bedrock.example")
    error = stream_error_from_exception(exc)
    assert "https://bedrock.example" in error.message
    assert error.message.startswith("The connection to Bedrock failed")


def test_provider_errors_pass_through_unchanged() -> None:
    original = ModelStreamError("x", code="throttlingException", retryable=True)
    assert stream_error_from_exception(original) is original
