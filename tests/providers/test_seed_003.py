"""Seed 003's acceptance scenarios and FR-001…FR-007, one test each, over real HTTP.

Each test streams from the emulator's OpenAI-compatible endpoint through :class:`OpenAIProvider`
(a real aiohttp client on a real port) and reads what the parser makes of it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from service.core.events import TextDelta, ToolInputDelta, ToolUse, ToolUseStart
from service.emulator import EmulatorConfig, create_emulator_app
from service.emulator.server import RECORDS_KEY
from service.providers.base import ModelRequest
from service.providers.openai import OpenAIProvider
from service.providers.openai_stream import DONE, OpenAIStreamParser

CALCULATOR = {
    "name": "calculator",
    "description": "Arithmetic.",
    "input_schema": {"type": "object", "properties": {"expression": {"type": "string"}}},
}


@pytest.fixture
async def upstream(aiohttp_server: Any) -> TestServer:
    return await aiohttp_server(create_emulator_app(EmulatorConfig()))


@pytest.fixture
async def provider(upstream: TestServer) -> AsyncIterator[OpenAIProvider]:
    made = OpenAIProvider(base_url=str(upstream.make_url("/v1")), model_id="bag-model")
    yield made
    await made.close()


async def stream(
    provider: OpenAIProvider, text: str, *, tools: bool = False
) -> tuple[list[Any], list[Any], Any]:
    """Raw chunks, canonical events and the turn's result for one question."""
    request = ModelRequest(
        [{"role": "user", "content": [{"text": text}]}], tool_specs=(CALCULATOR,) if tools else ()
    )
    parser = OpenAIStreamParser(turn=1)
    chunks, events = [], []
    async for chunk in provider.raw_stream(request):
        chunks.append(chunk)
        events.extend(parser.feed(chunk))
    return chunks, events, parser.result()


def texts(events: list[Any]) -> list[str]:
    return [event.text for event in events if isinstance(event, TextDelta)]


# -- user story 1: token streaming ------------------------------------------------------------------


async def test_us1_s1_tokens_arrive_incrementally(provider: OpenAIProvider) -> None:
    _, events, _ = await stream(provider, "Tell me [emu:tokens=6]")
    assert len(texts(events)) == 6


async def test_us1_s2_each_token_is_yielded_immediately(
    provider: OpenAIProvider, upstream: TestServer
) -> None:
    request = ModelRequest([{"role": "user", "content": [{"text": "Slowly [emu:tokens=4] [emu:tps=5]"}]}])
    parser = OpenAIStreamParser(turn=1)
    async for chunk in provider.raw_stream(request):
        if any(isinstance(event, TextDelta) for event in parser.feed(chunk)):
            # the first token is here while the upstream is still writing the rest
            (record,) = [r for r in upstream.app[RECORDS_KEY].snapshot() if "Slowly" in r.user_text]
            assert record.outcome == "running" and record.deltas_sent < 4
            break


async def test_us1_s3_completion_signal_is_sent(provider: OpenAIProvider) -> None:
    chunks, _, result = await stream(provider, "Hi [emu:tokens=2]")
    assert chunks[-1] == DONE and result.stop_reason == "end_turn"


# -- user story 2: content delta parsing --------------------------------------------------------------


async def test_us2_s1_text_is_extracted_from_choices_delta_content(provider: OpenAIProvider) -> None:
    chunks, events, _ = await stream(provider, "Hi [emu:tokens=3]")
    from_wire = "".join(
        c["choices"][0]["delta"].get("content") or "" for c in chunks if isinstance(c, dict) and c["choices"]
    )
    assert "".join(texts(events)) == from_wire and from_wire


async def test_us2_s2_finish_reason_stop_marks_the_stream_complete(provider: OpenAIProvider) -> None:
    chunks, _, result = await stream(provider, "Hi [emu:tokens=3]")
    reasons = [c["choices"][0]["finish_reason"] for c in chunks if isinstance(c, dict) and c["choices"]]
    assert reasons[-1] == "stop" and result.stop_reason == "end_turn"


async def test_us2_s3_done_ends_the_stream_gracefully(provider: OpenAIProvider) -> None:
    chunks, _, result = await stream(provider, "Hi [emu:tokens=3]")
    assert chunks.count(DONE) == 1 and chunks[-1] == DONE and result.usage.total_tokens > 0


# -- user story 3: tool call detection in stream ---------------------------------------------------------


async def test_us3_s1_tool_call_with_id_name_and_arguments(provider: OpenAIProvider) -> None:
    _, events, result = await stream(provider, "What is the square root of 144?", tools=True)
    (start,) = [e for e in events if isinstance(e, ToolUseStart)]
    (use,) = [e for e in events if isinstance(e, ToolUse)]
    assert start.tool == use.tool == "calculator" and start.tool_use_id == use.tool_use_id
    assert use.input == {"expression": "sqrt(144)"} and result.stop_reason == "tool_use"


async def test_us3_s2_arguments_spanning_chunks_are_accumulated(provider: OpenAIProvider) -> None:
    _, events, result = await stream(provider, "What is the square root of 144?", tools=True)
    pieces = [e.delta for e in events if isinstance(e, ToolInputDelta)]
    assert len(pieces) > 1 and json.loads("".join(pieces)) == result.tool_uses[0].input


async def test_us3_s3_multiple_tool_calls_are_captured_by_index(provider: OpenAIProvider) -> None:
    chunks, _, result = await stream(provider, "Two sums [emu:tools=3]", tools=True)
    indexes = {
        call["index"]
        for c in chunks
        if isinstance(c, dict) and c["choices"]
        for call in c["choices"][0]["delta"].get("tool_calls") or []
    }
    assert indexes == {0, 1, 2}
    assert [use.input for use in result.tool_uses] == [{"expression": f"{k}+{k}"} for k in (1, 2, 3)]


# -- functional requirements ----------------------------------------------------------------------------------


async def test_fr001_openai_compatible_streaming_not_native_bedrock(
    provider: OpenAIProvider, upstream: TestServer
) -> None:
    chunks, _, _ = await stream(provider, "Hi [emu:tokens=1]")
    assert all(c == DONE or c["object"] == "chat.completion.chunk" for c in chunks)
    assert provider.request_body(ModelRequest([]))["stream"] is True


async def test_fr002_tokens_are_yielded_as_they_arrive(provider: OpenAIProvider) -> None:
    chunks, events, _ = await stream(provider, "Hi [emu:tokens=5]")
    content_chunks = [
        c for c in chunks if isinstance(c, dict) and c["choices"] and c["choices"][0]["delta"].get("content")
    ]
    assert len(texts(events)) == len(content_chunks) == 5  # one event per chunk, none merged or held


async def test_fr003_sse_data_lines_with_json_payloads(provider: OpenAIProvider) -> None:
    chunks, _, _ = await stream(provider, "Hi [emu:tokens=2]")
    assert chunks and all(isinstance(c, dict) for c in chunks[:-1])


async def test_fr004_text_from_choices_0_delta_content(provider: OpenAIProvider) -> None:
    _, events, result = await stream(provider, "Describe rivers [emu:tokens=4]")
    assert "".join(texts(events)) == result.text and result.text.startswith("Here")


async def test_fr005_tool_calls_from_choices_0_delta_tool_calls(provider: OpenAIProvider) -> None:
    _, events, _ = await stream(provider, "What is 2 + 3?", tools=True)
    assert [e.input for e in events if isinstance(e, ToolUse)] == [{"expression": "2 + 3"}]


async def test_fr006_partial_arguments_accumulated_until_complete(provider: OpenAIProvider) -> None:
    _, events, _ = await stream(provider, "What is 12 * 12?", tools=True)
    uses = [i for i, e in enumerate(events) if isinstance(e, ToolUse)]
    pieces = [i for i, e in enumerate(events) if isinstance(e, ToolInputDelta)]
    assert uses and pieces and max(pieces) < uses[0]  # parsed once the arguments are complete


async def test_fr007_completion_by_finish_reason_or_done(provider: OpenAIProvider) -> None:
    _, _, by_both = await stream(provider, "Hi [emu:tokens=2]")
    assert by_both.stop_reason == "end_turn"
    chunks, _, by_length = await stream(provider, "Long [emu:max_tokens]")
    assert chunks[-1] == DONE and by_length.stop_reason == "max_tokens"
