"""Hardening of the tools: the calculator's worker processes and output truncation.

The calculator's bounds on the syntax tree stop every costly expression before it is computed,
so the tests that prove the process guard (memory limit, time limit) relax those bounds through
:class:`CalculatorLimits`, or run a plain function in a :class:`WorkerPool` directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import resource
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pytest

from service.agent.tools import (
    DEFAULT_MAX_RESULT_CHARS,
    Calculator,
    CalculatorError,
    CalculatorLimits,
    FunctionTool,
    Tool,
    ToolExecutor,
    WorkerCrashed,
    WorkerMemoryError,
    WorkerPool,
    WorkerPoolClosed,
    WorkerTimeout,
    builtin_tools,
    calculate,
    evaluate,
)

OBJECT_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}

# No bound on integer size: what the syntax-tree checks would refuse reaches the worker.
RELAXED = CalculatorLimits(max_int_bits=10**12)
# Takes minutes of CPU (and ~150 MB) when nothing refuses it first.
ENDLESS = "9**9**9"
# A 2**28-bit (32 MB) integer: past a 48 MB worker within a second, long before any time limit.
MEMORY_HOG = "2**(2**28)"


@pytest.fixture
async def pools() -> Any:
    """Make pools and calculators that are closed after the test, so no worker outlives it."""
    made: list[Any] = []

    def track(thing: Any) -> Any:
        made.append(thing)
        return thing

    yield track
    for thing in made:
        await (thing.close() if isinstance(thing, WorkerPool) else thing.aclose())


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


async def test_worker_has_the_memory_limit(pools: Any) -> None:
    pool = pools(WorkerPool(max_workers=1, memory_mb=100))
    limit = await pool.call(resource.getrlimit, resource.RLIMIT_AS, timeout=5)
    assert limit == (100 << 20, 100 << 20)


async def test_allocation_past_the_memory_limit_is_stopped_and_the_worker_replaced(pools: Any) -> None:
    pool = pools(WorkerPool(max_workers=1, memory_mb=64))
    with pytest.raises(WorkerMemoryError, match="needed more than 64 MB"):
        await pool.call(bytearray, 1 << 30, timeout=30)
    assert await pool.call(abs, -3, timeout=5) == 3
    assert pool.started == 2  # the worker that ran out of memory was retired


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


async def test_a_crashed_worker_is_an_error_and_is_replaced(pools: Any) -> None:
    pool = pools(WorkerPool(max_workers=1))
    with pytest.raises(WorkerCrashed, match="exited with code 3"):
        await pool.call(os._exit, 3, timeout=5)
    assert await pool.call(abs, -1, timeout=5) == 1


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


async def test_a_pool_dropped_without_close_kills_its_workers() -> None:
    pool = WorkerPool(max_workers=1)
    await pool.call(abs, 1, timeout=5)
    (worker,) = pool._workers
    process = worker.process
    del pool, worker
    gc.collect()
    await asyncio.to_thread(process.join, 10)
    assert process.exitcode == -9


def test_pool_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="max_workers"):
        WorkerPool(max_workers=0)
    with pytest.raises(ValueError, match="memory_mb"):
        WorkerPool(memory_mb=0)
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


def test_limits_can_be_tightened() -> None:
    limits = CalculatorLimits(max_expression_chars=20, max_depth=3, max_nodes=10)
    with pytest.raises(CalculatorError, match=r"too long: 21 characters \(limit is 20\)"):
        evaluate("1" * 21, limits)
    with pytest.raises(CalculatorError, match=r"nested too deeply \(limit is 3 levels\)"):
        evaluate("----1", limits)
    with pytest.raises(CalculatorError, match=r"too complex: 11 parts \(limit is 10\)"):
        evaluate("1+2+3+4+5+6", limits)
    assert evaluate("-(-1)", limits) == 1


def test_limits_apply_only_to_their_evaluation() -> None:
    assert int(calculate("2**12000", RELAXED)) == 2**12000
    with pytest.raises(CalculatorError, match="integer result too large"):
        evaluate("2**12000")


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
