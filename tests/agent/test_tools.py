"""Tests for the tool executor: registration, one call, a batch, and output truncation."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import pytest

from service.agent.calculator import Calculator, builtin_tools
from service.agent.tools import DEFAULT_MAX_RESULT_CHARS, FunctionTool, Tool, ToolExecutor, ToolOutcome

OBJECT_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}


def make_tool(name: str, func: Any) -> FunctionTool:
    """A FunctionTool with a throwaway description and an empty object schema."""
    return FunctionTool(name, f"the {name} tool", OBJECT_SCHEMA, func)


# ---------------------------------------------------------------------------------------------
# Executor: registration and descriptions
# ---------------------------------------------------------------------------------------------


def test_duplicate_registration_is_refused() -> None:
    executor = ToolExecutor([Calculator()])
    with pytest.raises(ValueError, match="already registered"):
        executor.register(Calculator())
    with pytest.raises(ValueError, match="already registered"):
        ToolExecutor([Calculator(), Calculator()])


@pytest.mark.parametrize("name", ["", "has space", "dotted.name", "x" * 65])
def test_invalid_tool_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="invalid tool name"):
        ToolExecutor().register(make_tool(name, lambda _input: "ok"))


def test_invalid_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="timeout"):
        ToolExecutor(timeout=0)
    with pytest.raises(ValueError, match="max_result_chars"):
        ToolExecutor(max_result_chars=0)


def test_tool_is_abstract() -> None:
    with pytest.raises(TypeError):
        Tool()  # type: ignore[abstract]


def test_names_and_specs() -> None:
    echo = make_tool("echo", lambda tool_input: str(tool_input))
    executor = ToolExecutor([Calculator()])
    executor.register(echo)
    assert executor.names == ["calculator", "echo"]
    assert executor.specs() == [
        {
            "name": "calculator",
            "description": Calculator.description,
            "input_schema": Calculator.input_schema,
        },
        {"name": "echo", "description": "the echo tool", "input_schema": OBJECT_SCHEMA},
    ]


def test_bedrock_tool_config() -> None:
    assert ToolExecutor().bedrock_tool_config() is None
    config = ToolExecutor([Calculator()]).bedrock_tool_config()
    assert config == {
        "tools": [
            {
                "toolSpec": {
                    "name": "calculator",
                    "description": Calculator.description,
                    "inputSchema": {"json": Calculator.input_schema},
                }
            }
        ]
    }


# ---------------------------------------------------------------------------------------------
# Executor: running one call
# ---------------------------------------------------------------------------------------------


async def test_unknown_tool() -> None:
    outcome = await ToolExecutor(builtin_tools()).run("x", "tu_1", {})
    assert outcome.is_error
    assert outcome.result == "Unknown tool 'x'. Available tools: calculator"
    assert (outcome.tool, outcome.tool_use_id, outcome.input) == ("x", "tu_1", {})


async def test_unknown_tool_without_tools() -> None:
    outcome = await ToolExecutor().run("x", "tu_1", {})
    assert outcome.result == "Unknown tool 'x'. Available tools: (none)"


@pytest.mark.parametrize(
    ("tool_input", "got"),
    [([1, 2], "an array"), ("1+1", "a string"), (3, "a number"), (None, "null")],
)
async def test_input_must_be_an_object(tool_input: Any, got: str) -> None:
    outcome = await ToolExecutor(builtin_tools()).run("calculator", "tu_1", tool_input)
    assert outcome.is_error
    assert outcome.result == f"Tool 'calculator' input must be a JSON object, got {got}"
    assert outcome.input == tool_input


async def test_raising_tool() -> None:
    def boom(_input: dict[str, Any]) -> str:
        raise RuntimeError("kaput")

    async def aboom(_input: dict[str, Any]) -> str:
        raise KeyError("missing")

    async def silent(_input: dict[str, Any]) -> str:
        raise RuntimeError()

    executor = ToolExecutor([make_tool("boom", boom), make_tool("aboom", aboom)])
    executor.register(make_tool("silent", silent))
    outcome = await executor.run("boom", "tu_1", {})
    assert outcome.is_error
    assert outcome.result == "Tool 'boom' failed: RuntimeError: kaput"
    assert (await executor.run("aboom", "tu_2", {})).result == ("Tool 'aboom' failed: KeyError: 'missing'")
    assert (await executor.run("silent", "tu_3", {})).result == "Tool 'silent' failed: RuntimeError"


async def test_a_tools_own_timeout_error_is_a_failure_not_a_timeout() -> None:
    async def own_timeout(_input: dict[str, Any]) -> str:
        raise TimeoutError("upstream took too long")

    outcome = await ToolExecutor([make_tool("t", own_timeout)]).run("t", "tu_1", {})
    assert outcome.result == "Tool 't' failed: TimeoutError: upstream took too long"


async def test_function_tools_sync_and_async_and_numbers() -> None:
    seen_threads: list[int] = []

    def sync_tool(tool_input: dict[str, Any]) -> float:
        seen_threads.append(threading.get_ident())
        return tool_input["x"] * 2.0

    async def async_tool(tool_input: dict[str, Any]) -> str:
        return f"hello {tool_input['name']}"

    async def async_number(_input: dict[str, Any]) -> float:
        return 2**0.5

    executor = ToolExecutor(
        [
            make_tool("double", sync_tool),
            make_tool("greet", async_tool),
            make_tool("root", async_number),
            make_tool("coro", lambda _input: async_tool({"name": "lambda"})),
        ]
    )
    double = await executor.run("double", "tu_1", {"x": 6})
    assert (double.result, double.is_error) == ("12", False)
    # Sync tools must not block the event loop's thread.
    assert seen_threads and seen_threads[0] != threading.get_ident()
    assert (await executor.run("greet", "tu_2", {"name": "ada"})).result == "hello ada"
    assert (await executor.run("root", "tu_3", {})).result == "1.4142135623730951"
    assert (await executor.run("coro", "tu_4", {})).result == "hello lambda"


@pytest.mark.parametrize(("value", "type_name"), [(None, "NoneType"), (True, "bool"), ([1], "list")])
async def test_function_tool_results_must_be_text_or_numbers(value: Any, type_name: str) -> None:
    outcome = await ToolExecutor([make_tool("odd", lambda _input: value)]).run("odd", "tu_1", {})
    assert outcome.is_error
    assert outcome.result == (
        f"Tool 'odd' failed: TypeError: tool returned {type_name}, expected a string or a number"
    )


async def test_custom_tool_must_return_a_string() -> None:
    class Bad(Tool):
        name = "bad"
        description = "returns a number from call()"
        input_schema = OBJECT_SCHEMA

        async def call(self, input: dict[str, Any]) -> str:
            return 42  # type: ignore[return-value]

    outcome = await ToolExecutor([Bad()]).run("bad", "tu_1", {})
    assert outcome.is_error
    assert outcome.result == "Tool 'bad' failed: TypeError: returned int, expected a string"


async def test_async_tool_timing_out_is_cancelled() -> None:
    cancelled = asyncio.Event()

    async def hang(_input: dict[str, Any]) -> str:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    executor = ToolExecutor([make_tool("hang", hang)], timeout=0.05)
    outcome = await executor.run("hang", "tu_1", {})
    assert outcome.is_error
    assert outcome.result == "Tool 'hang' timed out after 0.05 s"
    assert cancelled.is_set()


async def test_async_tool_turning_the_timeout_into_another_error_still_times_out() -> None:
    async def hang(_input: dict[str, Any]) -> str:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise RuntimeError("interrupted") from None
        return "never"

    outcome = await ToolExecutor([make_tool("hang", hang)], timeout=0.05).run("hang", "tu_1", {})
    assert outcome.result == "Tool 'hang' timed out after 0.05 s"


async def test_sync_tool_timing_out_returns_on_time() -> None:
    release = threading.Event()
    finished = threading.Event()

    def block(_input: dict[str, Any]) -> str:
        try:
            release.wait()
            return "late"
        finally:
            finished.set()

    executor = ToolExecutor([make_tool("block", block)], timeout=0.05)
    try:
        outcome = await executor.run("block", "tu_1", {})
    finally:
        # The thread cannot be killed; let it end so no worker outlives the test.
        release.set()
    assert outcome.is_error
    assert outcome.result == "Tool 'block' timed out after 0.05 s"
    assert await asyncio.to_thread(finished.wait, 10)


async def test_result_truncation() -> None:
    executor = ToolExecutor(
        [make_tool("big", lambda _input: "x" * 25), make_tool("fits", lambda _input: "y" * 10)],
        max_result_chars=10,
    )
    big = await executor.run("big", "tu_1", {})
    assert not big.is_error
    assert big.result.startswith("x" * 10)
    assert "x" * 11 not in big.result
    assert big.result.endswith("[truncated: 15 of 25 characters omitted]")
    assert (await executor.run("fits", "tu_2", {})).result == "y" * 10


async def test_long_error_messages_are_truncated_too() -> None:
    def boom(_input: dict[str, Any]) -> str:
        raise ValueError("z" * 1000)

    outcome = await ToolExecutor([make_tool("boom", boom)], max_result_chars=50).run("boom", "tu_1", {})
    assert outcome.is_error
    assert "truncated" in outcome.result
    assert len(outcome.result) < 120


async def test_cancelling_run_propagates_and_cancels_the_tool() -> None:
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def hang(_input: dict[str, Any]) -> str:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    task = asyncio.create_task(ToolExecutor([make_tool("hang", hang)]).run("hang", "tu_1", {}))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cancelled.is_set()


async def test_cancellation_wins_over_a_tool_that_swallows_it() -> None:
    started = asyncio.Event()

    async def stubborn(_input: dict[str, Any]) -> str:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise RuntimeError("not stopping") from None
        return "never"

    task = asyncio.create_task(ToolExecutor([make_tool("stubborn", stubborn)]).run("stubborn", "tu_1", {}))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


# ---------------------------------------------------------------------------------------------
# Executor: running a batch
# ---------------------------------------------------------------------------------------------


async def test_run_all_runs_tools_concurrently() -> None:
    a_started, b_started = asyncio.Event(), asyncio.Event()

    def waits_for(mine: asyncio.Event, other: asyncio.Event, result: str) -> Any:
        async def tool(_input: dict[str, Any]) -> str:
            mine.set()
            # Run one after the other, this would never return: the executor's timeout reports it.
            await other.wait()
            return result

        return tool

    executor = ToolExecutor(
        [
            make_tool("a", waits_for(a_started, b_started, "A")),
            make_tool("b", waits_for(b_started, a_started, "B")),
        ],
        timeout=10,
    )
    outcomes = [o async for o in executor.run_all([("a", "tu_a", {}), ("b", "tu_b", {})])]
    assert sorted((o.tool_use_id, o.result, o.is_error) for o in outcomes) == [
        ("tu_a", "A", False),
        ("tu_b", "B", False),
    ]


async def test_run_all_runs_sync_tools_concurrently() -> None:
    a_started, b_started = threading.Event(), threading.Event()

    def waits_for(mine: threading.Event, other: threading.Event) -> Any:
        def tool(_input: dict[str, Any]) -> str:
            mine.set()
            return "met" if other.wait(10) else "alone"

        return tool

    executor = ToolExecutor(
        [
            make_tool("a", waits_for(a_started, b_started)),
            make_tool("b", waits_for(b_started, a_started)),
        ]
    )
    outcomes = [o async for o in executor.run_all([("a", "tu_a", {}), ("b", "tu_b", {})])]
    assert [o.result for o in outcomes] == ["met", "met"]


async def test_run_all_yields_in_completion_order() -> None:
    gate = asyncio.Event()

    async def slow(_input: dict[str, Any]) -> str:
        await gate.wait()
        return "slow"

    async def fast(_input: dict[str, Any]) -> str:
        return "fast"

    executor = ToolExecutor([make_tool("slow", slow), make_tool("fast", fast)])
    seen: list[str] = []
    async for outcome in executor.run_all([("slow", "tu_1", {}), ("fast", "tu_2", {})]):
        seen.append(outcome.result)
        gate.set()
    assert seen == ["fast", "slow"]


async def test_run_all_reports_every_kind_of_outcome() -> None:
    executor = ToolExecutor(builtin_tools())
    calls = [
        ("calculator", "tu_1", {"expression": "1+1"}),
        ("nope", "tu_2", {}),
        ("calculator", "tu_3", "1+1"),
        ("calculator", "tu_4", {"expression": "1/0"}),
    ]
    outcomes = {o.tool_use_id: o async for o in executor.run_all(calls)}
    assert outcomes["tu_1"].result == "2" and not outcomes["tu_1"].is_error
    assert all(outcomes[i].is_error for i in ("tu_2", "tu_3", "tu_4"))
    assert outcomes["tu_4"].result == "Tool 'calculator' failed: CalculatorError: division by zero"


async def test_run_all_with_no_calls() -> None:
    assert [o async for o in ToolExecutor().run_all([])] == []


def hanging_tools(started: list[asyncio.Event], cancelled: list[asyncio.Event]) -> ToolExecutor:
    """An executor whose tools ``h0``, ``h1``, ... wait forever, recording start and cancel."""

    def make(index: int) -> FunctionTool:
        async def hang(_input: dict[str, Any]) -> str:
            started[index].set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled[index].set()
                raise
            return "never"

        return make_tool(f"h{index}", hang)

    return ToolExecutor([make(i) for i in range(len(started))])


async def test_cancelling_run_all_cancels_the_tools() -> None:
    started = [asyncio.Event(), asyncio.Event()]
    cancelled = [asyncio.Event(), asyncio.Event()]
    executor = hanging_tools(started, cancelled)

    async def consume() -> list[ToolOutcome]:
        return [o async for o in executor.run_all([("h0", "tu_0", {}), ("h1", "tu_1", {})])]

    consumer = asyncio.create_task(consume())
    for event in started:
        await event.wait()
    consumer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await consumer
    # The generator awaited the tools before the consumer finished, so both have seen it.
    assert all(event.is_set() for event in cancelled)


async def test_stopping_run_all_early_cancels_the_rest() -> None:
    started = [asyncio.Event()]
    cancelled = [asyncio.Event()]
    executor = hanging_tools(started, cancelled)
    executor.register(make_tool("quick", lambda _input: "done"))

    async with contextlib.aclosing(executor.run_all([("h0", "tu_0", {}), ("quick", "tu_1", {})])) as outcomes:
        async for outcome in outcomes:
            assert outcome.result == "done"
            await started[0].wait()
            break
    assert cancelled[0].is_set()


# ---------------------------------------------------------------------------------------------
# Output truncation, for every kind of tool
# ---------------------------------------------------------------------------------------------


class RemoteTool(Tool):
    """Stands for an MCP or AWS tool: a Tool subclass, offered through a ToolSource."""

    name = "remote"
    description = "returns a long text"
    input_schema = OBJECT_SCHEMA

    async def call(self, input: dict[str, Any]) -> str:
        return "r" * 30


class Source:
    def __init__(self, tools: Iterable[Tool]) -> None:
        self._tools = list(tools)

    def tools(self) -> Sequence[Tool]:
        return self._tools


async def test_every_tools_output_is_truncated() -> None:
    async def long_async(_input: dict[str, Any]) -> str:
        return "a" * 30

    def long_error(_input: dict[str, Any]) -> str:
        raise RuntimeError("e" * 30)

    executor = ToolExecutor(
        [
            FunctionTool("sync", "", OBJECT_SCHEMA, lambda _input: "s" * 30),
            FunctionTool("async", "", OBJECT_SCHEMA, long_async),
            FunctionTool("fails", "", OBJECT_SCHEMA, long_error),
            FunctionTool("number", "", OBJECT_SCHEMA, lambda _input: 10**25),
        ],
        max_result_chars=20,
    )
    executor.add_source(Source([RemoteTool()]))
    for name, first in [("sync", "s" * 20), ("async", "a" * 20), ("remote", "r" * 20)]:
        outcome = await executor.run(name, "tu", {})
        assert outcome.result == first + "\n[truncated: 10 of 30 characters omitted]"
        assert not outcome.is_error
    failed = await executor.run("fails", "tu", {})
    assert failed.is_error  # "Tool 'fails' failed: RuntimeError: eee...", 65 characters
    assert failed.result == "Tool 'fails' failed:\n[truncated: 45 of 65 characters omitted]"
    number = await executor.run("number", "tu", {})
    assert number.result == "1" + "0" * 19 + "\n[truncated: 6 of 26 characters omitted]"


async def test_output_at_the_limit_is_whole() -> None:
    executor = ToolExecutor(
        [FunctionTool("fits", "", OBJECT_SCHEMA, lambda _input: "x" * 20)], max_result_chars=20
    )
    assert (await executor.run("fits", "tu", {})).result == "x" * 20


def test_default_output_limit() -> None:
    assert ToolExecutor().max_result_chars == DEFAULT_MAX_RESULT_CHARS == 20_000
