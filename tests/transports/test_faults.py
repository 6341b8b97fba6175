"""Faults injected at every edge: the model upstream failing before, inside and without its
stream, and clients that go away mid-stream a thousand times.

The upstream is the emulator over real HTTP (boto3 for Bedrock, aiohttp for the OpenAI route),
steered by ``[emu:...]`` directives; Redis faults are in tests/cluster (Redis killed and
restarted under streams).
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from service.agent.loop import AgentLoop
from service.emulator.eventstream import CONTENT_TYPE as EVENTSTREAM
from service.emulator.eventstream import encode_event, encode_message
from tests.conftest import SUITE_REDIS_URL, ClientFactory, services_of, sse_events, stream_agent
from tests.transports.test_mcp import RawMcp, read_messages

RETRYABLE_IN_STREAM = [
    "throttlingException",
    "modelStreamErrorException",
    "internalServerException",
    "serviceUnavailableException",
]


def attempts(client: TestClient, marker: str) -> int:
    """How many requests the emulator received for the prompt holding ``marker``."""
    return sum(1 for record in services_of(client).emulator.records() if marker in record.user_text)


def types_of(events: list[dict[str, Any]]) -> list[str]:
    return [event["type"] for event in events]


# --- upstream errors inside the stream ---


@pytest.mark.slow
@pytest.mark.parametrize("exception", RETRYABLE_IN_STREAM)
async def test_an_error_inside_the_stream_before_any_text_is_retried(
    client: TestClient, exception: str
) -> None:
    marker = f"retry-{exception}"
    events = await stream_agent(
        client, f"{marker} [emu:fail={exception}] [emu:fail_after=0] [emu:fail_times=1]"
    )
    assert events[-1]["type"] == "done"
    assert attempts(client, marker) == 2  # the failed try and one retry
    assert types_of(events).count("text_delta") >= 1  # the whole answer, once


@pytest.mark.slow
@pytest.mark.parametrize("exception", RETRYABLE_IN_STREAM)
async def test_an_error_after_text_reached_the_client_is_not_replayed(
    client: TestClient, exception: str
) -> None:
    marker = f"late-{exception}"
    events = await stream_agent(
        client, f"{marker} [emu:fail={exception}] [emu:fail_after=3] [emu:fail_times=1]"
    )
    assert types_of(events) == ["text_delta"] * 3 + ["error"]
    assert events[-1]["code"] == exception and events[-1]["recoverable"] is True
    assert attempts(client, marker) == 1  # a retry would have shown the first words twice


async def test_retries_stop_after_the_limit(make_client: ClientFactory) -> None:
    client = await make_client(throttle_retries=3)
    events = await stream_agent(client, "limit [emu:fail=internalServerException] [emu:fail_after=0]")
    assert types_of(events) == ["error"] and events[0]["recoverable"] is True
    assert attempts(client, "limit") == 4


@pytest.mark.parametrize("exception", ["validationException", "accessDeniedException"])
async def test_validation_and_access_errors_are_never_retried(client: TestClient, exception: str) -> None:
    marker = f"never-{exception}"
    events = await stream_agent(client, f"{marker} [emu:fail={exception}] [emu:fail_after=0]")
    assert types_of(events) == ["error"] and events[0]["recoverable"] is False
    assert attempts(client, marker) == 1


def test_backoff_grows_is_jittered_and_capped() -> None:
    loop = AgentLoop(None, None, backoff_s=0.5, backoff_max_s=4.0)  # type: ignore[arg-type]
    for attempt in range(12):
        ceiling = min(4.0, 0.5 * 2**attempt)
        delays = {loop.retry_delay(attempt) for _ in range(50)}
        assert all(ceiling / 2 <= delay <= ceiling for delay in delays)
        assert len(delays) > 1  # jittered


# --- upstream errors before the stream ---


@pytest.mark.slow
@pytest.mark.parametrize("status", [429, 500, 503])
async def test_a_throttle_or_5xx_before_the_stream_is_retried_by_botocore(
    client: TestClient, status: int
) -> None:
    marker = f"before-{status}"
    events = await stream_agent(client, f"{marker} [emu:http={status}] [emu:fail_times=1]")
    assert events[-1]["type"] == "done"
    assert attempts(client, marker) == 2


@pytest.mark.parametrize("status", [400, 403])
async def test_a_validation_or_access_error_before_the_stream_is_not_retried(
    client: TestClient, status: int
) -> None:
    marker = f"refused-{status}"
    events = await stream_agent(client, f"{marker} [emu:http={status}]")
    assert types_of(events) == ["error"] and events[0]["recoverable"] is False
    assert attempts(client, marker) == 1


@pytest.mark.slow
@pytest.mark.parametrize("provider", ["bedrock", "openai"])
async def test_a_stalled_upstream_times_out_and_frees_its_resources(
    make_client: ClientFactory, provider: str
) -> None:
    settings: dict[str, Any] = {"bedrock_read_timeout_s": 0.5}
    if provider == "openai":
        settings.update(provider="openai", openai_base_url="emulator")
    client = await make_client(**settings)
    services = services_of(client)
    marker = f"stalled-{provider}"
    events = await stream_agent(client, f"{marker} [emu:stall] [emu:stall_after=2] [emu:tokens=10]")
    assert types_of(events) == ["text_delta", "text_delta", "error"]
    assert events[-1]["code"] == "read_timeout" and events[-1]["recoverable"] is True
    # The service hung up on the stalled stream, and holds nothing of it any more.
    record = await asyncio.to_thread(
        services.emulator.wait_for, lambda r: marker in r.user_text and r.outcome == "client_closed", 2.0
    )
    assert record.deltas_sent == 2
    if provider == "bedrock":
        assert await asyncio.to_thread(services.provider.wait_idle, 1.0)
    await asyncio.wait_for(services.runs.wait_idle(), 1.0)
    assert (await stream_agent(client, "and again [emu:tokens=3]"))[-1]["type"] == "done"


async def test_a_connection_cut_mid_answer_is_an_error_event(make_client: ClientFactory) -> None:
    client = await make_client(provider="openai", openai_base_url="emulator")
    events = await stream_agent(client, "cut [emu:disconnect] [emu:fail_after=2]")
    assert types_of(events) == ["text_delta", "text_delta", "error"]
    assert events[-1]["recoverable"] is True


# --- upstream JSON nested too deep ---

DEEP = 5000  # levels: more than json.loads can hold


def nested(depth: int) -> str:
    """A JSON object holding objects ``depth`` levels deep."""
    return '{"a":' * depth + "1" + "}" * depth


def openai_answer(*deltas: dict[str, Any], finish: str = "stop", raw: bytes = b"") -> bytes:
    """An OpenAI stream of ``deltas`` (then ``raw``, a line written as it is) and its end."""
    chunks = [{"choices": [{"index": 0, "delta": delta}]} for delta in deltas]
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    body = b"".join(b"data: " + json.dumps(chunk).encode() + b"\n\n" for chunk in chunks[:-1]) + raw
    return body + b"data: " + json.dumps(chunks[-1]).encode() + b"\n\ndata: [DONE]\n\n"


def bedrock_answer(*blocks: tuple[str, dict[str, Any]], stop: str = "end_turn", raw: bytes = b"") -> bytes:
    """A ConverseStream body of these events (then ``raw``, frames written as they are) and its end."""
    events = [("messageStart", {"role": "assistant"}), *blocks]
    body = b"".join(encode_event(kind, payload) for kind, payload in events) + raw
    return body + encode_event("messageStop", {"stopReason": stop})


# Per provider: the text answer, a tool call whose input is the given JSON text, and a data line or
# event frame nesting too deep (with one word before it).
OPENAI_WIRE = {
    "text": openai_answer({"content": "fine"}),
    "tool": lambda text: openai_answer(
        {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "calculator", "arguments": text}}]},
        finish="tool_calls",
    ),
    "deep": openai_answer({"content": "one"}, raw=b'data: {"choices":' + b'[{"a":' * DEEP + b"\n\n"),
}
_DEEP_EVENT_HEADERS = {":event-type": "contentBlockDelta", ":content-type": "application/json"}
BEDROCK_WIRE = {
    "text": bedrock_answer(("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "fine"}})),
    "tool": lambda text: bedrock_answer(
        (
            "contentBlockStart",
            {"contentBlockIndex": 0, "start": {"toolUse": {"toolUseId": "t1", "name": "calculator"}}},
        ),
        ("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"toolUse": {"input": text}}}),
        ("contentBlockStop", {"contentBlockIndex": 0}),
        stop="tool_use",
    ),
    "deep": bedrock_answer(
        ("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "one"}}),
        raw=encode_message(
            {**_DEEP_EVENT_HEADERS, ":message-type": "event"},
            b'{"contentBlockIndex":0,"delta":{"text":"x"},"extra":' + b"[" * DEEP + b"]" * DEEP + b"}",
        ),
    ),
}


async def deep_client(
    provider: str, answers: list[bytes], aiohttp_server: Any, make_client: ClientFactory, monkeypatch: Any
) -> TestClient:
    """The service on ``provider`` against a fake upstream giving ``answers`` in turn (the last repeats)."""
    queue = list(answers)

    async def answer(request: web.Request) -> web.Response:
        await request.read()
        body = queue.pop(0) if len(queue) > 1 else queue[0]
        content_type = "text/event-stream" if provider == "openai" else EVENTSTREAM
        return web.Response(body=body, headers={"Content-Type": content_type})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer)
    app.router.add_post("/model/{model:.+}/converse-stream", answer)
    server = await aiohttp_server(app)
    if provider == "openai":
        return await make_client(provider="openai", openai_base_url=str(server.make_url("/v1")))
    # The real Bedrock provider, sent to the fake by boto3's own endpoint setting.
    for name, value in {
        "AWS_ENDPOINT_URL_BEDROCK_RUNTIME": str(server.make_url("")).rstrip("/"),
        "AWS_ACCESS_KEY_ID": "fake",
        "AWS_SECRET_ACCESS_KEY": "fake",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    return await make_client(provider="bedrock")


def errors_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize("provider", ["openai", "bedrock"])
async def test_an_upstream_chunk_nested_too_deep_is_a_malformed_chunk(
    provider: str, aiohttp_server: Any, make_client: ClientFactory, monkeypatch: Any, caplog: Any
) -> None:
    caplog.set_level(logging.WARNING)
    wire = OPENAI_WIRE if provider == "openai" else BEDROCK_WIRE
    client = await deep_client(
        provider, [wire["deep"], wire["text"]], aiohttp_server, make_client, monkeypatch
    )
    events = await stream_agent(client, "deep")
    assert types_of(events) == ["text_delta", "error"]
    assert events[-1]["code"] == "malformed_chunk" and "nested" in events[-1]["error"]
    assert (await stream_agent(client, "and again"))[-1]["type"] == "done"
    assert errors_logged(caplog) == []


@pytest.mark.parametrize("provider", ["openai", "bedrock"])
@pytest.mark.parametrize("depth", [150, DEEP])
async def test_a_tool_input_nested_too_deep_is_an_invalid_tool_input(
    provider: str,
    depth: int,
    aiohttp_server: Any,
    make_client: ClientFactory,
    monkeypatch: Any,
    caplog: Any,
) -> None:
    caplog.set_level(logging.WARNING)
    wire = OPENAI_WIRE if provider == "openai" else BEDROCK_WIRE
    answers = [wire["tool"](nested(depth)), wire["text"]]
    client = await deep_client(provider, answers, aiohttp_server, make_client, monkeypatch)
    events = await stream_agent(client, "deep tool")
    result = next(event for event in events if event["type"] == "tool_result")
    assert result["is_error"] is True and result["result"].startswith("tool input is not valid JSON: ")
    assert events[-1]["type"] == "done" and events[-1]["tool_calls"][0]["input"] == {}
    assert errors_logged(caplog) == []


# --- clients that go away ---


def resources(client: TestClient) -> dict[str, int]:
    """What a stream may leak: tasks, threads, the server's connections, open sockets."""
    sockets = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            sockets += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            continue
    return {
        "tasks": len(asyncio.all_tasks()),
        "threads": threading.active_count(),
        "connections": len(client.server.runner.server.connections),  # type: ignore[union-attr]
        "sockets": sockets,
    }


async def settled(client: TestClient, baseline: dict[str, int]) -> dict[str, int]:
    """The resources once the server has noticed the last disconnect (there is no event to
    wait on for a count, so yield to the loop until it matches or a deadline passes)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5.0
    while (now := resources(client)) != baseline and loop.time() < deadline:
        await asyncio.sleep(0.001)
    return now


async def quiescent(client: TestClient) -> dict[str, int]:
    """The resources once no client is connected and nothing has changed for a while."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5.0
    last, steady = resources(client), 0
    while steady < 50 and loop.time() < deadline:
        await asyncio.sleep(0.001)
        now = resources(client)
        steady = steady + 1 if now == last and now["connections"] == 0 else 0
        last = now
    return last


Leaver = Callable[[], Awaitable[None]]


@pytest.mark.slow
async def test_a_thousand_clients_leaving_mid_stream_leave_nothing_behind(make_client: ClientFactory) -> None:
    if SUITE_REDIS_URL:
        pytest.skip("counts this process's own resources, forced to the memory store: once is enough")
    # In memory: this counts the process's own tasks, threads and sockets.
    client = await make_client(redis_url="", emulator_tokens_per_second=2000)
    services = services_of(client)
    endless = "endless [emu:tokens=4000] [emu:tps=50]"  # 80 s: longer than the test
    session_id = (await (await client.post("/sessions", json={})).json())["id"]
    assert (await client.post(f"/sessions/{session_id}/messages", json={"content": endless})).status == 202
    session = await services.sessions.get(session_id)
    mcp = await RawMcp(client).start()
    mcp_session_id = (await mcp.tool("session_message", content=endless))["session_id"]
    mcp_log = (await services.sessions.get(mcp_session_id)).log

    async def agent_stream() -> None:
        async with client.post("/agent/stream", json={"message": "leave [emu:tokens=5000]"}) as response:
            async for event in sse_events(response):
                if event["data"]["type"] == "text_delta":
                    break
            response.close()

    async def session_events() -> None:
        last = await session.log.last_id()
        response = await client.get(
            f"/sessions/{session_id}/events", headers={"Last-Event-ID": str(last - 1)}
        )
        async for _ in sse_events(response):
            break
        response.close()

    async def websocket() -> None:
        ws = await client.ws_connect("/ws")
        await ws.send_json(
            {"type": "subscribe", "session_id": session_id, "last_event_id": await session.log.last_id()}
        )
        while "id" not in await ws.receive_json():
            pass
        ws._response.connection.transport.abort()  # no close frame: the network went away
        await ws.close()  # the client's own bookkeeping (its connection slot); nothing is sent

    async def mcp_stream() -> None:
        last = await mcp_log.last_id()
        async with mcp.stream(f"{mcp_session_id}:{last - 1}") as response:
            await anext(read_messages(response))

    leavers: list[Leaver] = [agent_stream, session_events, websocket, mcp_stream]
    for leave in leavers:  # warm up: pools and caches reach their steady size
        await leave()
    gc.collect()  # a socket object left for the collector would otherwise close mid-loop
    baseline = await quiescent(client)
    subscribers = session.log.subscribers
    for n in range(1000):
        await leavers[n % len(leavers)]()
        assert await settled(client, baseline) == baseline, f"after disconnect {n + 1}"
        assert session.log.subscribers == subscribers
    assert services.runs.active == 2  # only the two endless queries
