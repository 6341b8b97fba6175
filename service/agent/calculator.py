"""The built-in calculator tool: exact arithmetic, evaluated in a sandboxed worker process.

The expression's length is checked on the event loop; everything else (its syntax, size and
depth, the values' bounds: :mod:`service.agent.arithmetic`) is checked and computed in a
:class:`~service.sandbox.WorkerPool` process, off the event loop, under a hard memory limit
(``RLIMIT_AS``) and a hard time limit (a worker that overruns is killed and replaced), so anything
that slips past the checks costs one worker process, never the service.
"""

from __future__ import annotations

from typing import Any

from service.agent.arithmetic import (
    DEFAULT_LIMITS,
    FUNCTION_NAMES,
    CalculatorError,
    CalculatorLimits,
    calculate,
)
from service.agent.tools import Tool
from service.sandbox import WorkerError, WorkerMemoryError, WorkerPool, WorkerPoolClosed, WorkerTimeout

__all__ = ["Calculator", "builtin_tools"]

# AGENT_CALCULATOR_TIMEOUT_S / AGENT_CALCULATOR_MEMORY_MB / AGENT_CALCULATOR_WORKERS
DEFAULT_CALCULATOR_TIMEOUT_S = 2.0
DEFAULT_CALCULATOR_MEMORY_MB = 256
DEFAULT_CALCULATOR_WORKERS = 2


class Calculator(Tool):
    """Evaluates arithmetic expressions exactly and safely, in a worker process.

    The input's length is checked on the event loop; the parse, the size and depth checks and the
    evaluation run in a :class:`WorkerPool` process under a memory limit, stopped after
    ``timeout`` seconds by killing that worker. Every failure is a :class:`CalculatorError` with
    a clear message.
    """

    name = "calculator"
    description = (
        "Evaluate an arithmetic expression and return the number. Use it for any calculation "
        "instead of doing arithmetic in your head."
    )
    input_schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "expression": {
                "type": "string",
                "description": (
                    "Arithmetic expression, e.g. 'sqrt(2) * (3 + 4)^2'. Supports + - * / // % "
                    "** (or ^), parentheses, the constants pi, e and tau, and the functions "
                    + ", ".join(FUNCTION_NAMES)
                    + "."
                ),
            }
        },
        "required": ["expression"],
    }

    def __init__(
        self,
        *,
        timeout: float = DEFAULT_CALCULATOR_TIMEOUT_S,
        memory_mb: int = DEFAULT_CALCULATOR_MEMORY_MB,
        workers: int = DEFAULT_CALCULATOR_WORKERS,
        limits: CalculatorLimits | None = None,
        pool: WorkerPool | None = None,
    ) -> None:
        if not timeout > 0:
            raise ValueError(f"timeout must be positive, got {timeout!r}")
        self.timeout = float(timeout)
        self.limits = DEFAULT_LIMITS if limits is None else limits
        # Processes start on first use (or on start()); creating a Calculator costs nothing.
        self._owns_pool = pool is None
        self.pool = pool or WorkerPool(
            max_workers=workers, memory_mb=memory_mb, name="calculator", preload=[calculate.__module__]
        )

    async def start(self) -> None:
        """Start a worker now, so the first call does not wait for one."""
        await self.pool.warm()

    async def aclose(self) -> None:
        """Stop the worker processes (unless the pool was handed in: then its owner does)."""
        if self._owns_pool:
            await self.pool.close()

    async def call(self, input: dict[str, Any]) -> str:
        """Evaluate ``input["expression"]`` in a worker process and return the number as text."""
        expression = input.get("expression")
        if not isinstance(expression, str):
            raise CalculatorError("input needs an 'expression' string")
        limits = self.limits
        if len(expression) > limits.max_expression_chars:
            # Refused here, so an oversized input is never even copied to a worker. Everything
            # else (syntax, size, depth, the values' bounds) is checked in the worker, whose
            # parse of at most max_expression_chars costs as much as a second one here would.
            raise CalculatorError(
                f"expression too long: {len(expression)} characters (limit is {limits.max_expression_chars})"
            )
        try:
            return await self.pool.call(
                calculate, expression, None if limits == DEFAULT_LIMITS else limits, timeout=self.timeout
            )
        except WorkerTimeout:
            raise CalculatorError(f"calculation stopped: it took longer than {self.timeout:g} s") from None
        except WorkerMemoryError:
            raise CalculatorError(
                f"calculation stopped: it needed more than {self.pool.memory_mb} MB of memory"
            ) from None
        except WorkerPoolClosed:
            raise CalculatorError("the calculator is shut down") from None
        except WorkerError as exc:
            raise CalculatorError(f"calculation failed: {exc}") from None


def builtin_tools(
    *,
    calculator_timeout_s: float = DEFAULT_CALCULATOR_TIMEOUT_S,
    calculator_memory_mb: int = DEFAULT_CALCULATOR_MEMORY_MB,
    calculator_workers: int = DEFAULT_CALCULATOR_WORKERS,
) -> list[Tool]:
    """The tools every agent gets."""
    return [
        Calculator(timeout=calculator_timeout_s, memory_mb=calculator_memory_mb, workers=calculator_workers)
    ]
