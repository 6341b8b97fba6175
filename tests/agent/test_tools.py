"""Tests for the tool executor and the built-in calculator."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

import pytest

from service.agent.tools import (
    Calculator,
    CalculatorError,
    FunctionTool,
    Tool,
    ToolExecutor,
    ToolOutcome,
    builtin_tools,
    evaluate,
    format_number,
)

OBJECT_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}


def make_tool(name: str, func: Any) -> FunctionTool:
    """A FunctionTool with a throwaway description and an empty object schema."""
    return FunctionTool(name, f"the {name} tool", OBJECT_SCHEMA, func)


def calc(expression: str) -> str:
    """Evaluate and format, as the calculator tool does."""
    return format_number(evaluate(expression))


# ---------------------------------------------------------------------------------------------
# Calculator: what it computes
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("1 + 2 * 3", "7"),
        ("(1 + 2) * 3", "9"),
        ("2 * 3 ** 2", "18"),
        ("-3 ** 2", "-9"),
        ("10 - 4 - 3", "3"),
        ("2 ** 3 ** 2", "512"),
        ("7 / 2", "3.5"),
        ("7 // 2", "3"),
        ("-7 // 2", "-4"),
        ("7 % 3", "1"),
        ("+5", "5"),
        ("sqrt(144)", "12"),
        ("2**0.5", "1.4142135623730951"),
        ("factorial(5)", "120"),
        ("2^10", "1024"),
        ("2 ^ 3 ^ 2", "512"),
        ("6 × 7", "42"),
        ("9 ÷ 2", "4.5"),
        ("2**-2", "0.25"),
        ("0.1 + 0.2", "0.30000000000000004"),
        ("pi", "3.141592653589793"),
        ("tau / 2", "3.141592653589793"),
        ("log(e)", "1"),
        ("log(8, 2)", "3"),
        ("log10(1000)", "3"),
        ("atan2(1, 1) * 4", "3.141592653589793"),
        ("degrees(pi)", "180"),
        ("floor(-2.5)", "-3"),
        ("ceil(2.1)", "3"),
        ("abs(-4)", "4"),
        ("round(2.567, 2)", "2.57"),
        ("round(2.5)", "2"),
        ("pow(2, 10)", "1024"),
        ("hypot(3, 4)", "5"),
        ("gcd(12, 18)", "6"),
        ("lcm(4, 6)", "12"),
        ("comb(10, 3)", "120"),
        ("perm(5, 2)", "20"),
        ("trunc(-2.7)", "-2"),
        ("min(3, 1, 2)", "1"),
        ("max(3, 1, 2.5)", "3"),
        ("cbrt(-8)", "-2"),
        ("factorial(sqrt(25))", "120"),
        ("1e15", "1000000000000000.0"),
        ("1e14", "100000000000000"),
        ("2**100", "1267650600228229401496703205376"),
        ("  1 + 1  ", "2"),
    ],
)
def test_calculator_computes(expression: str, expected: str) -> None:
    assert calc(expression) == expected


def test_calculator_allows_integers_up_to_the_limit() -> None:
    assert evaluate("2**9999") == 2**9999
    assert evaluate("(2**9999 - 1) * 2 + 1") == 2**10000 - 1


def test_calculator_result_types() -> None:
    assert isinstance(evaluate("6 * 7"), int)
    assert isinstance(evaluate("sqrt(144)"), float)


# ---------------------------------------------------------------------------------------------
# Calculator: what it refuses
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        # Running code.
        ("__import__('os')", "unknown name '__import__'"),
        ("open('x')", "unknown name 'open'"),
        ("().__class__", "unsupported expression: attribute access"),
        ("math.sqrt(2)", "unsupported expression: only named functions can be called"),
        ("(1).real", "unsupported expression: attribute access"),
        ("x[0]", "unsupported expression: subscript"),
        ("lambda: 1", "unsupported expression: lambda"),
        ("[x for x in (1, 2)]", "unsupported expression: comprehension"),
        ("sqrt(x=4)", "unsupported expression: keyword arguments"),
        ("max(*(1, 2))", "unsupported expression: starred argument"),
        ("1 < 2", "unsupported expression: comparison"),
        ("1 and 2", "unsupported expression: boolean operator"),
        ("1 if 1 else 2", "unsupported expression: conditional expression"),
        ("(1, 2)", "unsupported expression: tuple"),
        ("(y := 2)", "unsupported expression: assignment"),
        ("x", "unknown name 'x'"),
        ("sqrt", "'sqrt' is a function"),
        ("import os", "invalid expression"),
        ("1 +", "invalid expression"),
        ("", "empty expression"),
        ("   ", "empty expression"),
        ("1\0", "invalid expression"),
        # Values that are not numbers.
        ("'abc'", "only numbers allowed"),
        ("'a' * 10**9", "only numbers allowed"),
        ("b'x'", "only numbers allowed"),
        ("1j", "only numbers allowed"),
        ("True + 1", "booleans are not numbers"),
        ("None", "only numbers allowed"),
        ("(-8) ** (1/3)", "not a real number"),
        # Operators that are not arithmetic.
        ("1 << 5", "unsupported operator '<<'"),
        ("256 >> 2", "unsupported operator '>>'"),
        ("6 & 3", "unsupported operator '&'"),
        ("6 | 3", "unsupported operator '|'"),
        ("~1", "unsupported operator '~'"),
        ("not 1", "unsupported operator 'not'"),
        # Arithmetic errors.
        ("1 / 0", "division by zero"),
        ("1 // 0", "division by zero"),
        ("1 % 0", "division by zero"),
        ("1.5 / 0.0", "division by zero"),
        ("0 ** -1", "division by zero"),
        ("sqrt(-1)", "math domain error"),
        ("log(0)", "math domain error"),
        ("acos(2)", "math domain error"),
        ("exp(1000)", "numeric overflow"),
        ("1e308 * 10", "numeric overflow"),
        ("10.0 ** 400", "numeric overflow"),
        ("10**400 / 3", "numeric overflow"),
        ("hypot(10**400, 1)", "numeric overflow"),
        ("1e999", "number too large"),
        # Expensive work, refused before it starts.
        ("9**9**9", "integer result too large (limit is 10000 bits)"),
        ("10**10**10", "integer result too large (limit is 10000 bits)"),
        ("2**10000", "integer result too large (limit is 10000 bits)"),
        ("pow(7, 10**6)", "integer result too large (limit is 10000 bits)"),
        ("(2**9999) * (2**9999)", "integer result too large (limit is 10000 bits)"),
        ("factorial(100000)", "factorial() needs an integer from 0 to 1000"),
        ("factorial(1001)", "factorial() needs an integer from 0 to 1000"),
        ("factorial(-1)", "factorial() needs an integer from 0 to 1000"),
        ("factorial(2.5)", "factorial() needs integer arguments"),
        ("comb(100000, 50000)", "comb() arguments must be at most 10000"),
        ("perm(100000)", "perm() arguments must be at most 10000"),
        ("perm(10000)", "integer result too large"),
        ("round(1.5, 0.5)", "round() needs integer arguments"),
        # Wrong arity.
        ("sqrt(1, 2)", "sqrt() takes 1 argument (2 given)"),
        ("log()", "log() takes 1 or 2 arguments (0 given)"),
        ("atan2(1)", "atan2() takes 2 arguments (1 given)"),
        ("max()", "max() takes at least 1 arguments (0 given)"),
        # Size limits.
        ("1" + " + 1" * 200, "expression too complex"),
        ("-" * 60 + "1", "expression nested too deeply"),
        ("sqrt(" * 60 + "1" + ")" * 60, "expression nested too deeply"),
        ("(" * 300 + "1" + ")" * 300, "invalid expression"),
        ("1" * 1001, "expression too long: 1001 characters (limit is 1000)"),
        ("'" + "a" * 5000 + "'", "expression too long"),
    ],
)
def test_calculator_refuses(expression: str, message: str) -> None:
    with pytest.raises(CalculatorError) as caught:
        evaluate(expression)
    assert message in str(caught.value)


def test_calculator_refuses_non_strings() -> None:
    with pytest.raises(CalculatorError, match="expression must be a string"):
        evaluate(12)  # type: ignore[arg-type]


def test_calculator_error_is_a_value_error() -> None:
    assert issubclass(CalculatorError, ValueError)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (12, "12"),
        (12.0, "12"),
        (-0.0, "0"),
        (1.5, "1.5"),
        (1e15, "1000000000000000.0"),
        (999999999999999.0, "999999999999999"),
        (2**0.5, "1.4142135623730951"),
    ],
)
def test_format_number(value: float, expected: str) -> None:
    assert format_number(value) == expected


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_format_number_refuses_non_finite(value: float) -> None:
    with pytest.raises(ValueError, match="not a finite number"):
        format_number(value)


def test_calculator_tool_description() -> None:
    tools = builtin_tools()
    assert len(tools) == 1 and isinstance(tools[0], Calculator)
    calculator = tools[0]
    assert calculator.name == "calculator"
    schema = calculator.input_schema
    assert schema["type"] == "object"
    assert schema["required"] == ["expression"]
    assert schema["properties"]["expression"]["type"] == "string"
    assert "sqrt" in schema["properties"]["expression"]["description"]


async def test_calculator_through_the_executor() -> None:
    executor = ToolExecutor(builtin_tools())
    outcome = await executor.run("calculator", "tu_1", {"expression": "sqrt(144)"})
    assert outcome == ToolOutcome(
        tool="calculator",
        tool_use_id="tu_1",
        input={"expression": "sqrt(144)"},
        result="12",
        is_error=False,
        duration_ms=outcome.duration_ms,
    )
    assert outcome.duration_ms >= 0


async def test_calculator_errors_become_error_outcomes() -> None:
    executor = ToolExecutor(builtin_tools())
    outcome = await executor.run("calculator", "tu_1", {"expression": "9**9**9"})
    assert outcome.is_error
    assert outcome.result == (
        "Tool 'calculator' failed: CalculatorError: integer result too large (limit is 10000 bits)"
    )


@pytest.mark.parametrize("tool_input", [{}, {"expression": 12}, {"expr": "1+1"}])
async def test_calculator_needs_an_expression_string(tool_input: dict[str, Any]) -> None:
    outcome = await ToolExecutor(builtin_tools()).run("calculator", "tu_1", tool_input)
    assert outcome.is_error
    assert outcome.result == ("Tool 'calculator' failed: CalculatorError: input needs an 'expression' string")


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
