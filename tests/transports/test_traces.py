"""Traces through the running service: a real OTLP/HTTP receiver (an aiohttp server decoding
the protobuf with opentelemetry-proto) gets the spans the service exports when
OTEL_EXPORTER_OTLP_ENDPOINT points at it, and the test checks their tree, names, kinds and
attributes against what the client saw. The batch processor's delay is cut to a few
milliseconds and each test waits on the receiver for the spans it expects."""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from aiohttp.test_utils import TestClient

from tests.agent.test_mcp import McpTestServer
from tests.conftest import ClientFactory, services_of, sse_events, stream_agent
from tests.support.sessions import cancel_mid_answer
from tests.support.traces import CLIENT, ERROR, INTERNAL, SERVER, Received, Receiver, children, trace_of
from tests.test_logs import json_log_lines
from tests.transports.test_agents import agents_file


async def test_a_calculator_query_is_one_trace_continued_from_the_clients_traceparent(
    traced: TestClient, receiver: Receiver
) -> None:
    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    async with traced.post("/sessions", json={}) as response:
        session_id = (await response.json())["id"]
    async with traced.post(
        f"/sessions/{session_id}/messages",
        json={"content": "What is 17 * 3?"},
        headers={"traceparent": f"00-{trace_id}-{parent_id}-01"},
    ) as response:
        assert response.status == 202
    async with traced.get(f"/sessions/{session_id}/events", headers={"Last-Event-ID": "0"}) as response:
        events = []
        async for event in sse_events(response):
            events.append(event["data"])
            if event["data"]["type"] in {"done", "error"}:
                break
    done = events[-1]
    assert done["type"] == "done" and done["turns"] == 2

    def whole(spans: list[Received]) -> list[Received] | None:
        ours = trace_of(spans, trace_id)
        return ours if len(ours) == 5 else None

    spans = await receiver.wait_for(whole)
    (server,) = [span for span in spans if span.kind == SERVER]
    assert server.name == "POST /sessions/{session_id}/messages" and server.parent_id == parent_id
    assert server.attributes["http.response.status_code"] == 202
    assert server.resource["service.name"] == "agentstream-test"

    (agent,) = children(spans, server)
    assert (agent.name, agent.kind) == ("invoke_agent default", INTERNAL)
    model = services_of(traced).emulator.records()[-1].model_id
    assert agent.attributes == {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": "default",
        "gen_ai.conversation.id": session_id,
        "gen_ai.provider.name": "aws.bedrock",
        "gen_ai.request.model": model,
        "gen_ai.usage.input_tokens": done["usage"]["input_tokens"],
        "gen_ai.usage.output_tokens": done["usage"]["output_tokens"],
    }
    assert agent.status != ERROR

    # The model turns and the tool call are siblings under the query, in the order they ran.
    steps = children(spans, agent)
    assert [(s.name, s.kind) for s in steps] == [
        (f"chat {model}", CLIENT),
        ("execute_tool calculator", INTERNAL),
        (f"chat {model}", CLIENT),
    ]
    first, tool, second = steps
    emulator = urlsplit(services_of(traced).emulator.url)
    for chat, finish in ((first, "tool_use"), (second, "end_turn")):
        assert chat.attributes["gen_ai.operation.name"] == "chat"
        assert chat.attributes["gen_ai.provider.name"] == "aws.bedrock"
        assert chat.attributes["gen_ai.request.model"] == model
        assert chat.attributes["gen_ai.response.finish_reasons"] == (finish,)
        assert chat.attributes["server.address"] == emulator.hostname
        assert chat.attributes["server.port"] == emulator.port
        assert chat.attributes["gen_ai.response.time_to_first_chunk"] >= 0
        assert chat.attributes["gen_ai.response.model"] == model
        assert chat.status != ERROR and chat.events == []
        # Without OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT no content is on the spans.
        assert not any(key.endswith("messages") for key in chat.attributes)
    # Bedrock's request id is the response's id: one per turn.
    assert len({first.attributes["gen_ai.response.id"], second.attributes["gen_ai.response.id"]}) == 2
    for kind in ("input_tokens", "output_tokens"):
        assert (
            first.attributes[f"gen_ai.usage.{kind}"] + second.attributes[f"gen_ai.usage.{kind}"]
            == (done["usage"][kind])
        )
    (call,) = done["tool_calls"]
    assert tool.attributes == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "calculator",
        "gen_ai.tool.call.id": call["tool_use_id"],
        "gen_ai.tool.type": "function",
    }
    assert tool.status != ERROR
    assert receiver.content_types == {"application/x-protobuf"}


async def test_a_throttled_then_failed_turn_ends_its_spans_in_error(
    traced: TestClient, receiver: Receiver
) -> None:
    events = await stream_agent(traced, "Say something [emu:throttle] [emu:fail_after=0]")
    assert events[-1]["type"] == "error" and events[-1]["code"] == "throttlingException"
    agent = (await receiver.wait_for(lambda spans: [s for s in spans if s.name == "invoke_agent default"]))[0]
    spans = trace_of(receiver.spans, agent.trace_id)
    assert agent.status == ERROR and agent.attributes["error.type"] == "throttlingException"
    (chat,) = children(spans, agent)
    assert chat.status == ERROR and chat.attributes["error.type"] == "throttlingException"
    # The first try and two retries: the retries are the span's events.
    retries = [attributes for name, attributes in chat.events if name == "gen_ai.retry"]
    assert [r["retry.attempt"] for r in retries] == [1, 2]
    assert {r["error.type"] for r in retries} == {"throttlingException"}


async def test_a_tool_that_times_out_ends_its_span_in_error(traced: TestClient, receiver: Receiver) -> None:
    events = await stream_agent(traced, "Wait for it [emu:tool=sleepy]")
    assert events[-1]["type"] == "done"
    (tool,) = await receiver.wait_for(lambda spans: [s for s in spans if s.name == "execute_tool sleepy"])
    assert tool.status == ERROR and tool.attributes["error.type"] == "timeout"


async def test_a_cancelled_query_ends_its_spans_as_cancelled(traced: TestClient, receiver: Receiver) -> None:
    await cancel_mid_answer(traced)
    agent = (await receiver.wait_for(lambda spans: [s for s in spans if s.name == "invoke_agent default"]))[0]
    assert agent.status == ERROR and agent.attributes["error.type"] == "cancelled"
    (chat,) = await receiver.wait_for(lambda spans: children(spans, agent))
    assert chat.status == ERROR and chat.attributes["error.type"] == "cancelled"


async def test_without_an_endpoint_nothing_is_set_up(
    make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    client = await make_client()
    telemetry = services_of(client).telemetry
    assert telemetry.provider is None and not telemetry.enabled
    events = await stream_agent(client, "What is 17 * 3?")
    assert events[-1]["type"] == "done"
    # The query ran with the API's no-op tracer: its spans record nothing.
    assert services_of(client).runs.tracer is telemetry.tracer
    assert not telemetry.tracer.start_span("probe").is_recording()


async def test_disabled_sdk_sends_nothing_even_with_an_endpoint(
    receiver: Receiver, make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    client = await make_client()
    assert services_of(client).telemetry.provider is None


async def test_an_agent_on_the_openai_wire_names_its_provider_and_model(
    receiver: Receiver, make_client: ClientFactory, tmp_path: Path
) -> None:
    client = await make_client(agents_file=str(agents_file(tmp_path)))
    events = await stream_agent(client, "Hello [emu:tokens=3]", agent="research")
    assert events[-1]["type"] == "done"
    agent = (await receiver.wait_for(lambda spans: receiver.named("invoke_agent research")))[0]
    assert agent.attributes["gen_ai.provider.name"] == "openai"
    assert agent.attributes["gen_ai.request.model"] == "research-model"
    (chat,) = await receiver.wait_for(lambda spans: children(spans, agent))
    assert chat.name == "chat research-model" and chat.kind == CLIENT
    assert chat.attributes["gen_ai.provider.name"] == "openai"
    assert chat.attributes["server.address"] == urlsplit(services_of(client).emulator.url).hostname
    assert chat.attributes["gen_ai.usage.output_tokens"] == events[-1]["usage"]["output_tokens"]
    assert chat.attributes["gen_ai.response.model"] == "research-model"
    assert chat.attributes["gen_ai.response.id"].startswith("chatcmpl-")
    # The upstream request carried the turn's trace context: the model's side continues the trace.
    (asked,) = [r for r in services_of(client).emulator.records() if r.user_text.startswith("Hello")]
    assert asked.traceparent.split("-")[:3] == ["00", chat.trace_id, chat.span_id]


async def test_json_log_lines_of_a_query_carry_its_trace_and_span_ids(
    traced: TestClient, receiver: Receiver
) -> None:
    with json_log_lines() as lines:
        events = await stream_agent(traced, "Hello [emu:tokens=3]")
        logging.getLogger("service.test").info("outside any request")
    assert events[-1]["type"] == "done"
    (agent,) = await receiver.wait_for(lambda spans: receiver.named("invoke_agent default"))
    started = next(line for line in lines if line["message"].startswith("query started"))
    assert (started["trace_id"], started["span_id"]) == (agent.trace_id, agent.span_id)
    assert "trace_id" not in lines[-1] and lines[-1]["message"] == "outside any request"


async def test_a_turn_on_bedrocks_wire_carries_its_trace_context_upstream(
    traced: TestClient, receiver: Receiver
) -> None:
    events = await stream_agent(traced, "Hello there [emu:tokens=3]")
    assert events[-1]["type"] == "done"
    (agent,) = await receiver.wait_for(lambda spans: receiver.named("invoke_agent default"))
    (chat,) = await receiver.wait_for(lambda spans: children(spans, agent))
    assert chat.attributes["gen_ai.provider.name"] == "aws.bedrock"
    (asked,) = [r for r in services_of(traced).emulator.records() if r.user_text.startswith("Hello there")]
    assert asked.traceparent.split("-")[:3] == ["00", chat.trace_id, chat.span_id]


@pytest.fixture
def alpha() -> Iterator[McpTestServer]:
    """A real MCP server (the SDK's) whose ping tool records each call's ``_meta``."""
    server = McpTestServer("alpha")
    server.start()
    yield server
    server.stop()


async def test_a_query_calling_the_calculator_and_an_mcp_tool_carries_its_trace_to_the_mcp_server(
    receiver: Receiver, make_client: ClientFactory, alpha: McpTestServer
) -> None:
    client = await make_client(mcp_servers=[alpha.url], tool_timeout_s=10)
    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    async with client.post(
        "/agent/stream",
        json={"message": 'Work it out [emu:tool=calculator,ping] [emu:tool_input={"expression": "17*3"}]'},
        headers={"traceparent": f"00-{trace_id}-{parent_id}-01"},
    ) as response:
        events = [event["data"] async for event in sse_events(response)]
    done = events[-1]
    assert done["type"] == "done" and {c["tool"] for c in done["tool_calls"]} == {"calculator", "ping"}

    spans = await receiver.wait_for(
        lambda spans: (ours := trace_of(spans, trace_id)) and len(ours) == 6 and ours
    )
    (server,) = [span for span in spans if span.kind == SERVER]
    assert server.parent_id == parent_id
    (agent,) = children(spans, server)
    steps = children(spans, agent)
    model = services_of(client).emulator.records()[-1].model_id
    assert [s.name for s in steps] == [
        f"chat {model}",
        "execute_tool calculator",
        "execute_tool ping",
        f"chat {model}",
    ] or [s.name for s in steps] == [
        f"chat {model}",
        "execute_tool ping",
        "execute_tool calculator",
        f"chat {model}",
    ]
    tools = {s.attributes["gen_ai.tool.name"]: s for s in steps if s.name.startswith("execute_tool")}
    calls = {call["tool"]: call for call in done["tool_calls"]}
    for name, span in tools.items():
        assert span.attributes["gen_ai.tool.call.id"] == calls[name]["tool_use_id"] and span.status != ERROR
    usage = {
        k: sum(s.attributes[f"gen_ai.usage.{k}"] for s in steps if s.name.startswith("chat"))
        for k in ("input_tokens", "output_tokens")
    }
    assert usage == {k: done["usage"][k] for k in usage}
    assert agent.attributes["gen_ai.usage.output_tokens"] == done["usage"]["output_tokens"]
    # The MCP server was asked with the ping call's own span as the parent, in the request's _meta.
    (meta,) = alpha.metas
    assert meta["traceparent"].split("-")[:3] == ["00", trace_id, tools["ping"].span_id]
    # And the model was asked, each turn, with its chat span's.
    asked = [r for r in services_of(client).emulator.records() if r.user_text.startswith("Work it out")]
    chats = [s for s in steps if s.name.startswith("chat")]
    assert [r.traceparent.split("-")[1:3] for r in asked] == [[trace_id, c.span_id] for c in chats]


async def test_message_content_is_on_the_spans_only_when_asked_for(
    receiver: Receiver, make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    client = await make_client()
    events = await stream_agent(client, "What is 17 * 3?")
    assert events[-1]["type"] == "done"
    (agent,) = await receiver.wait_for(lambda spans: receiver.named("invoke_agent default"))
    first, tool, second = await receiver.wait_for(
        lambda spans: len(steps := children(spans, agent)) == 3 and steps
    )
    assert json.loads(first.attributes["gen_ai.input.messages"]) == [
        {"role": "user", "parts": [{"type": "text", "content": "What is 17 * 3?"}]}
    ]
    assert json.loads(first.attributes["gen_ai.system_instructions"])[0]["type"] == "text"
    (call,) = events[-1]["tool_calls"]
    (output,) = json.loads(first.attributes["gen_ai.output.messages"])
    assert output["role"] == "assistant" and output["finish_reason"] == "tool_use"
    assert output["parts"][-1] == {
        "type": "tool_call",
        "id": call["tool_use_id"],
        "name": "calculator",
        "arguments": call["input"],
    }
    assert json.loads(tool.attributes["gen_ai.tool.call.arguments"]) == call["input"]
    assert tool.attributes["gen_ai.tool.call.result"] == "51"
    # The second turn was asked with the call and its result: the result as the tool's message.
    asked = json.loads(second.attributes["gen_ai.input.messages"])
    assert [m["role"] for m in asked] == ["user", "assistant", "tool"]
    assert asked[2]["parts"] == [{"type": "tool_call_response", "id": call["tool_use_id"], "response": "51"}]
    (answer,) = json.loads(second.attributes["gen_ai.output.messages"])
    text = "".join(event["text"] for event in events if event["type"] == "text_delta")
    assert answer["parts"] == [{"type": "text", "content": text}] and "51" in text
