"""The emulator over real HTTP, read by boto3's own bedrock-runtime client and parser."""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

import aiohttp
import boto3
import pytest
from aiohttp.test_utils import TestClient
from botocore.config import Config
from botocore.eventstream import EventStreamBuffer
from botocore.exceptions import ClientError, EventStreamError

from service.emulator import (
    EmbeddedEmulator,
    EmulatorConfig,
    RequestRecord,
    create_emulator_app,
)

MODEL_ID = "anthropic.claude-3-5-sonnet-20240620-v1:0"
CALCULATOR_TOOLS = {
    "tools": [
        {
            "toolSpec": {
                "name": "calculator",
                "description": "Evaluates an arithmetic expression.",
                "inputSchema": {
                    "json": {
                        "type": "object",
                        "properties": {"expression": {"type": "string"}},
                        "required": ["expression"],
                    }
                },
            }
        }
    ]
}
_tags = itertools.count()


@pytest.fixture(scope="module")
def bedrock(emulator: EmbeddedEmulator) -> Any:
    """A boto3 bedrock-runtime client pointed at the emulator."""
    # One attempt in all: error tests must not wait through boto3's backoff. (botocore's
    # "max_attempts" counts retries, so max_attempts=1 would still mean two requests.)
    return _client(emulator, total_max_attempts=1)


def _client(emulator: EmbeddedEmulator, **retries: Any) -> Any:
    """A boto3 bedrock-runtime client for ``emulator`` with the given retry settings."""
    return boto3.client(
        "bedrock-runtime",
        region_name="us-east-1",
        endpoint_url=emulator.url,
        aws_access_key_id="x",
        aws_secret_access_key="x",
        config=Config(retries=retries or None),
    )


def _tagged(text: str) -> str:
    """Make a prompt unique, so that its record can be found among the module's requests."""
    return f"{text} (case {next(_tags)})"


def _user(text: str) -> dict[str, Any]:
    """A user message holding one text block."""
    return {"role": "user", "content": [{"text": text}]}


def _converse(bedrock: Any, messages: list[dict[str, Any]], **kwargs: Any) -> dict[str, Any]:
    """Call ConverseStream with the calculator offered."""
    return bedrock.converse_stream(modelId=MODEL_ID, messages=messages, toolConfig=CALCULATOR_TOOLS, **kwargs)


def _events(response: dict[str, Any]) -> list[dict[str, Any]]:
    """All events of a response's stream."""
    return list(response["stream"])


def _kinds(events: list[dict[str, Any]]) -> list[str]:
    """The type of each event."""
    return [next(iter(event)) for event in events]


def _text(events: list[dict[str, Any]]) -> str:
    """The concatenated answer text."""
    return "".join(
        e["contentBlockDelta"]["delta"].get("text", "") for e in events if "contentBlockDelta" in e
    )


def _record_for(emulator: EmbeddedEmulator, prompt: str, **match: Any) -> RequestRecord:
    """Wait for the record of ``prompt`` whose fields match."""

    def predicate(record: RequestRecord) -> bool:
        return record.user_text == prompt and all(
            getattr(record, key) == value for key, value in match.items()
        )

    return emulator.wait_for(predicate, 5.0)


def test_text_answer(bedrock: Any, emulator: EmbeddedEmulator) -> None:
    """A text answer streams deltas without a block start, then stop and usage."""
    prompt = _tagged("[emu:tokens=6] Tell me about rivers")
    response = _converse(bedrock, [_user(prompt)])
    assert response["ResponseMetadata"]["HTTPHeaders"]["x-amzn-requestid"]
    events = _events(response)
    kinds = _kinds(events)
    assert kinds == ["messageStart"] + ["contentBlockDelta"] * 6 + [
        "contentBlockStop",
        "messageStop",
        "metadata",
    ]
    assert "contentBlockStart" not in kinds
    assert events[0]["messageStart"] == {"role": "assistant"}
    assert _text(events) == "Here is an answer to: Tell"
    assert events[-2]["messageStop"]["stopReason"] == "end_turn"
    usage = events[-1]["metadata"]["usage"]
    assert usage["outputTokens"] == 6
    assert usage["inputTokens"] > 0
    assert usage["totalTokens"] == usage["inputTokens"] + usage["outputTokens"]
    assert events[-1]["metadata"]["metrics"]["latencyMs"] >= 0

    record = _record_for(emulator, prompt, outcome="completed")
    assert record.model_id == MODEL_ID  # arrived as %3A, recorded decoded
    assert record.deltas_sent == 6
    assert record.stop_reason == "end_turn"
    assert record.first_token_at is not None and record.finished_at is not None
    assert record.started_at <= record.first_token_at <= record.finished_at


def test_square_root_round_trip_through_the_calculator(bedrock: Any) -> None:
    """The sqrt question calls the calculator, and its result is answered."""
    question = "What is the square root of 144?"
    events = _events(_converse(bedrock, [_user(question)]))
    (start,) = [e["contentBlockStart"] for e in events if "contentBlockStart" in e]
    tool_use = start["start"]["toolUse"]
    assert tool_use["name"] == "calculator"
    assert tool_use["toolUseId"].startswith("tooluse_")
    fragments = [
        e["contentBlockDelta"]["delta"]["toolUse"]["input"] for e in events if "contentBlockDelta" in e
    ]
    assert len(fragments) > 1
    tool_input = json.loads("".join(fragments))
    assert tool_input == {"expression": "sqrt(144)"}
    assert events[-2]["messageStop"]["stopReason"] == "tool_use"

    follow_up = [
        _user(question),
        {"role": "assistant", "content": [{"toolUse": {**tool_use, "input": tool_input}}]},
        {
            "role": "user",
            "content": [
                {
                    "toolResult": {
                        "toolUseId": tool_use["toolUseId"],
                        "content": [{"text": "12"}],
                        "status": "success",
                    }
                }
            ],
        },
    ]
    answer = _events(_converse(bedrock, follow_up))
    assert _text(answer) == "The square root of 144 is 12."
    assert answer[-2]["messageStop"]["stopReason"] == "end_turn"


def test_parallel_tool_uses(bedrock: Any) -> None:
    """tools=2 streams two tool-use blocks in one message."""
    events = _events(_converse(bedrock, [_user("[emu:tools=2] add things")]))
    starts = [e["contentBlockStart"] for e in events if "contentBlockStart" in e]
    assert [s["contentBlockIndex"] for s in starts] == [0, 1]
    assert events[-2]["messageStop"]["stopReason"] == "tool_use"


def test_reasoning_block(bedrock: Any) -> None:
    """botocore parses reasoning deltas and the signature."""
    events = _events(_converse(bedrock, [_user("[emu:reasoning] [emu:tokens=3] Hello")]))
    deltas = [e["contentBlockDelta"] for e in events if "contentBlockDelta" in e]
    reasoning = [d for d in deltas if "reasoningContent" in d["delta"]]
    assert reasoning and all(d["contentBlockIndex"] == 0 for d in reasoning)
    assert "signature" in reasoning[-1]["delta"]["reasoningContent"]
    assert [d["contentBlockIndex"] for d in deltas if "text" in d["delta"]] == [1, 1, 1]


def test_max_tokens(bedrock: Any) -> None:
    """max_tokens cuts the stream after five deltas."""
    events = _events(_converse(bedrock, [_user("[emu:max_tokens] Tell me a long story")]))
    assert _kinds(events).count("contentBlockDelta") == 5
    assert events[-2]["messageStop"]["stopReason"] == "max_tokens"
    assert events[-1]["metadata"]["usage"]["outputTokens"] == 5


def test_inference_config_max_tokens(bedrock: Any) -> None:
    """inferenceConfig.maxTokens is honoured over the wire."""
    response = _converse(bedrock, [_user("Hello there")], inferenceConfig={"maxTokens": 3})
    events = _events(response)
    assert _kinds(events).count("contentBlockDelta") == 3
    assert events[-2]["messageStop"]["stopReason"] == "max_tokens"


def test_exception_mid_stream(bedrock: Any, emulator: EmbeddedEmulator) -> None:
    """An in-stream exception reaches boto3 as EventStreamError after some deltas."""
    prompt = _tagged("[emu:fail=throttlingException] Tell me a story")
    response = _converse(bedrock, [_user(prompt)])
    received: list[dict[str, Any]] = []
    with pytest.raises(EventStreamError) as caught:
        for event in response["stream"]:
            received.append(event)
    assert caught.value.response["Error"]["Code"] == "throttlingException"
    assert caught.value.response["Error"]["Message"]
    assert _kinds(received) == ["messageStart"] + ["contentBlockDelta"] * 3
    record = _record_for(emulator, prompt, outcome="error")
    assert record.error_type == "throttlingException"
    assert record.deltas_sent == 3


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (500, "InternalServerException"),
        (429, "ThrottlingException"),
        (503, "ServiceUnavailableException"),
        (400, "ValidationException"),
    ],
)
def test_http_error_before_the_stream(
    bedrock: Any, emulator: EmbeddedEmulator, status: int, code: str
) -> None:
    """An HTTP error before the stream reaches boto3 as ClientError with its code."""
    prompt = _tagged(f"[emu:http={status}] Hello")
    with pytest.raises(ClientError) as caught:
        _converse(bedrock, [_user(prompt)])
    assert caught.value.response["Error"]["Code"] == code
    assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == status
    records = [r for r in emulator.records() if r.user_text == prompt]
    assert [(r.outcome, r.status) for r in records] == [("error", status)]


def test_boto3_retries_get_the_same_error(emulator: EmbeddedEmulator) -> None:
    """boto3's own retries are answered with the same error."""
    prompt = _tagged("[emu:http=429] Hello")
    client = _client(emulator, total_max_attempts=2, mode="standard")
    with pytest.raises(ClientError) as caught:
        _converse(client, [_user(prompt)])
    assert caught.value.response["Error"]["Code"] == "ThrottlingException"
    assert caught.value.response["ResponseMetadata"]["RetryAttempts"] == 1
    records = [r for r in emulator.records() if r.user_text == prompt]
    assert [(r.outcome, r.status) for r in records] == [("error", 429)] * 2


def test_client_closing_the_stream_is_recorded(bedrock: Any, emulator: EmbeddedEmulator) -> None:
    """Closing the stream mid-answer is recorded as client_closed."""
    prompt = _tagged("[emu:tps=50] [emu:tokens=500] Tell me a very long story")
    response = _converse(bedrock, [_user(prompt)])
    stream = iter(response["stream"])
    next(stream)
    next(stream)
    response["stream"].close()
    record = _record_for(emulator, prompt, outcome="client_closed")
    assert 1 <= record.deltas_sent < 500
    assert record.finished_at is not None


def test_records_snapshot_is_a_copy(bedrock: Any, emulator: EmbeddedEmulator) -> None:
    """Changing a snapshot does not change the emulator's records."""
    prompt = _tagged("Hello")
    _events(_converse(bedrock, [_user(prompt)]))
    _record_for(emulator, prompt, outcome="completed")
    snapshot = emulator.records()
    snapshot[-1].outcome = "error"
    assert any(r.user_text == prompt and r.outcome == "completed" for r in emulator.records())


def test_wait_for_times_out(emulator: EmbeddedEmulator) -> None:
    """wait_for raises TimeoutError when nothing matches."""
    with pytest.raises(TimeoutError):
        emulator.wait_for(lambda record: False, 0.05)


def test_config_pacing_is_followed() -> None:
    """The configured ttft and tokens-per-second are respected."""
    config = EmulatorConfig(ttft_ms=100, tokens_per_second=100)
    with EmbeddedEmulator(config) as emu:
        client = _client(emu)
        events = _events(_converse(client, [_user("[emu:tokens=11] Hello")]))
        assert _kinds(events).count("contentBlockDelta") == 11
        record = emu.wait_for(lambda r: r.outcome == "completed", 5.0)
    assert record.first_token_at - record.started_at >= 0.1  # type: ignore[operator]
    # Ten gaps of 10 ms after the first token.
    assert record.finished_at - record.first_token_at >= 0.095  # type: ignore[operator]


def test_token_times_are_recorded_only_when_asked() -> None:
    """With ``record_token_times`` each token's release is in its record, at the asked pace;
    without it the record keeps none."""
    with EmbeddedEmulator(EmulatorConfig(tokens_per_second=200, record_token_times=True)) as emu:
        _events(_converse(_client(emu), [_user("[emu:tokens=5] Hello")]))
        record = emu.wait_for(lambda r: r.outcome == "completed", 5.0)
    times = record.token_times
    assert len(times) == 5
    assert record.first_token_at is not None and times[0] <= record.first_token_at
    assert record.started_at <= times[0] and times[-1] <= record.finished_at  # type: ignore[operator]
    # Deadlines 5 ms apart from the first token's release.
    assert all(later - times[0] >= k * 0.005 - 0.001 for k, later in enumerate(times))
    with EmbeddedEmulator(EmulatorConfig()) as emu:
        _events(_converse(_client(emu), [_user("[emu:tokens=5] Hello")]))
        assert emu.wait_for(lambda r: r.outcome == "completed", 5.0).token_times == []


async def test_token_times_are_in_the_records_route(aiohttp_client: Any) -> None:
    """``GET /_emulator/records`` carries ``token_times`` for a benchmark in another process."""
    client = await aiohttp_client(create_emulator_app(EmulatorConfig(record_token_times=True)))
    body = {"messages": [_user("[emu:tokens=3] Hi")]}
    async with client.post(f"/model/{MODEL_ID}/converse-stream", json=body) as response:
        await response.read()
    async with client.get("/_emulator/records") as response:
        (record,) = await response.json()
    assert len(record["token_times"]) == 3 and record["token_times"] == sorted(record["token_times"])


# --- raw HTTP ------------------------------------------------------------------------------


@pytest.fixture
async def raw_client(aiohttp_client: Any) -> TestClient:
    """An aiohttp test client on a fresh emulator app."""
    return await aiohttp_client(create_emulator_app(EmulatorConfig()))


def _converse_path(model_id: str = "anthropic.claude-3-5-sonnet-20240620-v1%3A0") -> str:
    """The ConverseStream path for a URL-encoded model id."""
    return f"/model/{model_id}/converse-stream"


@pytest.mark.parametrize("body", [b"not json", b"{}", b'{"messages": "hi"}'])
async def test_invalid_request_is_a_validation_error(raw_client: TestClient, body: bytes) -> None:
    """Invalid JSON or a missing messages list is a 400 ValidationException."""
    response = await raw_client.post(_converse_path(), data=body)
    assert response.status == 400
    assert response.headers["x-amzn-ErrorType"] == "ValidationException"
    assert "message" in await response.json()


async def test_raw_stream_headers_and_frames(raw_client: TestClient) -> None:
    """The raw response carries Bedrock's headers and frame order."""
    body = {"messages": [_user("[emu:tokens=2] Hi")]}
    response = await raw_client.post(_converse_path(), json=body)
    assert response.status == 200
    assert response.headers["Content-Type"] == "application/vnd.amazon.eventstream"
    assert response.headers["Transfer-Encoding"] == "chunked"
    assert response.headers["x-amzn-RequestId"]
    buffer = EventStreamBuffer()
    buffer.add_data(await response.read())
    types = [message.headers[":event-type"] for message in buffer]
    assert types == [
        "messageStart",
        "contentBlockDelta",
        "contentBlockDelta",
        "contentBlockStop",
        "messageStop",
        "metadata",
    ]


async def test_records_endpoint_and_model_arn(raw_client: TestClient) -> None:
    """/_emulator/records lists the request, with an ARN model id decoded."""
    arn = "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude"
    encoded = arn.replace(":", "%3A").replace("/", "%2F")
    spec = {"toolSpec": {"name": "lookup", "inputSchema": {"json": {"type": "object"}}}}
    body = {
        "messages": [_user("Hello")],
        "system": [{"text": "Be brief."}, {"text": "Be kind."}],
        "toolConfig": {"tools": [spec, {"toolSpec": {**spec["toolSpec"], "name": "calculator"}}]},
    }
    response = await raw_client.post(_converse_path(encoded), json=body)
    await response.read()
    records = await (await raw_client.get("/_emulator/records")).json()
    assert len(records) == 1
    assert records[0]["model_id"] == arn
    # what the request asked: its system prompt and its tools (sorted), for tests to tell agents apart
    assert records[0]["system"] == "Be brief.\n\nBe kind."
    assert records[0]["tools"] == ["calculator", "lookup"]
    assert records[0]["outcome"] == "completed"
    assert records[0]["deltas_sent"] == 12
    assert set(records[0]) >= {
        "index", "model_id", "user_text", "started_at", "first_token_at", "finished_at",
        "outcome", "deltas_sent",
    }  # fmt: skip


async def test_stop_cuts_streams_in_flight() -> None:
    """stop() ends a paced stream promptly and records it as an error."""
    emu = EmbeddedEmulator().start()
    try:
        async with aiohttp.ClientSession() as session:
            body = {"messages": [_user("[emu:tps=20] [emu:tokens=500] Hi")]}
            async with session.post(emu.url + _converse_path(), json=body) as response:
                await response.content.readany()
                await asyncio.to_thread(emu.stop)
    finally:
        emu.stop()
    (record,) = emu.records()
    assert record.outcome == "error"


async def test_many_concurrent_paced_streams_keep_their_pace() -> None:
    """200 concurrent paced streams all complete, none faster than its pace (speed is benchmarked, not tested)."""
    streams, tokens, tps = 200, 8, 20.0
    with EmbeddedEmulator(EmulatorConfig(tokens_per_second=tps)) as emu:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:

            async def one(i: int) -> None:
                body = {"messages": [_user(f"[emu:tokens={tokens}] stream {i}")]}
                async with session.post(emu.url + _converse_path(), json=body) as response:
                    await response.read()

            await asyncio.gather(*(one(i) for i in range(streams)))
        # The client may read the last byte before the handler records its outcome: wait for each.
        for i in range(streams):
            await asyncio.to_thread(
                emu.wait_for,
                lambda r, i=i: r.user_text.endswith(f"stream {i}") and r.outcome != "running",
                5.0,
            )
        records = emu.records()
    assert len(records) == streams
    assert all(r.outcome == "completed" and r.deltas_sent == tokens for r in records)
    ideal = (tokens - 1) / tps
    slowest = max(r.finished_at - r.first_token_at for r in records)  # type: ignore[operator]
    assert ideal <= slowest + 0.005
