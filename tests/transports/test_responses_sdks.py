"""``/v1/responses`` driven by the Python SDKs, unmodified, on a real port with the embedded
emulator: the OpenAI Agents SDK (PyPI ``openai-agents``: ``Runner.run_streamed`` with a function
tool of its own, on its ``OpenAIResponsesModel``), and the ``openai`` package's own types, held
strictly to every event and response (its client only constructs them, so a shape it would
refuse passes unseen there).

The emulator echoes a tool's result into its answer, so a result only the client's tool could know
(a fresh token) found in the final answer went through the model.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import openai
import pytest
from agents import Agent, Runner, function_tool, set_tracing_disabled
from agents.models.openai_responses import OpenAIResponsesModel
from aiohttp.test_utils import TestClient
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from tests.conftest import ClientFactory, sse_blocks
from tests.transports.test_openai_chat import (  # noqa: F401 - the fixture closes the clients
    _close_openai_clients,
    openai_client,
)

ASK_WEATHER = 'What is the weather in Paris? [emu:tool=get_weather] [emu:tool_input={"city": "Paris"}]'
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
STREAM_EVENT: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)


@pytest.fixture(autouse=True)
def _no_tracing() -> None:
    """Nothing of the Agents SDK's goes to OpenAI (its tracing exporter would)."""
    set_tracing_disabled(True)


async def responses_model(client: TestClient) -> tuple[openai.AsyncOpenAI, OpenAIResponsesModel]:
    """The Agents SDK's Responses model on the service, named as ``GET /v1/models`` lists it."""
    api = openai_client(client)
    model_id = (await api.models.list()).data[0].id
    return api, OpenAIResponsesModel(model=model_id, openai_client=api)


async def logged(client: TestClient, session_id: str) -> list[dict[str, Any]]:
    """The session's events as the service logged them (its native poll)."""
    reply = await client.get(f"/sessions/{session_id}/events/poll?since_index=0")
    assert reply.status == 200, await reply.text()
    events: list[dict[str, Any]] = (await reply.json())["events"]
    return events


async def conversation(client: TestClient, session_id: str) -> list[dict[str, Any]]:
    """The session's stored conversation."""
    reply = await client.get(f"/sessions/{session_id}")
    assert reply.status == 200, await reply.text()
    messages: list[dict[str, Any]] = (await reply.json())["messages"]
    return messages


def tool_results(messages: list[dict[str, Any]]) -> list[str]:
    return [
        part["text"]
        for message in messages
        for block in message["content"]
        if "toolResult" in block
        for part in block["toolResult"]["content"]
    ]


# --- the OpenAI Agents SDK --------------------------------------------------------------------


@pytest.mark.parametrize("chained", [False, True], ids=["whole-history", "previous-response-id"])
async def test_the_agents_sdk_runs_its_function_tool_and_the_model_reads_the_result(
    client: TestClient, chained: bool
) -> None:
    forecast = f"hail-{uuid.uuid4().hex[:10]}"
    asked: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        asked.append(city)
        return f"{forecast} in {city}"

    api, model = await responses_model(client)
    agent = Agent(name="forecaster", instructions="Answer briefly.", tools=[get_weather], model=model)
    result = Runner.run_streamed(agent, ASK_WEATHER, auto_previous_response_id=chained)
    events = [event async for event in result.stream_events()]
    assert asked == ["Paris"]  # the tool ran here, in the test's process
    assert f"{forecast} in Paris" in result.final_output  # and the model was given what it said
    items = [event.name for event in events if event.type == "run_item_stream_event"]
    assert items == ["tool_called", "tool_output", "message_output_created"]
    raw = [event.data.type for event in events if event.type == "raw_response_event"]
    assert raw.count("response.created") == raw.count("response.completed") == 2
    assert "response.function_call_arguments.done" in raw and "response.output_text.delta" in raw
    first, second = result.raw_responses
    assert first.response_id and second.response_id
    answered = await api.responses.retrieve(second.response_id)
    # Continued by id, or sent the whole history again: the service got the tool's output either way.
    assert answered.previous_response_id == (first.response_id if chained else None)
    assert answered.instructions == "Answer briefly."
    session_id = answered.session_id  # type: ignore[attr-defined]
    assert tool_results(await conversation(client, session_id)) == [f"{forecast} in Paris"]


async def test_the_agents_sdk_streams_a_turn_without_tools(client: TestClient) -> None:
    api, model = await responses_model(client)
    agent = Agent(name="teller", instructions="Answer briefly.", model=model)
    result = Runner.run_streamed(agent, "Tell me something [emu:tokens=8]")
    events = [event async for event in result.stream_events()]
    assert events[0].type == "agent_updated_stream_event"
    raw = [event.data for event in events if event.type == "raw_response_event"]
    assert [event.type for event in raw][:2] == ["response.created", "response.in_progress"]
    assert raw[-1].type == "response.completed"
    deltas = [event.delta for event in raw if event.type == "response.output_text.delta"]  # type: ignore[union-attr]
    assert len(deltas) == 8
    assert "".join(deltas) == result.final_output
    assert [event.name for event in events if event.type == "run_item_stream_event"] == [
        "message_output_created"
    ]
    [response] = result.raw_responses
    assert response.response_id is not None
    stored = await api.responses.retrieve(response.response_id)
    log = await logged(client, stored.session_id)  # type: ignore[attr-defined]
    [done] = [event for event in log if event["type"] == "done"]
    assert done["output"] == result.final_output
    assert "".join(event["text"] for event in log if event["type"] == "assistant_text") == result.final_output
    assert result.context_wrapper.usage.total_tokens == done["usage"]["total_tokens"]


# --- the openai package's own types, strictly ---------------------------------------------------

SHAPES = {
    "text": "Hi [emu:tokens=3]",
    "reasoning": "Think first [emu:reasoning]",
    "own tool": "What is 17 * 3?",
    "own tool failing": 'Divide [emu:tool=calculator] [emu:tool_input={"expression": "1/0"}]',
    "function tool": ASK_WEATHER,
}


@pytest.mark.parametrize("prompt", SHAPES.values(), ids=SHAPES.keys())
async def test_every_event_and_response_is_valid_as_the_openai_package_types_it(
    client: TestClient, prompt: str
) -> None:
    api = openai_client(client)
    body = {
        "model": (await api.models.list()).data[0].id,
        "input": prompt,
        "tools": [WEATHER],
        "stream": True,
    }
    async with client.post("/v1/responses", json=body) as reply:
        blocks = [block async for block in sse_blocks(reply)]
    events = [STREAM_EVENT.validate_python(json.loads(block["data"])) for block in blocks]
    final = events[-1]
    assert final.type == "response.completed"
    polled = await client.get(f"/v1/responses/{final.response.id}")
    assert Response.model_validate(await polled.json()) == final.response
    if prompt == SHAPES["own tool failing"]:
        [call] = [item for item in final.response.output if item.type == "mcp_call"]
        assert call.status == "failed" and call.error is not None
        assert call.error.type == "mcp_tool_execution_error"


async def test_an_approval_request_is_valid_as_the_openai_package_types_it(
    make_client: ClientFactory,
) -> None:
    client = await make_client(tools_require_approval="calculator", approval_timeout_s=60)
    api = openai_client(client)
    model = (await api.models.list()).data[0].id
    started = await api.responses.create(model=model, input="What is 17 * 3?", background=True)
    waiting = await client.get(f"/v1/responses/{started.id}")
    while not any(item["type"] == "mcp_approval_request" for item in (await waiting.json())["output"]):
        waiting = await client.get(f"/v1/responses/{started.id}")
    response = Response.model_validate(await waiting.json())
    assert response.status == "in_progress"
    [request] = [item for item in response.output if item.type == "mcp_approval_request"]
    assert request.name == "calculator" and json.loads(request.arguments) == {"expression": "17 * 3"}
    await api.responses.cancel(started.id)
