"""The emulator's OpenAI-compatible route over real HTTP: POST /v1/chat/completions, read as raw SSE."""

from __future__ import annotations

import json
import time
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from service.emulator.openai import bedrock_request
from service.emulator.script import plan_response
from service.emulator.server import RECORDS_KEY
from service.emulator.steps import EmitText
from service.providers.base import ModelRequest
from service.providers.openai import OpenAIProvider

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluates an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
    },
}


@pytest.fixture
async def emulator(aiohttp_client: Any, emulator_server: TestServer) -> TestClient:
    """A client of the standalone emulator app (``emulator_server``, unpaced, on a real port)."""
    return await aiohttp_client(emulator_server)


def body_for(message: str, *, tools: bool = True, usage: bool = True, **extra: Any) -> dict[str, Any]:
    """A streaming chat-completions request holding one user message."""
    body: dict[str, Any] = {
        "model": "test-model",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": message}],
        "stream": True,
        **extra,
    }
    if usage:
        body["stream_options"] = {"include_usage": True}
    if tools:
        body["tools"] = [CALCULATOR]
    return body


async def read_lines(client: TestClient, body: dict[str, Any]) -> tuple[int, list[Any]]:
    """POST and return the status and every data line's payload (parsed JSON, or the raw text)."""
    async with client.post("/v1/chat/completions", json=body) as response:
        if response.status != 200:
            return response.status, [await response.json()]
        assert response.content_type == "text/event-stream"
        raw = await response.read()
    payloads: list[Any] = []
    for line in raw.decode().split("\n"):
        if line.startswith("data: "):
            data = line[len("data: ") :]
            try:
                payloads.append(json.loads(data))
            except ValueError:
                payloads.append(data)
        else:
            assert line == ""
    return 200, payloads


def records(client: TestClient) -> list[Any]:
    """The emulator's request records."""
    return client.server.app[RECORDS_KEY].snapshot()


async def test_text_answer_chunks_have_openai_shapes(emulator: TestClient) -> None:
    status, lines = await read_lines(emulator, body_for("Tell me [emu:tokens=4]"))
    assert status == 200
    *chunks, usage, done = lines
    assert done == "[DONE]"
    ids = {c["id"] for c in [*chunks, usage]}
    assert len(ids) == 1 and ids.pop().startswith("chatcmpl-")
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == "test-model" for c in chunks)
    assert all(isinstance(c["created"], int) for c in chunks)
    assert chunks[0]["choices"] == [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
    ]
    tokens = [c["choices"][0]["delta"]["content"] for c in chunks[1:-1]]
    assert tokens == ["Here", " is", " an", " answer"]
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == [{"index": 0, "delta": {}, "finish_reason": "stop"}]
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == 4
    assert usage["usage"]["total_tokens"] == usage["usage"]["prompt_tokens"] + 4
    record = records(emulator)[-1]
    assert record.outcome == "completed" and record.stop_reason == "end_turn" and record.deltas_sent == 4
    assert record.model_id == "test-model"
    assert record.system == "Be brief." and record.tools == ("calculator",)


async def test_no_usage_chunk_without_include_usage(emulator: TestClient) -> None:
    _, lines = await read_lines(emulator, body_for("Tell me [emu:tokens=2]", usage=False))
    assert lines[-1] == "[DONE]"
    assert all("usage" not in line for line in lines[:-1])


async def test_tool_call_chunks(emulator: TestClient) -> None:
    _, lines = await read_lines(emulator, body_for("What is the square root of 144?"))
    deltas = [line["choices"][0]["delta"] for line in lines[1:-3]]
    opening = deltas[0]["tool_calls"][0]
    assert opening["index"] == 0 and opening["id"].startswith("tooluse_") and opening["type"] == "function"
    assert opening["function"] == {"name": "calculator", "arguments": ""}
    pieces = [d["tool_calls"][0] for d in deltas[1:]]
    assert all(set(p) == {"index", "function"} and p["index"] == 0 for p in pieces)
    assert json.loads("".join(p["function"]["arguments"] for p in pieces)) == {"expression": "sqrt(144)"}
    assert lines[-3]["choices"][0]["finish_reason"] == "tool_calls"


async def test_two_tool_calls_are_numbered_by_call_not_by_block(emulator: TestClient) -> None:
    _, lines = await read_lines(emulator, body_for("Sums [emu:tools=2] [emu:reasoning]"))
    calls = [
        call
        for line in lines
        if isinstance(line, dict) and line["choices"]
        for call in line["choices"][0]["delta"].get("tool_calls", [])
    ]
    assert [c["index"] for c in calls if "id" in c] == [0, 1]
    reasoning = [
        line["choices"][0]["delta"]["reasoning_content"]
        for line in lines
        if isinstance(line, dict) and line["choices"] and "reasoning_content" in line["choices"][0]["delta"]
    ]
    assert "".join(reasoning).startswith("Let me think")


async def test_tool_results_are_read_from_tool_messages(emulator: TestClient) -> None:
    conversation = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is the square root of 144?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "calculator", "arguments": '{"expression": "sqrt(144)"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "12"},
    ]
    _, lines = await read_lines(emulator, {**body_for(""), "messages": conversation})
    text = "".join(line["choices"][0]["delta"].get("content", "") for line in lines[:-2])
    assert text == "The square root of 144 is 12."
    failed = [
        *conversation[:3],
        {"role": "tool", "tool_call_id": "call_1", "content": "Error: division by zero"},
    ]
    _, lines = await read_lines(emulator, {**body_for(""), "messages": failed})
    text = "".join(line["choices"][0]["delta"].get("content", "") for line in lines[:-2])
    assert text == "The tool failed: division by zero."


async def test_max_tokens_gives_finish_reason_length(emulator: TestClient) -> None:
    _, lines = await read_lines(emulator, body_for("Talk a lot [emu:tokens=50]", max_tokens=3))
    assert sum("content" in line["choices"][0]["delta"] for line in lines[1:-3]) == 3
    assert lines[-3]["choices"][0]["finish_reason"] == "length"


async def test_other_stop_reasons_are_passed_as_they_are(emulator: TestClient) -> None:
    _, lines = await read_lines(emulator, body_for("x [emu:stop=content_filtered]"))
    assert lines[-3]["choices"][0]["finish_reason"] == "content_filter"
    _, lines = await read_lines(emulator, body_for("x [emu:stop=guardrail_intervened]"))
    assert lines[-3]["choices"][0]["finish_reason"] == "guardrail_intervened"


async def test_the_same_plans_as_the_bedrock_route(emulator: TestClient) -> None:
    body = body_for("Describe a river [emu:tokens=9]")
    plan = plan_response(bedrock_request(body))
    _, lines = await read_lines(emulator, body)
    tokens = [line["choices"][0]["delta"]["content"] for line in lines[1:-3]]
    assert tokens == [step.text for step in plan.steps if isinstance(step, EmitText)]


async def test_only_streaming_is_served(emulator: TestClient) -> None:
    status, [error] = await read_lines(emulator, {**body_for("hi"), "stream": False})
    assert status == 400 and "Only streaming is supported" in error["error"]["message"]
    async with emulator.post("/v1/chat/completions", data=b"{nope") as response:
        assert response.status == 400 and "not valid JSON" in (await response.json())["error"]["message"]


async def test_http_directive_gives_an_openai_style_error(emulator: TestClient) -> None:
    status, [error] = await read_lines(emulator, body_for("x [emu:http=429]"))
    assert status == 429
    assert error == {
        "error": {
            "message": "Too many requests, please wait before trying again.",
            "type": "rate_limit_error",
            "code": "ThrottlingException",
        }
    }
    status, [error] = await read_lines(emulator, body_for("x [emu:http=503]"))
    assert status == 503 and error["error"]["type"] == "server_error"
    assert records(emulator)[-1].status == 503 and records(emulator)[-1].outcome == "error"


async def test_a_failure_mid_stream_is_an_error_line_and_no_done(emulator: TestClient) -> None:
    _, lines = await read_lines(emulator, body_for("Say it [emu:throttle]"))
    assert [line["choices"][0]["delta"].get("content") for line in lines[1:4]] == ["Here", " is", " an"]
    assert lines[-1] == {
        "error": {
            "message": "An error occurred (throttlingException) when calling the ConverseStream operation: "
            "Too many requests, please wait before trying again."
        }
    }
    assert "[DONE]" not in lines
    assert records(emulator)[-1].error_type == "throttlingException"


async def test_no_done_ends_without_finish_reason_or_done(emulator: TestClient) -> None:
    _, lines = await read_lines(emulator, body_for("x [emu:no_done] [emu:tokens=3]"))
    assert "[DONE]" not in lines
    assert all(line["choices"] and line["choices"][0]["finish_reason"] is None for line in lines)
    assert len(lines) == 4 and records(emulator)[-1].error_type == "no_done"


async def test_bad_json_sends_one_malformed_line(emulator: TestClient) -> None:
    _, lines = await read_lines(emulator, body_for("x [emu:bad_json] [emu:tokens=3]"))
    malformed = [line for line in lines if isinstance(line, str) and line != "[DONE]"]
    assert len(malformed) == 1 and lines.index(malformed[0]) == 2  # right after the first token
    assert lines[-1] == "[DONE]"


@pytest.mark.parametrize(("after", "tokens_before_cut"), [(2, 2), (0, 0)])
async def test_disconnect_cuts_the_connection(
    emulator: TestClient, after: int, tokens_before_cut: int
) -> None:
    body = body_for(f"x [emu:disconnect] [emu:fail_after={after}]")
    received = b""
    async with emulator.post("/v1/chat/completions", json=body) as response:
        assert response.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            async for data in response.content.iter_any():
                received += data
    assert received.count(b'"content":"') - received.count(b'"content":""') == tokens_before_cut
    record = records(emulator)[-1]
    assert (
        record.outcome == "error"
        and record.error_type == "disconnect"
        and record.deltas_sent == tokens_before_cut
    )


async def test_pacing_follows_the_directives(emulator: TestClient) -> None:
    body = body_for("x [emu:ttft=150] [emu:tps=40] [emu:tokens=5]")
    started = time.monotonic()
    async with emulator.post("/v1/chat/completions", json=body) as response:
        first = await response.content.readline()
        first_at = time.monotonic() - started
        await response.read()
        total = time.monotonic() - started
    assert first.startswith(b"data: ") and first_at >= 0.14
    assert total >= 0.14 + 4 / 40 - 0.02  # five tokens at 40/s: four intervals after the first


def test_request_conversion_round_trips_the_providers_conversation() -> None:
    conversation = [
        {"role": "user", "content": [{"text": "What is 2 + 3 * 4?"}]},
        {
            "role": "assistant",
            "content": [
                {"text": "Computing."},
                {"toolUse": {"toolUseId": "t1", "name": "calculator", "input": {"expression": "2 + 3 * 4"}}},
                {"toolUse": {"toolUseId": "t2", "name": "explode", "input": {}}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"toolResult": {"toolUseId": "t1", "content": [{"text": "14"}]}},
                {"toolResult": {"toolUseId": "t2", "content": [{"text": "boom"}], "status": "error"}},
            ],
        },
    ]
    specs = ({"name": "calculator", "description": "Math.", "input_schema": {"type": "object"}},)
    provider = OpenAIProvider(base_url="http://unused/v1", model_id="m")
    body = provider.request_body(
        ModelRequest(conversation, system="Be brief.", tool_specs=specs, max_tokens=77)
    )
    converted = bedrock_request(body)
    assert converted["messages"] == [
        conversation[0],
        conversation[1],
        {
            "role": "user",
            "content": [
                {"toolResult": {"toolUseId": "t1", "content": [{"text": "14"}]}},
                {"toolResult": {"toolUseId": "t2", "status": "error", "content": [{"text": "boom"}]}},
            ],
        },
    ]
    assert converted["system"] == [{"text": "Be brief."}]
    assert converted["inferenceConfig"] == {"maxTokens": 77}
    assert converted["toolConfig"] == {
        "tools": [
            {
                "toolSpec": {
                    "name": "calculator",
                    "description": "Math.",
                    "inputSchema": {"json": {"type": "object"}},
                }
            }
        ]
    }
