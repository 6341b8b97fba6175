"""Tests for the calculator tool: through the executor, in its worker processes, its settings.

The calculator's bounds on the syntax tree stop every costly expression before it is computed,
so the tests that prove the process guard (memory limit, time limit) relax those bounds through
:class:`CalculatorLimits`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from typing import Any

import pytest

from service.agent.arithmetic import CalculatorError, CalculatorLimits, calculate
from service.agent.calculator import Calculator, builtin_tools
from service.agent.tools import ToolExecutor, ToolOutcome
from service.sandbox import WorkerPool, WorkerPoolClosed, WorkerTimeout

# No bound on integer size: what the syntax-tree checks would refuse reaches the worker.
RELAXED = CalculatorLimits(max_int_bits=10**12)
# Takes minutes of CPU (and ~150 MB) when nothing refuses it first.
ENDLESS = "9**9**9"
# A 2**28-bit (32 MB) integer: past a 48 MB worker within a second, long before any time limit.
MEMORY_HOG = "2**(2**28)"


async def until(condition: Callable[[], bool], turns: int = 1000) -> None:
    """Let other tasks run (no sleeping) until ``condition`` holds."""
    for _ in range(turns):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


# ---------------------------------------------------------------------------------------------
# The tool
# ---------------------------------------------------------------------------------------------


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
# The process guard
# ---------------------------------------------------------------------------------------------


async def test_calculator_runs_in_a_worker_process(pools: Any) -> None:
    calculator = pools(Calculator())
    executor = ToolExecutor([calculator])
    outcome = await executor.run("calculator", "tu_1", {"expression": "sqrt(2) * (3 + 4)^2"})
    assert (outcome.result, outcome.is_error) == ("69.29646455628166", False)
    pid = await calculator.pool.call(os.getpid, timeout=5)
    assert pid != os.getpid()
    assert calculator.pool.size == 1 and calculator.pool.started == 1


async def test_calculation_past_the_memory_limit_is_an_error_result(pools: Any) -> None:
    # In-process, the relaxed bounds let this through; the worker's memory limit stops it.
    calculator = pools(Calculator(memory_mb=48, limits=RELAXED, timeout=60, workers=1))
    executor = ToolExecutor([calculator], timeout=120)
    outcome = await executor.run("calculator", "tu_1", {"expression": MEMORY_HOG})
    assert outcome.is_error
    assert outcome.result == (
        "Tool 'calculator' failed: CalculatorError: calculation stopped: it needed more than 48 MB of memory"
    )
    assert (await executor.run("calculator", "tu_2", {"expression": "6*7"})).result == "42"


async def test_calculation_past_the_time_limit_is_stopped_and_the_next_call_works(pools: Any) -> None:
    calculator = pools(Calculator(timeout=0.3, limits=RELAXED, workers=1))
    executor = ToolExecutor([calculator])
    slow = await executor.run("calculator", "tu_1", {"expression": ENDLESS})
    assert slow.is_error
    assert slow.result == (
        "Tool 'calculator' failed: CalculatorError: calculation stopped: it took longer than 0.3 s"
    )
    following = await executor.run("calculator", "tu_2", {"expression": "1 + 1"})
    assert (following.result, following.is_error) == ("2", False)
    assert calculator.pool.started == 2 and calculator.pool.size == 1


async def test_a_timed_out_worker_is_killed(pools: Any) -> None:
    pool = pools(WorkerPool(max_workers=1))
    pid = await pool.call(os.getpid, timeout=5)
    with pytest.raises(WorkerTimeout, match="longer than 0.2 s"):
        await pool.call(calculate, ENDLESS, RELAXED, timeout=0.2)
    await pool.close()
    assert gone(pid)


async def test_a_single_worker_stuck_on_a_calculation_does_not_wedge_the_pool(pools: Any) -> None:
    calculator = pools(Calculator(timeout=0.3, limits=RELAXED, workers=1))
    executor = ToolExecutor([calculator])
    calls = [
        ("calculator", "stuck", {"expression": ENDLESS}),
        ("calculator", "next", {"expression": "6 * 7"}),
    ]
    outcomes = {o.tool_use_id: o async for o in executor.run_all(calls)}
    assert outcomes["stuck"].is_error and "took longer than 0.3 s" in outcomes["stuck"].result
    assert (outcomes["next"].result, outcomes["next"].is_error) == ("42", False)


async def test_the_event_loop_runs_while_a_calculation_runs(pools: Any) -> None:
    calculator = pools(Calculator(timeout=60, limits=RELAXED, workers=2))
    pool = calculator.pool
    await pool.warm(2)
    executor = ToolExecutor([calculator], timeout=120)
    calls = [("calculator", "slow", {"expression": ENDLESS}), ("calculator", "fast", {"expression": "6*7"})]
    async with contextlib.aclosing(executor.run_all(calls)) as outcomes:
        async for outcome in outcomes:
            assert (outcome.tool_use_id, outcome.result) == ("fast", "42")
            break
    # Closing the batch cancelled the slow call, and that killed its worker.
    assert pool.size == 1 and pool.started == 2


async def test_exceptions_come_back_as_they_were_raised(pools: Any) -> None:
    pool = pools(WorkerPool(max_workers=1))
    with pytest.raises(CalculatorError, match="division by zero"):
        await pool.call(calculate, "1/0", timeout=5)
    with pytest.raises(ValueError, match="invalid literal"):
        await pool.call(int, "x", timeout=5)
    assert pool.started == 1  # a job that fails leaves its worker usable


async def test_warm_starts_one_worker_that_the_first_call_uses(pools: Any) -> None:
    calculator = pools(Calculator())
    executor = ToolExecutor([calculator])
    await executor.start()
    assert calculator.pool.size == 1
    assert (await executor.run("calculator", "tu_1", {"expression": "2^10"})).result == "1024"
    await executor.start()  # one is up: nothing more to start
    assert calculator.pool.started == 1


async def test_concurrent_calls_take_the_first_free_worker(pools: Any) -> None:
    calculator = pools(Calculator(workers=2))
    executor = ToolExecutor([calculator])
    await executor.start()
    calls = [("calculator", f"tu_{i}", {"expression": f"{i} * 2"}) for i in range(8)]
    outcomes = {o.tool_use_id: o.result async for o in executor.run_all(calls)}
    assert outcomes == {f"tu_{i}": str(i * 2) for i in range(8)}
    assert calculator.pool.started <= 2


async def test_close_stops_every_worker_and_refuses_later_calls(pools: Any) -> None:
    calculator = pools(Calculator(limits=RELAXED, timeout=60))
    pool = calculator.pool
    await pool.warm(2)
    pids = [worker.process.pid for worker in pool._workers]
    assert len(pids) == 2 and len(pool._idle) == 2
    busy = asyncio.create_task(pool.call(calculate, ENDLESS, RELAXED, timeout=60))
    await until(lambda: len(pool._idle) == 1)  # one worker took the endless job
    executor = ToolExecutor([calculator])
    await executor.aclose()
    with pytest.raises(WorkerPoolClosed):
        await busy
    assert pool.size == 0 and all(gone(pid) for pid in pids)
    outcome = await executor.run("calculator", "tu_1", {"expression": "1+1"})
    assert outcome.result == "Tool 'calculator' failed: CalculatorError: the calculator is shut down"


def test_calculator_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="timeout"):
        Calculator(timeout=0)


async def test_a_memory_limit_too_low_to_start_is_a_clear_error(pools: Any) -> None:
    pool = pools(WorkerPool(max_workers=1, memory_mb=1))
    calculator = pools(Calculator(pool=pool))
    outcome = await ToolExecutor([calculator]).run("calculator", "tu_1", {"expression": "1"})
    assert outcome.is_error
    assert "too low for a worker" in outcome.result or "ended while starting" in outcome.result


# ---------------------------------------------------------------------------------------------
# Input bounds (refused before any work; the length without even a worker)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("1" * 1001, "expression too long: 1001 characters (limit is 1000)"),
        ("-" * 60 + "1", "expression nested too deeply (limit is 50 levels)"),
        ("sqrt(" * 51 + "1" + ")" * 51, "expression nested too deeply (limit is 50 levels)"),
        ("1" + " + 1" * 200, "expression too complex: 401 parts (limit is 200)"),
    ],
)
async def test_input_bounds_are_error_results(pools: Any, expression: str, message: str) -> None:
    calculator = pools(Calculator())
    outcome = await ToolExecutor([calculator]).run("calculator", "tu_1", {"expression": expression})
    assert outcome.is_error
    assert outcome.result == f"Tool 'calculator' failed: CalculatorError: {message}"


async def test_an_overlong_expression_never_reaches_a_worker(pools: Any) -> None:
    calculator = pools(Calculator())
    outcome = await ToolExecutor([calculator]).run("calculator", "tu_1", {"expression": "1+" * 600 + "1"})
    assert "expression too long" in outcome.result
    assert calculator.pool.started == 0


# ---------------------------------------------------------------------------------------------
# Settings
# ---------------------------------------------------------------------------------------------


def test_the_app_passes_its_settings_to_the_tools() -> None:
    from service.app import SERVICES, create_app
    from service.config import Settings

    settings = Settings(
        tool_max_output_chars=1234,
        calculator_timeout_s=0.5,
        calculator_memory_mb=128,
        calculator_workers=3,
    )
    executor = create_app(settings)[SERVICES].tools
    assert executor.max_result_chars == 1234
    calculator = executor.current()["calculator"]
    assert isinstance(calculator, Calculator)
    assert (calculator.timeout, calculator.pool.memory_mb, calculator.pool.max_workers) == (0.5, 128, 3)
    assert calculator.pool.started == 0  # nothing starts before the app does


def test_settings_defaults_and_bounds() -> None:
    from service.config import Settings, SettingsError, load_settings

    settings = Settings()
    assert settings.tool_max_output_chars == 20_000
    assert (settings.calculator_timeout_s, settings.calculator_memory_mb, settings.calculator_workers) == (
        2.0,
        256,
        2,
    )
    for name, value in [
        ("tool_max_output_chars", 0),
        ("calculator_timeout_s", 0),
        ("calculator_memory_mb", 16),
        ("calculator_workers", 0),
    ]:
        with pytest.raises(SettingsError, match=f"AGENT_{name.upper()}"):
            load_settings(**{name: value})


def test_builtin_tools_take_the_calculator_settings() -> None:
    (calculator,) = builtin_tools(calculator_timeout_s=1.5, calculator_memory_mb=64, calculator_workers=1)
    assert isinstance(calculator, Calculator)
    assert (calculator.timeout, calculator.pool.memory_mb, calculator.pool.max_workers) == (1.5, 64, 1)
