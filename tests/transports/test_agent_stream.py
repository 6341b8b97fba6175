"""POST /agent/stream and /agent/run over real HTTP, with boto3 reading the emulator's event stream."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp.test_utils import TestClient

from tests.conftest import ClientFactory, services_of, sse_events, stream_agent


def _types(events: list[dict]) -> list[str]:
    return [event["type"] for event in events]


async def test_square_root_runs_the_calculator_and_streams_every_step(client: TestClient) -> None:
    events = await stream_agent(client, "What is the square root of 144?")
    types = _types(events)
    assert types[0] == "tool_use_start" and events[0]["tool"] == "calculator"
    tool_id = events[0]["id"]
    first_result = types.index("tool_result")
    assert types.index("tool_input_delta") < types.index("tool_executing") < first_result
    deltas = [e["delta"] for e in events if e["type"] == "tool_input_delta"]
    assert len(deltas) > 1 and json.loads("".join(deltas)) == {"expression": "sqrt(144)"}
    assert all(
        e["id"] == tool_id
        for e in events
        if e["type"] in {"tool_input_delta", "tool_executing", "tool_result"}
    )
    assert events[first_result]["result"] == "12"
    assert "text_delta" in types[first_result:] and "text_delta" not in types[:first_result]
    text = "".join(e["text"] for e in events if e["type"] == "text_delta")
    assert "12" in text
    done = events[-1]
    assert types.count("done") == 1 and done["type"] == "done"
    assert done["turns"] == 2
    assert done["tool_calls"] == [
        {"tool": "calculator", "input": {"expression": "sqrt(144)"}, "tool_use_id": tool_id}
    ]
    usage = done["usage"]
    assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


async def test_stream_headers(client: TestClient) -> None:
    async with client.post("/agent/stream", json={"message": "hello"}) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        assert response.headers["Cache-Control"] == "no-cache"
        assert response.headers["X-Accel-Buffering"] == "no"
        body = await response.text()
    data_lines = [line for line in body.splitlines() if line.strip()]
    assert data_lines and all(line.startswith("data: ") for line in data_lines)


async def test_text_only_answer(client: TestClient) -> None:
    events = await stream_agent(client, "Tell me about streams [emu:tokens=7]")
    assert _types(events) == ["text_delta"] * 7 + ["done"]
    assert events[-1]["turns"] == 1 and events[-1]["tool_calls"] == []
    assert "truncated" not in events[-1]


async def test_max_tokens_marks_done_truncated(client: TestClient) -> None:
    events = await stream_agent(client, "Talk a lot [emu:max_tokens]")
    assert events[-1]["type"] == "done" and events[-1]["truncated"] is True
    assert events[-1]["stop_reason"] == "max_tokens"


async def test_max_turns_marks_done(client: TestClient) -> None:
    events = await stream_agent(client, "Keep calculating [emu:loop]", max_turns=3)
    done = events[-1]
    assert done["type"] == "done" and done["max_turns_reached"] is True and done["turns"] == 3
    assert _types(events).count("tool_result") == 3


async def test_throttling_mid_stream_is_an_error_event_and_the_next_request_works(client: TestClient) -> None:
    events = await stream_agent(client, "Say something [emu:throttle]")
    assert _types(events)[:3] == ["text_delta"] * 3
    error = events[-1]
    assert error["type"] == "error" and error["code"] == "throttlingException"
    assert "throttl" in error["error"].lower() and error["turns"] == 1
    again = await stream_agent(client, "Say something else [emu:tokens=3]")
    assert again[-1]["type"] == "done"


async def test_throttling_before_any_token_is_retried_then_reported(client: TestClient) -> None:
    events = await stream_agent(client, "Say something [emu:throttle] [emu:fail_after=0]")
    assert _types(events) == ["error"]
    attempts = [r for r in services_of(client).emulator.records() if "fail_after=0" in r.user_text]
    assert len(attempts) == 3  # the first try and two retries of the loop


@pytest.mark.slow
async def test_http_500_before_the_stream_is_an_error_event(client: TestClient) -> None:
    events = await stream_agent(client, "Hello [emu:http=500]")
    assert _types(events) == ["error"]
    assert events[0]["code"] == "InternalServerException" and events[0]["turns"] == 1
    assert (await stream_agent(client, "Hello again"))[-1]["type"] == "done"


async def test_unknown_tool_becomes_an_error_result_and_the_run_goes_on(client: TestClient) -> None:
    events = await stream_agent(client, "Use a tool [emu:tool=no_such_tool]")
    result = next(e for e in events if e["type"] == "tool_result")
    assert result["is_error"] is True and "Unknown tool 'no_such_tool'" in result["result"]
    assert events[-1]["type"] == "done" and events[-1]["turns"] == 2
    text = "".join(e["text"] for e in events if e["type"] == "text_delta")
    assert "The tool failed" in text


async def test_a_tool_that_raises(client: TestClient) -> None:
    events = await stream_agent(client, "Use a tool [emu:tool=explode]")
    result = next(e for e in events if e["type"] == "tool_result")
    assert result["is_error"] is True and "the tool blew up" in result["result"]
    assert events[-1]["type"] == "done"


@pytest.mark.slow
async def test_a_tool_that_times_out(client: TestClient) -> None:
    events = await stream_agent(client, "Use a tool [emu:tool=sleepy]")
    result = next(e for e in events if e["type"] == "tool_result")
    assert result["is_error"] is True and "timed out" in result["result"]
    assert events[-1]["type"] == "done"


async def test_client_disconnect_closes_upstream_and_frees_the_thread(client: TestClient) -> None:
    services = services_of(client)
    message = "A long story [emu:tokens=2000] [emu:tps=50]"
    async with client.post("/agent/stream", json={"message": message}) as response:
        async for event in sse_events(response):
            if event["data"]["type"] == "text_delta":
                break
        response.close()  # the client goes away mid-answer
    record = await asyncio.to_thread(
        services.emulator.wait_for, lambda r: r.user_text == message and r.outcome == "client_closed", 1.0
    )
    assert record.deltas_sent < 2000
    assert await asyncio.to_thread(services.provider.wait_idle, 1.0)
    await asyncio.wait_for(services.runs.wait_idle(), 1.0)


async def test_run_and_stream_give_the_same_text(client: TestClient) -> None:
    for question in ("What is the square root of 144?", "Describe a river [emu:tokens=20]"):
        streamed = "".join(
            e["text"] for e in await stream_agent(client, question) if e["type"] == "text_delta"
        )
        async with client.post("/agent/run", json={"message": question}) as response:
            assert response.status == 200
            body = await response.json()
        assert body["response"] == streamed and streamed
        assert set(body) >= {"response", "turns", "tool_calls", "usage"}
        assert body["usage"]["total_tokens"] > 0


@pytest.mark.slow
async def test_run_reports_an_upstream_failure_as_json(client: TestClient) -> None:
    async with client.post("/agent/run", json={"message": "x [emu:http=500]"}) as response:
        assert response.status == 503
        body = await response.json()
    assert body["code"] == "InternalServerException" and body["error"]


async def test_bad_requests_get_clear_json_errors(make_client: ClientFactory) -> None:
    client = await make_client(max_request_bytes=4096, max_message_chars=50)
    cases = [
        (b"{not json", 400, "malformed JSON"),
        (b"", 400, "empty"),
        (b"[1, 2]", 422, "JSON object"),
        (json.dumps({"invalid": "field"}).encode(), 422, "message"),
        (json.dumps({"message": "   "}).encode(), 422, "blank"),
        (json.dumps({"message": "hi", "max_turns": 0}).encode(), 422, "max_turns"),
        (json.dumps({"message": 5}).encode(), 422, "message"),
        (json.dumps({"message": "x" * 10_000}).encode(), 413, "too large"),
        (json.dumps({"message": "x" * 51}).encode(), 422, "longer than 50"),
    ]
    for path in ("/agent/stream", "/agent/run"):
        for body, status, words in cases:
            async with client.post(path, data=body, headers={"Content-Type": "application/json"}) as response:
                assert response.status == status, (path, body[:40], await response.text())
                assert response.content_type == "application/json"
                assert words in (await response.json())["error"]
    async with client.get("/agent/stream") as response:
        assert response.status == 405 and "error" in await response.json()
    async with client.get("/no/such/route") as response:
        assert response.status == 404 and "error" in await response.json()
    assert (await stream_agent(client, "still fine"))[-1]["type"] == "done"


async def test_healthz(client: TestClient) -> None:
    async with client.get("/healthz") as response:
        assert response.status == 200
        body = await response.json()
    assert body["status"] == "ok" and "p99" in body["loop_lag_ms"]


async def test_shutdown_sends_an_error_and_closes_open_streams(client: TestClient) -> None:
    message = "A long story [emu:tokens=2000] [emu:tps=50]"
    async with client.post("/agent/stream", json={"message": message}) as response:
        events = sse_events(response)
        first = await anext(events)
        assert first["data"]["type"] == "text_delta"
        await client.server.app.shutdown()
        rest = [event["data"] async for event in events]
    assert rest[-1]["type"] == "error" and rest[-1]["code"] == "shutdown"
    assert await asyncio.to_thread(services_of(client).provider.wait_idle, 1.0)


async def test_two_tool_uses_in_one_message_run_and_are_reported(client: TestClient) -> None:
    events = await stream_agent(client, "Two sums please [emu:tools=2]")
    starts = [e["id"] for e in events if e["type"] == "tool_use_start"]
    results = {e["id"]: e["result"] for e in events if e["type"] == "tool_result"}
    assert len(starts) == 2 and set(results) == set(starts)
    assert sorted(results.values()) == ["2", "4"]
    done = events[-1]
    assert done["type"] == "done" and done["turns"] == 2
    assert [call["tool_use_id"] for call in done["tool_calls"]] == starts


async def test_reasoning_is_passed_on_and_kept_in_the_conversation(client: TestClient) -> None:
    events = await stream_agent(client, "What is the square root of 144? [emu:reasoning]")
    types = _types(events)
    assert "reasoning_delta" in types and types.index("reasoning_delta") < types.index("tool_use_start")
    assert events[-1]["type"] == "done" and events[-1]["turns"] == 2
    # the second turn sent the reasoning block back and the emulator accepted the conversation
    assert any(e["type"] == "tool_result" and e["result"] == "12" for e in events)


async def test_other_stop_reasons_end_the_run(client: TestClient) -> None:
    for reason in ("stop_sequence", "guardrail_intervened", "content_filtered"):
        events = await stream_agent(client, f"Say it [emu:stop={reason}]")
        assert events[-1]["type"] == "done" and events[-1]["stop_reason"] == reason


async def test_model_errors_inside_the_stream_are_error_events(client: TestClient) -> None:
    for code in ("modelStreamErrorException", "internalServerException", "validationException"):
        events = await stream_agent(client, f"Say it [emu:fail={code}]")
        assert events[-1]["type"] == "error" and events[-1]["code"] == code


async def test_over_the_concurrency_limit_is_a_503_with_retry_after(make_client: ClientFactory) -> None:
    client = await make_client(max_concurrent_runs=1)
    async with client.post("/agent/stream", json={"message": "long [emu:tokens=2000] [emu:tps=50]"}) as first:
        events = sse_events(first)
        await anext(events)
        async with client.post("/agent/run", json={"message": "second"}) as second:
            assert second.status == 503 and second.headers["Retry-After"] == "1"
            assert "limit" in (await second.json())["error"]
        first.close()


async def test_bedrock_provider_honours_boto3_endpoint_variable(
    make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    from service.emulator import EmbeddedEmulator

    with EmbeddedEmulator() as emulator:
        monkeypatch.setenv("AWS_ENDPOINT_URL_BEDROCK_RUNTIME", emulator.url)
        monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
        client = await make_client(provider="bedrock")
        events = await stream_agent(client, "routed by the environment [emu:tokens=4]")
        assert events[-1]["type"] == "done"
        assert any(r.user_text.startswith("routed by the environment") for r in emulator.records())
        assert services_of(client).provider.region == "eu-west-1"


async def test_the_tool_flow_is_the_same_on_every_provider(
    make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seed 001's square root gives the same agent-dialect events on emulator, bedrock and openai."""
    from service.emulator import EmbeddedEmulator

    def shape(events: list[dict]) -> list[tuple]:
        return [
            (e["type"], e.get("tool"), e.get("result"), e.get("turns"))
            for e in events
            if e["type"] != "tool_input_delta"  # fragments are cut differently per wire format
        ]

    seen = {}
    seen["emulator"] = await stream_agent(
        await make_client(provider="emulator"), "What is the square root of 144?"
    )
    seen["openai"] = await stream_agent(
        await make_client(provider="openai", openai_base_url="emulator"), "What is the square root of 144?"
    )
    with EmbeddedEmulator() as emulator:
        monkeypatch.setenv("AWS_ENDPOINT_URL_BEDROCK_RUNTIME", emulator.url)
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
        seen["bedrock"] = await stream_agent(
            await make_client(provider="bedrock"), "What is the square root of 144?"
        )
    texts = {
        name: "".join(e.get("text", "") for e in events if e["type"] == "text_delta")
        for name, events in seen.items()
    }
    assert set(texts.values()) == {"The square root of 144 is 12."}
    assert shape(seen["emulator"]) == shape(seen["openai"]) == shape(seen["bedrock"])
    for events in seen.values():
        assert (
            "".join(e["delta"] for e in events if e["type"] == "tool_input_delta").replace(" ", "")
            == '{"expression":"sqrt(144)"}'
        )
