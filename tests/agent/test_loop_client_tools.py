"""The agent loop with a client's tools (:class:`~service.core.options.RunOptions`): offered beside
its own, a call to one ends the query unrun, and a query may resume from the client's results.

The provider here is a script of turns: what the loop asks for (the request) and what it does
with the answer are what is under test, not a model's wire.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from service.agent.loop import AgentLoop
from service.agent.tools import FunctionTool, ToolExecutor
from service.core.conversation import for_model
from service.core.events import Event, RunDone, ToolExecuting, ToolResult, Usage
from service.core.options import RunOptions
from service.providers.base import ModelRequest, PendingToolUse, TurnResult

SCHEMA = {"type": "object", "properties": {}}
WEATHER = {"name": "get_weather", "description": "", "input_schema": SCHEMA}


class ScriptedProvider:
    """Answers each turn with the next scripted result and remembers the requests."""

    name = "scripted"

    def __init__(self, *results: TurnResult) -> None:
        self.results = list(results)
        self.requests: list[ModelRequest] = []

    async def stream(self, request: ModelRequest, turn: int = 1) -> AsyncGenerator[Event | TurnResult, None]:
        self.requests.append(
            ModelRequest(list(request.messages), request.system, request.tool_specs, request.max_tokens)
        )
        yield self.results.pop(0)

    async def close(self) -> None:
        pass


def tool_turn(*uses: tuple[str, str]) -> TurnResult:
    blocks = [{"toolUse": {"toolUseId": use_id, "name": name, "input": {}}} for name, use_id in uses]
    return TurnResult(
        message={"role": "assistant", "content": [{"text": "Checking."}, *blocks]},
        stop_reason="tool_use",
        usage=Usage(input_tokens=1, output_tokens=1, total_tokens=2),
        latency_ms=None,
        tool_uses=[PendingToolUse(name, use_id, {}) for name, use_id in uses],
        text="Checking.",
    )


def text_turn(text: str) -> TurnResult:
    return TurnResult(
        message={"role": "assistant", "content": [{"text": text}]},
        stop_reason="end_turn",
        usage=Usage(input_tokens=1, output_tokens=1, total_tokens=2),
        latency_ms=None,
        tool_uses=[],
        text=text,
    )


def loop(provider: ScriptedProvider, ran: list[str]) -> AgentLoop:
    def ping(_: dict[str, Any]) -> str:
        ran.append("ping")
        return "pong"

    tools = ToolExecutor(
        [FunctionTool("ping", "Pings.", SCHEMA, ping), FunctionTool("get_weather", "Own.", SCHEMA, ping)]
    )
    return AgentLoop(provider, tools, system_prompt="Service rules.", max_tokens=100)


async def run(
    agent: AgentLoop, messages: list[dict[str, Any]], text: str, options: RunOptions
) -> list[Event]:
    return [event async for event in agent.run(messages, text, 5, options)]


async def test_a_turn_calling_a_client_tool_ends_the_query_unrun() -> None:
    provider = ScriptedProvider(tool_turn(("ping", "t1"), ("get_weather", "t2")))
    ran: list[str] = []
    messages: list[dict[str, Any]] = []
    options = RunOptions(client_tools=(WEATHER,), system="Client rules.", max_tokens=40)
    events = await run(loop(provider, ran), messages, "weather?", options)
    done = events[-1]
    assert isinstance(done, RunDone) and done.stop_reason == "tool_use" and done.turns == 1
    assert ran == []  # neither the client's tool nor the own one of that turn ran
    assert not [e for e in events if isinstance(e, ToolExecuting | ToolResult)]
    [request] = provider.requests
    assert request.system == "Service rules.\n\nClient rules."
    assert request.max_tokens == 40
    # The client's get_weather hides the service's own tool of that name.
    assert [spec["name"] for spec in request.tool_specs] == ["ping", "get_weather"]
    assert request.tool_specs[-1] is WEATHER
    # The conversation keeps the call the client answers next, not the own call left unrun.
    assert for_model(messages)[-1] == {
        "role": "assistant",
        "content": [
            {"text": "Checking."},
            {"toolUse": {"toolUseId": "t2", "name": "get_weather", "input": {}}},
        ],
    }


async def test_a_query_resumes_from_the_clients_results() -> None:
    provider = ScriptedProvider(text_turn("Sunny."))
    ran: list[str] = []
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"text": "weather?"}]},
        {
            "role": "assistant",
            "content": [{"toolUse": {"toolUseId": "t2", "name": "get_weather", "input": {}}}],
        },
        {"role": "user", "content": [{"toolResult": {"toolUseId": "t2", "content": [{"text": "sunny"}]}}]},
    ]
    events = await run(loop(provider, ran), messages, "", RunOptions(client_tools=(WEATHER,), resume=True))
    assert isinstance(events[-1], RunDone) and events[-1].output == "Sunny."
    assert provider.requests[0].messages[-1]["content"][0]["toolResult"]["toolUseId"] == "t2"  # no text added
    assert for_model(messages)[-1] == {"role": "assistant", "content": [{"text": "Sunny."}]}


async def test_without_client_tools_own_tools_run_as_before() -> None:
    provider = ScriptedProvider(tool_turn(("ping", "t1")), text_turn("Done."))
    ran: list[str] = []
    events = await run(loop(provider, ran), [], "ping it", RunOptions())
    assert ran == ["ping"]
    assert isinstance(events[-1], RunDone) and events[-1].stop_reason == "end_turn"
    assert provider.requests[0].system == "Service rules." and provider.requests[0].max_tokens == 100
