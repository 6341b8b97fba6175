"""BedrockProvider over real HTTP (aiobotocore on a real port): against the emulator, and against a
small fake Bedrock that answers with the exact event-stream frames a test writes (what the emulator
never sends)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from service.core.events import Event, TextDelta, ToolInputDelta, ToolUse, ToolUseStart
from service.emulator import EmulatorConfig, create_emulator_app
from service.emulator.eventstream import CONTENT_TYPE, encode_event, encode_message
from service.emulator.server import RECORDS_KEY
from service.errors import ProviderError
from service.providers.base import POOL_IDLE_S, ModelRequest, PendingToolUse, TurnResult
from service.providers.bedrock import BedrockProvider
from service.providers.bedrock_stream import BedrockStreamParser


class FakeBedrock:
    """A ConverseStream endpoint answering every request with the status, headers and body a test set."""

    def __init__(self) -> None:
        self.requests = 0
        self.status = 200
        self.headers: dict[str, str] = {"Content-Type": CONTENT_TYPE}
        self.body = b""
        self.user_agents: list[str] = []

    async def handle(self, request: web.Request) -> web.Response:
        """Count the request; answer with the body set."""
        await request.read()
        self.requests += 1
        self.user_agents.append(request.headers.get("User-Agent", ""))
        return web.Response(status=self.status, headers=self.headers, body=self.body)


def provider_at(server: Any, **options: Any) -> BedrockProvider:
    """A provider pointed at a test server, with made-up credentials."""
    return BedrockProvider(
        model_id="m",
        endpoint_url=str(server.make_url("")).rstrip("/"),
        region_name="us-east-1",
        credentials={"aws_access_key_id": "test", "aws_secret_access_key": "test"},
        **options,
    )


@pytest.fixture
async def fake(aiohttp_server: Any) -> AsyncIterator[tuple[FakeBedrock, BedrockProvider]]:
    """A fake Bedrock and a provider pointed at it."""
    upstream = FakeBedrock()
    app = web.Application()
    app.router.add_post("/model/{modelId:.+}/converse-stream", upstream.handle)
    made = provider_at(await aiohttp_server(app), max_attempts=1, max_concurrent_runs=2)
    yield upstream, made
    await made.close()


@pytest.fixture
async def emulated(aiohttp_server: Any) -> AsyncIterator[tuple[Any, BedrockProvider]]:
    """The emulator on a real port and a provider pointed at it."""
    server = await aiohttp_server(create_emulator_app(EmulatorConfig()))
    made = provider_at(server, max_concurrent_runs=64)
    yield server, made
    await made.close()


async def run_turn(provider: BedrockProvider) -> tuple[list[Event], TurnResult]:
    """Stream one turn through the provider and a parser."""
    parser = BedrockStreamParser(turn=1)
    events: list[Event] = []
    request = ModelRequest([{"role": "user", "content": [{"text": "hi"}]}])
    async for raw in provider.raw_stream(request):
        events.extend(parser.feed(raw))
    return events, parser.result()


def nested(depth: int) -> str:
    """A JSON object holding objects ``depth`` levels deep."""
    return '{"a":' * depth + "1" + "}" * depth


def frames(*events: tuple[str, dict[str, Any]]) -> bytes:
    """The event-stream body of these events."""
    return b"".join(encode_event(kind, payload) for kind, payload in events)


def tool_answer(tool_input: str) -> bytes:
    """A whole answer calling one tool with ``tool_input`` as its JSON text."""
    return frames(
        ("messageStart", {"role": "assistant"}),
        (
            "contentBlockStart",
            {"contentBlockIndex": 0, "start": {"toolUse": {"toolUseId": "t1", "name": "calc"}}},
        ),
        ("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"toolUse": {"input": tool_input}}}),
        ("contentBlockStop", {"contentBlockIndex": 0}),
        ("messageStop", {"stopReason": "tool_use"}),
        ("metadata", {"usage": {"inputTokens": 3, "outputTokens": 4, "totalTokens": 7}, "metrics": {}}),
    )


async def test_a_tool_input_over_the_wire(fake: tuple[FakeBedrock, BedrockProvider]) -> None:
    upstream, provider = fake
    upstream.body = tool_answer('{"x": [1, 2]}')
    events, result = await run_turn(provider)
    assert events[-1] == ToolUse(tool="calc", tool_use_id="t1", input={"x": [1, 2]})
    assert result.stop_reason == "tool_use" and result.usage.total_tokens == 7


@pytest.mark.parametrize("depth", [150, 5000])
async def test_a_tool_input_nested_too_deep_is_an_input_error(
    fake: tuple[FakeBedrock, BedrockProvider], depth: int
) -> None:
    upstream, provider = fake
    upstream.body = tool_answer(nested(depth))
    events, result = await run_turn(provider)
    assert events[-1] == ToolUse(tool="calc", tool_use_id="t1", input={})
    (use,) = result.tool_uses
    assert use.input == {} and (use.input_error or "").startswith("tool input is not valid JSON: ")


async def test_an_event_nested_too_deep_is_a_malformed_chunk(
    fake: tuple[FakeBedrock, BedrockProvider],
) -> None:
    upstream, provider = fake
    headers = {
        ":event-type": "contentBlockDelta",
        ":content-type": "application/json",
        ":message-type": "event",
    }
    deep = b'{"contentBlockIndex":0,"delta":{"text":"x"},"extra":' + b"[" * 5000 + b"]" * 5000 + b"}"
    upstream.body = frames(("messageStart", {"role": "assistant"})) + encode_message(headers, deep)
    with pytest.raises(ProviderError) as caught:
        await run_turn(provider)
    assert caught.value.code == "malformed_chunk" and "nested" in str(caught.value)


async def test_an_error_body_nested_too_deep_is_a_malformed_chunk(
    fake: tuple[FakeBedrock, BedrockProvider],
) -> None:
    upstream, provider = fake
    upstream.status = 400
    upstream.headers = {"Content-Type": "application/json", "x-amzn-ErrorType": "ValidationException"}
    upstream.body = (
        json.dumps({"message": "no"}).encode()[:-1] + b',"extra":' + b"[" * 5000 + b"]" * 5000 + b"}"
    )
    with pytest.raises(ProviderError) as caught:
        await run_turn(provider)
    assert caught.value.code == "malformed_chunk" and not caught.value.retryable
    assert upstream.requests == 1


async def test_stream_yields_the_turns_events_then_its_result(
    fake: tuple[FakeBedrock, BedrockProvider],
) -> None:
    upstream, provider = fake
    upstream.body = tool_answer('{"x": 1}')
    request = ModelRequest([{"role": "user", "content": [{"text": "hi"}]}])
    *events, result = [item async for item in provider.stream(request, turn=3)]
    assert [type(e) for e in events] == [ToolUseStart, ToolInputDelta, ToolUse]
    assert {e.turn for e in events} == {3}
    assert isinstance(result, TurnResult) and result.tool_uses == [PendingToolUse("calc", "t1", {"x": 1})]
    assert result.message["content"] == [{"toolUse": {"toolUseId": "t1", "name": "calc", "input": {"x": 1}}}]


async def test_closing_the_turns_stream_closes_the_upstream_at_once(
    emulated: tuple[Any, BedrockProvider],
) -> None:
    server, provider = emulated
    text = "A long story [emu:tokens=2000] [emu:tps=50]"
    stream = provider.stream(ModelRequest([{"role": "user", "content": [{"text": text}]}]))
    async for event in stream:
        if isinstance(event, TextDelta):
            break
    await stream.aclose()
    assert await asyncio.to_thread(provider.wait_idle, 1.0)
    record = await asyncio.to_thread(
        server.app[RECORDS_KEY].wait_for,
        lambda r: r.user_text == text and r.outcome == "client_closed",
        1.0,
    )
    assert record.deltas_sent < 2000


@pytest.mark.slow
async def test_streams_in_flight_take_no_thread(emulated: tuple[Any, BedrockProvider]) -> None:
    _, provider = emulated

    def request(text: str) -> ModelRequest:
        return ModelRequest([{"role": "user", "content": [{"text": text}]}])

    # The first request makes the client (and may start the loop's executor for TLS set-up).
    assert [e async for e in provider.stream(request("warm [emu:tokens=1]"))]
    threads = threading.active_count()
    streams = [provider.stream(request(f"long {n} [emu:tokens=2000] [emu:tps=50]")) for n in range(50)]
    firsts = await asyncio.gather(*(anext(stream) for stream in streams))
    assert all(isinstance(event, TextDelta) for event in firsts)
    assert provider.active_streams == 50
    assert threading.active_count() == threads
    await asyncio.gather(*(stream.aclose() for stream in streams))
    assert provider.active_streams == 0


async def test_the_pool_keeps_idle_connections_a_minute(emulated: tuple[Any, BedrockProvider]) -> None:
    """aiobotocore closes a connection idle for 12 s: every query of a burst that comes a quarter
    of a minute after the last would open (and with TLS, handshake) a connection again."""
    _, provider = emulated
    assert [e async for e in provider.stream(ModelRequest([{"role": "user", "content": [{"text": "hi"}]}]))]
    client = await provider._get_client()
    (session,) = client._endpoint.http_session._sessions.values()
    assert session.connector._keepalive_timeout == POOL_IDLE_S >= 60
    assert len(session.connector._conns) == 1  # the answer's connection, back in the pool


async def test_padding_blobs_and_unknown_events_over_the_wire(
    fake: tuple[FakeBedrock, BedrockProvider],
) -> None:
    upstream, provider = fake
    upstream.body = frames(
        ("messageStart", {"role": "assistant", "p": "abcd"}),
        (
            "contentBlockDelta",
            {"contentBlockIndex": 0, "delta": {"reasoningContent": {"text": "hm"}}, "p": "ab"},
        ),
        # A blob, base64 on the wire: left to botocore's parser, which decodes it.
        (
            "contentBlockDelta",
            {"contentBlockIndex": 0, "delta": {"reasoningContent": {"redactedContent": "c2VjcmV0"}}},
        ),
        ("contentBlockStop", {"contentBlockIndex": 0}),
        ("someFutureEvent", {"x": 1}),  # botocore parses it to nothing; it is skipped
        ("contentBlockDelta", {"contentBlockIndex": 1, "delta": {"text": "Hi"}, "p": "abcdefghijk"}),
        ("messageStop", {"stopReason": "end_turn"}),
    )
    request = ModelRequest([{"role": "user", "content": [{"text": "hi"}]}])
    raw = [event async for event in provider.raw_stream(request)]
    assert [next(iter(event)) for event in raw] == [
        "messageStart",
        "contentBlockDelta",
        "contentBlockDelta",
        "contentBlockStop",
        "contentBlockDelta",
        "messageStop",
    ]
    assert raw[2]["contentBlockDelta"]["delta"] == {"reasoningContent": {"redactedContent": b"secret"}}
    assert raw[4] == {"contentBlockDelta": {"delta": {"text": "Hi"}, "contentBlockIndex": 1}}


async def test_the_user_agent_is_botocores_own_built_once(fake: tuple[FakeBedrock, BedrockProvider]) -> None:
    upstream, provider = fake
    upstream.body = tool_answer("{}")
    for _ in range(2):
        await run_turn(provider)
    client = await provider._get_client()
    creator = client._user_agent_creator
    # What botocore's own builder gives (the class's method, not the cached one on the instance).
    expected = type(creator).to_string(creator)
    assert upstream.user_agents[0].startswith("aiobotocore/") and " m/" in upstream.user_agents[0]
    assert upstream.user_agents == [expected, expected]


@pytest.mark.slow
async def test_a_body_that_stops_coming_times_out_after_the_headers(aiohttp_server: Any) -> None:
    """The headers, a delta, another once the first was read, then nothing: the stall watch (not
    aiohttp's timer, dropped at the second read) ends the read."""
    release, go_on = asyncio.Event(), asyncio.Event()

    def delta(text: str) -> bytes:
        return frames(("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": text}}))

    async def stalling(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": CONTENT_TYPE})
        await response.prepare(request)
        await response.write(delta("a"))
        await go_on.wait()
        await response.write(delta("b"))
        await release.wait()
        return response

    app = web.Application()
    app.router.add_post("/model/{modelId:.+}/converse-stream", stalling)
    provider = provider_at(await aiohttp_server(app), max_attempts=1, read_timeout=0.3)
    seen: list[str] = []
    try:
        with pytest.raises(ProviderError) as caught:
            async with asyncio.timeout(5):  # a watch that never fires fails here, not by hanging
                async for raw in provider.raw_stream(
                    ModelRequest([{"role": "user", "content": [{"text": "hi"}]}])
                ):
                    seen.extend(
                        event.text
                        for event in BedrockStreamParser().feed(raw)
                        if isinstance(event, TextDelta)
                    )
                    go_on.set()
        assert caught.value.code == "read_timeout" and caught.value.retryable
        assert seen == ["a", "b"]
        assert provider.active_streams == 0
    finally:
        release.set()
        await provider.close()


async def test_the_answers_other_events_are_read_by_the_clients_own_model(
    emulated: tuple[Any, BedrockProvider],
) -> None:
    """The plans for message and block starts and stops and the metadata come from the client's
    model when it is made: no second botocore session loads the model mid-stream."""
    _, provider = emulated
    await provider.start()
    assert {"messageStart", "contentBlockStop", "messageStop", "metadata"} <= set(provider._plans)
