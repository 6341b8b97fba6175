"""Tools the model may call, the executor that runs them, and the built-in calculator.

The agent loop hands every ``tool_use`` block to :meth:`ToolExecutor.run` (or a batch of them to
:meth:`ToolExecutor.run_all`). The executor never raises for a tool's failure: unknown tools, bad
input, exceptions, timeouts and oversized results all become a :class:`ToolOutcome` with
``is_error`` set, whose text is what the model is told. Only cancellation propagates, so a
cancelled query stops its tools.

Besides the tools registered once, an executor can hold :class:`ToolSource` objects whose tools
may change while the service runs (MCP servers coming and going). Every lookup takes a fresh
snapshot, so a run in flight keeps working: a tool that vanished between two turns is simply an
unknown tool for the next call. Registered tools win every name clash; among sources, the first
added wins, and a source's tool with a taken or invalid name is not offered.

Every result, of every tool (built-in, AWS, MCP), is cut past ``max_result_chars`` and marked
with how much was left out, so neither the model nor the clients receive an oversized result.

The calculator evaluates arithmetic by walking the syntax tree that :func:`ast.parse` builds; it
never runs Python code, and it refuses inputs whose evaluation would be expensive *before*
computing them (long inputs, many or deeply nested parts, huge powers, factorials), so a hostile
expression costs nothing. Those checks are the first line of defence. The second is where the
evaluation runs: in a :class:`WorkerPool` process, off the event loop, under a hard memory limit
(``RLIMIT_AS``) and a hard time limit (a worker that overruns is killed and replaced), so anything
that slips past the checks costs one worker process, never the service.
"""

from __future__ import annotations

import abc
import ast
import asyncio
import collections
import contextlib
import contextvars
import inspect
import logging
import math
import multiprocessing
import re
import signal
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

try:
    import resource
except ImportError:  # not on Windows: workers then run without a memory limit
    resource = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

__all__ = [
    "Calculator",
    "CalculatorError",
    "CalculatorLimits",
    "FunctionTool",
    "Tool",
    "ToolExecutor",
    "ToolOutcome",
    "ToolSource",
    "WorkerCrashed",
    "WorkerError",
    "WorkerMemoryError",
    "WorkerPool",
    "WorkerPoolClosed",
    "WorkerTimeout",
    "builtin_tools",
    "calculate",
    "evaluate",
    "format_number",
    "parse_expression",
]

Number = int | float

# Bedrock (and Anthropic) reject other tool names, so refuse them when registering rather than
# on the first request to the model.
_TOOL_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


# --------------------------------------------------------------------------------------------
# Tools
# --------------------------------------------------------------------------------------------


class Tool(abc.ABC):
    """A tool the model may call.

    Optional hooks the :class:`ToolExecutor` calls when a tool has them: ``async start()`` (get
    ready when the service starts) and ``async aclose()`` (release worker processes or
    connections when it stops).
    """

    name: str
    description: str
    input_schema: dict[str, Any]  # JSON schema of the input object

    @abc.abstractmethod
    async def call(self, input: dict[str, Any]) -> str:
        """Run the tool on ``input``; raise any exception to report a failure."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {getattr(self, 'name', '?')!r}>"


@runtime_checkable
class ToolSource(Protocol):
    """A set of tools that may change at run time; the executor asks for it on every lookup."""

    def tools(self) -> Sequence[Tool]:
        """The tools offered right now (cheap: called once per model turn and per tool call)."""
        ...


ToolFunc = Callable[[dict[str, Any]], str | Number | Awaitable[str | Number]]


class FunctionTool(Tool):
    """A tool made from a plain sync or async callable taking the input dict."""

    def __init__(
        self,
        name: str,
        description: str,
        input_schema: dict[str, Any],
        func: ToolFunc,
    ) -> None:
        if not callable(func):
            raise TypeError(f"func must be callable, got {type(func).__name__}")
        self.name = name
        self.description = description
        self.input_schema = input_schema
        self.func = func
        self._is_async = inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(
            getattr(func, "__call__", None)  # noqa: B004 - an object whose __call__ is async
        )

    async def call(self, input: dict[str, Any]) -> str:
        """Call the function (in a worker thread when it is sync) and format its result."""
        if self._is_async:
            result = await self.func(input)  # type: ignore[misc]
        else:
            # A blocking function must not stall the event loop that streams to clients.
            result = await asyncio.to_thread(self.func, input)
            # A sync callable may still hand back a coroutine (a lambda around an async def).
            if inspect.isawaitable(result):
                result = await result
        return _result_text(result)


def _result_text(result: Any) -> str:
    """The text of a function's result: strings as they are, numbers like the calculator's."""
    if isinstance(result, str):
        return result
    if isinstance(result, (int, float)) and not isinstance(result, bool):
        return format_number(result)
    raise TypeError(f"tool returned {type(result).__name__}, expected a string or a number")


def format_number(value: Number) -> str:
    """Format a number as the calculator does: integral values without a fraction."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"not a number: {type(value).__name__}")
    if isinstance(value, int):
        return str(value)
    if not math.isfinite(value):
        raise ValueError(f"result is not a finite number: {value!r}")
    # Below 1e15 every integral float is exact, so dropping ".0" loses nothing (sqrt(144) → 12).
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


# --------------------------------------------------------------------------------------------
# Executor
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolOutcome:
    """The result of one tool call, successful or not, as the model will be told it."""

    tool: str
    tool_use_id: str
    input: Any
    result: str
    is_error: bool
    duration_ms: float


_JSON_TYPE_NAMES: dict[type, str] = {
    list: "an array",
    tuple: "an array",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "a boolean",
    type(None): "null",
}


# AGENT_TOOL_MAX_OUTPUT_CHARS: longer results (and error messages) are cut to this many characters.
DEFAULT_MAX_RESULT_CHARS = 20_000


class ToolExecutor:
    """Runs the model's tool calls with a timeout, turning every failure into an error outcome.

    Every result is cut to ``max_result_chars`` characters (see :meth:`_truncate`), whichever
    tool produced it. The executor owns its registered tools: :meth:`aclose` closes them.
    """

    def __init__(
        self,
        tools: Iterable[Tool] = (),
        *,
        timeout: float = 30.0,
        max_result_chars: int = DEFAULT_MAX_RESULT_CHARS,
    ) -> None:
        if not timeout > 0:
            raise ValueError(f"timeout must be positive, got {timeout!r}")
        if max_result_chars < 1:
            raise ValueError(f"max_result_chars must be positive, got {max_result_chars!r}")
        self.timeout = float(timeout)
        self.max_result_chars = max_result_chars
        self._tools: dict[str, Tool] = {}
        self._sources: list[ToolSource] = []
        for tool in tools:
            self.register(tool)

    def register(self, tool: Tool) -> None:
        """Add a tool; ValueError if its name is taken or not a valid tool name."""
        name = getattr(tool, "name", None)
        if not isinstance(name, str) or not _TOOL_NAME_RE.match(name):
            raise ValueError(f"invalid tool name {name!r}: use 1-64 letters, digits, '_' or '-'")
        if name in self._tools:
            raise ValueError(f"a tool named {name!r} is already registered")
        self._tools[name] = tool

    def add_source(self, source: ToolSource) -> None:
        """Offer a source's tools (as they are at each lookup) after the registered ones."""
        if source not in self._sources:
            self._sources.append(source)

    def remove_source(self, source: ToolSource) -> None:
        """Stop offering a source's tools; calls already running finish."""
        if source in self._sources:
            self._sources.remove(source)

    async def start(self) -> None:
        """Let the registered tools get ready (the calculator starts its first worker process)."""
        for tool in self._tools.values():
            start = getattr(tool, "start", None)
            if callable(start):
                try:
                    await start()
                except Exception:  # noqa: BLE001 - a tool that cannot warm up starts on first use
                    logger.exception("tool %r failed to start", tool)

    async def aclose(self) -> None:
        """Close the registered tools (the calculator's worker processes); sources are their owners'."""
        for tool in self._tools.values():
            close = getattr(tool, "aclose", None)
            if callable(close):
                try:
                    await close()
                except Exception:  # noqa: BLE001 - one tool's failure must not keep the others open
                    logger.exception("tool %r failed to close", tool)

    @property
    def sources(self) -> tuple[ToolSource, ...]:
        """The dynamic tool sources, in the order they were added."""
        return tuple(self._sources)

    def current(self) -> dict[str, Tool]:
        """A snapshot of every tool offered now, by name: registered ones, then the sources'."""
        tools = dict(self._tools)
        for source in self._sources:
            try:
                offered = source.tools()
            except Exception:  # noqa: BLE001 - a broken source must not break every run
                logger.exception("tool source %r failed to list its tools", source)
                continue
            for tool in offered:
                name = getattr(tool, "name", None)
                # A source cannot raise at registration time, so its bad or clashing names are
                # dropped here; the source itself reports which of its tools it could not offer.
                if isinstance(name, str) and _TOOL_NAME_RE.match(name) and name not in tools:
                    tools[name] = tool
        return tools

    @property
    def names(self) -> list[str]:
        """The offered tools' names: registration order, then the sources' tools."""
        return list(self.current())

    def specs(self) -> list[dict[str, Any]]:
        """Provider-neutral tool descriptions: name, description and input schema."""
        return [
            {"name": t.name, "description": t.description, "input_schema": t.input_schema}
            for t in self.current().values()
        ]

    def bedrock_tool_config(self) -> dict[str, Any] | None:
        """The Bedrock Converse ``toolConfig``, or None when there are no tools."""
        specs = self.specs()
        if not specs:
            # Converse rejects an empty tool list, so the caller must leave toolConfig out.
            return None
        return {
            "tools": [
                {
                    "toolSpec": {
                        "name": spec["name"],
                        "description": spec["description"],
                        "inputSchema": {"json": spec["input_schema"]},
                    }
                }
                for spec in specs
            ]
        }

    async def run(self, tool: str, tool_use_id: str, input: Any) -> ToolOutcome:
        """Run one tool call; never raises except asyncio.CancelledError."""
        started = time.perf_counter()

        def outcome(result: str, is_error: bool) -> ToolOutcome:
            return ToolOutcome(
                tool=tool,
                tool_use_id=tool_use_id,
                input=input,
                result=self._truncate(result),
                is_error=is_error,
                duration_ms=(time.perf_counter() - started) * 1000.0,
            )

        offered = self.current()
        impl = offered.get(tool)
        if impl is None:
            available = ", ".join(offered) or "(none)"
            return outcome(f"Unknown tool '{tool}'. Available tools: {available}", True)
        if not isinstance(input, dict):
            got = _JSON_TYPE_NAMES.get(type(input), type(input).__name__)
            return outcome(f"Tool '{tool}' input must be a JSON object, got {got}", True)

        task = asyncio.current_task()
        # Compare against the count on entry, not zero: a caller that once swallowed a
        # cancellation leaves the count raised for good, and that must not fail every later call.
        cancelling_before = task.cancelling() if task is not None else 0
        deadline = asyncio.timeout(self.timeout)
        try:
            async with deadline:
                result = await impl.call(input)
            if not isinstance(result, str):
                raise TypeError(f"returned {type(result).__name__}, expected a string")
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure is reported to the model
            self._reraise_if_cancelled(task, cancelling_before)
            if deadline.expired():
                # The tool turned our cancellation into another exception: still a timeout.
                return outcome(self._timeout_message(tool), True)
            logger.info("tool %r (%s) failed", tool, tool_use_id, exc_info=True)
            return outcome(f"Tool '{tool}' failed: {_describe_exception(exc)}", True)
        self._reraise_if_cancelled(task, cancelling_before)
        return outcome(result, False)

    async def run_all(self, calls: Sequence[tuple[str, str, Any]]) -> AsyncIterator[ToolOutcome]:
        """Run all calls concurrently and yield each outcome as it completes.

        If the consumer stops early (close the iterator, e.g. with ``contextlib.aclosing``) or
        is cancelled, the calls still running are cancelled and awaited before it returns.
        """
        tasks = [asyncio.create_task(self.run(*call)) for call in calls]
        pending: set[asyncio.Task[ToolOutcome]] = set(tasks)
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                # Several may finish in the same loop iteration; keep the request order for them.
                for task in sorted(done, key=tasks.index):
                    yield task.result()
        finally:
            for task in pending:
                task.cancel()
            if pending:
                # Tools get to run their cleanup before the caller moves on.
                await asyncio.gather(*pending, return_exceptions=True)

    def _timeout_message(self, tool: str) -> str:
        return f"Tool '{tool}' timed out after {self.timeout:g} s"

    def _truncate(self, text: str) -> str:
        """Cut a result past ``max_result_chars`` and say how much was left out."""
        if len(text) <= self.max_result_chars:
            return text
        omitted = len(text) - self.max_result_chars
        return text[: self.max_result_chars] + f"\n[truncated: {omitted} of {len(text)} characters omitted]"

    @staticmethod
    def _reraise_if_cancelled(task: asyncio.Task[Any] | None, cancelling_before: int) -> None:
        # A tool that swallows our caller's cancellation (or turns it into another error) must
        # not keep the query running: cancellation always wins over an outcome.
        if task is not None and task.cancelling() > cancelling_before:
            raise asyncio.CancelledError()


def _describe_exception(exc: BaseException) -> str:
    try:
        message = str(exc)
    except Exception:  # noqa: BLE001 - a broken __str__ must not break the executor
        message = ""
    name = type(exc).__name__
    return f"{name}: {message}" if message else name


# --------------------------------------------------------------------------------------------
# Calculator
# --------------------------------------------------------------------------------------------


class CalculatorError(ValueError):
    """The expression is invalid, unsupported, or too expensive to evaluate."""


MAX_EXPRESSION_CHARS = 1_000
MAX_NODES = 200
MAX_DEPTH = 50
MAX_INT_BITS = 10_000
MAX_FACTORIAL = 1_000
MAX_COMB_ARG = 10_000
# round(int, -n) computes 10**n; beyond this every value up to MAX_INT_BITS rounds to 0 anyway.
_MAX_ROUND_DIGITS = 5_000

# AGENT_CALCULATOR_TIMEOUT_S / AGENT_CALCULATOR_MEMORY_MB / AGENT_CALCULATOR_WORKERS
DEFAULT_CALCULATOR_TIMEOUT_S = 2.0
DEFAULT_CALCULATOR_MEMORY_MB = 256
DEFAULT_CALCULATOR_WORKERS = 2


@dataclass(frozen=True)
class CalculatorLimits:
    """The bounds the calculator checks before and while computing (the first line of defence)."""

    max_expression_chars: int = MAX_EXPRESSION_CHARS
    max_nodes: int = MAX_NODES
    max_depth: int = MAX_DEPTH
    max_int_bits: int = MAX_INT_BITS
    max_factorial: int = MAX_FACTORIAL
    max_comb_arg: int = MAX_COMB_ARG
    max_round_digits: int = _MAX_ROUND_DIGITS


DEFAULT_LIMITS = CalculatorLimits()

# The limits of the evaluation in progress (a context variable, so nested helpers need no argument).
_limits_var: contextvars.ContextVar[CalculatorLimits] = contextvars.ContextVar(
    "calculator_limits", default=DEFAULT_LIMITS
)

_CONSTANTS: dict[str, float] = {"pi": math.pi, "e": math.e, "tau": math.tau}

_OPERATOR_SYMBOLS: dict[type, str] = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
    ast.FloorDiv: "//",
    ast.Mod: "%",
    ast.Pow: "**",
    ast.LShift: "<<",
    ast.RShift: ">>",
    ast.BitOr: "|",
    ast.BitXor: "^",
    ast.BitAnd: "&",
    ast.MatMult: "@",
    ast.UAdd: "+",
    ast.USub: "-",
    ast.Not: "not",
    ast.Invert: "~",
}

_BINARY_OPERATORS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow)

_NODE_DESCRIPTIONS: dict[type, str] = {
    ast.Attribute: "attribute access",
    ast.Subscript: "subscript",
    ast.Lambda: "lambda",
    ast.ListComp: "comprehension",
    ast.SetComp: "comprehension",
    ast.DictComp: "comprehension",
    ast.GeneratorExp: "comprehension",
    ast.Compare: "comparison",
    ast.BoolOp: "boolean operator",
    ast.IfExp: "conditional expression",
    ast.NamedExpr: "assignment",
    ast.Tuple: "tuple",
    ast.List: "list",
    ast.Set: "set",
    ast.Dict: "dict",
    ast.JoinedStr: "f-string",
    ast.Starred: "starred argument",
    ast.Await: "await",
    ast.Yield: "yield",
    ast.YieldFrom: "yield",
}


def _unparse(node: ast.AST, limit: int = 60) -> str:
    text = ast.unparse(node)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _short(value: Number) -> str:
    text = format_number(value) if isinstance(value, int) or math.isfinite(value) else repr(value)
    return text if len(text) <= 30 else text[:27] + "..."


def _check_int_bits(value: int) -> None:
    limit = _limits_var.get().max_int_bits
    if value.bit_length() > limit:
        raise CalculatorError(f"integer result too large (limit is {limit} bits)")


def _checked(value: Any) -> Number:
    """Every intermediate value passes here, so no step can start from an oversized number."""
    if isinstance(value, bool):
        # True/False are ints to Python, but they are not numbers to a calculator user.
        raise CalculatorError("booleans are not numbers")
    if isinstance(value, int):
        _check_int_bits(value)
        return value
    if isinstance(value, float):
        if math.isnan(value):
            raise CalculatorError("result is not a number (nan)")
        if math.isinf(value):
            raise CalculatorError("numeric overflow: result is too large")
        return value
    if isinstance(value, complex):
        raise CalculatorError("result is not a real number")
    raise CalculatorError(f"unsupported value of type {type(value).__name__}")


def _as_int(func: str, value: Number) -> int:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, int):
        return value
    raise CalculatorError(f"{func}() needs integer arguments, got {_short(value)}")


def _power(base: Number, exponent: Number) -> Number:
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 0:
        bits = abs(base).bit_length()
        # The result has between (bits-1)*exponent+1 and bits*exponent bits. Refuse from the
        # lower bound without computing anything (9**387420489); whatever passes is at most
        # twice the limit, cheap to compute and then checked exactly.
        limit = _limits_var.get().max_int_bits
        if bits > 1 and (bits - 1) * exponent >= limit:
            raise CalculatorError(f"integer result too large (limit is {limit} bits)")
    return base**exponent


def _factorial(n: Number) -> int:
    value = _as_int("factorial", n)
    limit = _limits_var.get().max_factorial
    if not 0 <= value <= limit:
        raise CalculatorError(f"factorial() needs an integer from 0 to {limit}")
    return math.factorial(value)


def _comb_perm(func: Callable[..., int], name: str) -> Callable[..., int]:
    def call(*args: Number) -> int:
        ints = [_as_int(name, a) for a in args]
        limit = _limits_var.get().max_comb_arg
        if any(abs(i) > limit for i in ints):
            raise CalculatorError(f"{name}() arguments must be at most {limit}")
        return func(*ints)

    return call


def _gcd(*args: Number) -> int:
    return math.gcd(*(_as_int("gcd", a) for a in args))


def _lcm(*args: Number) -> int:
    result = 1
    for arg in args:
        # Check as it grows: a long list of big arguments could otherwise build a huge number.
        result = math.lcm(result, _as_int("lcm", arg))
        _check_int_bits(result)
    return result


def _round(x: Number, ndigits: Number | None = None) -> Number:
    if ndigits is None:
        return round(x)
    digits = _as_int("round", ndigits)
    bound = _limits_var.get().max_round_digits
    digits = max(-bound, min(bound, digits))
    return round(x, digits)


def _log(x: Number, base: Number | None = None) -> float:
    return math.log(x) if base is None else math.log(x, base)


# name -> (implementation, minimum arguments, maximum arguments or None for any number)
_FUNCTIONS: dict[str, tuple[Callable[..., Number], int, int | None]] = {
    "sqrt": (math.sqrt, 1, 1),
    "cbrt": (math.cbrt, 1, 1),
    "exp": (math.exp, 1, 1),
    "log": (_log, 1, 2),
    "log10": (math.log10, 1, 1),
    "log2": (math.log2, 1, 1),
    "sin": (math.sin, 1, 1),
    "cos": (math.cos, 1, 1),
    "tan": (math.tan, 1, 1),
    "asin": (math.asin, 1, 1),
    "acos": (math.acos, 1, 1),
    "atan": (math.atan, 1, 1),
    "atan2": (math.atan2, 2, 2),
    "sinh": (math.sinh, 1, 1),
    "cosh": (math.cosh, 1, 1),
    "tanh": (math.tanh, 1, 1),
    "degrees": (math.degrees, 1, 1),
    "radians": (math.radians, 1, 1),
    "floor": (math.floor, 1, 1),
    "ceil": (math.ceil, 1, 1),
    "abs": (abs, 1, 1),
    "round": (_round, 1, 2),
    "factorial": (_factorial, 1, 1),
    "pow": (_power, 2, 2),
    "hypot": (math.hypot, 1, None),
    "gcd": (_gcd, 1, None),
    "lcm": (_lcm, 1, None),
    "comb": (_comb_perm(math.comb, "comb"), 2, 2),
    "perm": (_comb_perm(math.perm, "perm"), 1, 2),
    "trunc": (math.trunc, 1, 1),
    "min": (min, 1, None),
    "max": (max, 1, None),
}


def _guarded(what: str, compute: Callable[[], Any]) -> Number:
    """Run one arithmetic step, translating Python's errors into calculator messages."""
    try:
        value = compute()
    except CalculatorError:
        raise
    except ZeroDivisionError:
        raise CalculatorError("division by zero") from None
    except OverflowError:
        raise CalculatorError("numeric overflow: result is too large") from None
    except ValueError as exc:
        message = str(exc)
        if "domain" in message:
            raise CalculatorError(f"math domain error: {what} is undefined") from None
        raise CalculatorError(f"{what}: {message}") from None
    except TypeError as exc:
        raise CalculatorError(f"{what}: {exc}") from None
    return _checked(value)


def _evaluate_node(node: ast.AST) -> Number:
    if isinstance(node, ast.Expression):
        return _evaluate_node(node.body)
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool):
            raise CalculatorError(f"booleans are not numbers: {value}")
        if type(value) not in (int, float):
            raise CalculatorError(f"unsupported constant {_unparse(node)}: only numbers allowed")
        if isinstance(value, float) and math.isinf(value):
            raise CalculatorError(f"number too large: {_unparse(node)}")
        return _checked(value)
    if isinstance(node, ast.Name):
        if node.id in _CONSTANTS:
            return _CONSTANTS[node.id]
        if node.id in _FUNCTIONS:
            raise CalculatorError(f"'{node.id}' is a function: call it like {node.id}(x)")
        raise CalculatorError(f"unknown name '{node.id}'")
    if isinstance(node, ast.BinOp):
        symbol = _OPERATOR_SYMBOLS.get(type(node.op), type(node.op).__name__)
        if not isinstance(node.op, _BINARY_OPERATORS):
            raise CalculatorError(f"unsupported operator '{symbol}'")
        left = _evaluate_node(node.left)
        right = _evaluate_node(node.right)
        what = f"{_short(left)} {symbol} {_short(right)}"
        op = node.op
        if isinstance(op, ast.Add):
            return _guarded(what, lambda: left + right)
        if isinstance(op, ast.Sub):
            return _guarded(what, lambda: left - right)
        if isinstance(op, ast.Mult):
            return _guarded(what, lambda: left * right)
        if isinstance(op, ast.Div):
            return _guarded(what, lambda: left / right)
        if isinstance(op, ast.FloorDiv):
            return _guarded(what, lambda: left // right)
        if isinstance(op, ast.Mod):
            return _guarded(what, lambda: left % right)
        return _guarded(what, lambda: _power(left, right))
    if isinstance(node, ast.UnaryOp):
        if isinstance(node.op, ast.USub):
            operand = _evaluate_node(node.operand)
            return _checked(-operand)
        if isinstance(node.op, ast.UAdd):
            return _checked(+_evaluate_node(node.operand))
        symbol = _OPERATOR_SYMBOLS.get(type(node.op), type(node.op).__name__)
        raise CalculatorError(f"unsupported operator '{symbol}'")
    if isinstance(node, ast.Call):
        return _evaluate_call(node)
    description = _NODE_DESCRIPTIONS.get(type(node), type(node).__name__)
    raise CalculatorError(f"unsupported expression: {description} ({_unparse(node)})")


def _evaluate_call(node: ast.Call) -> Number:
    if not isinstance(node.func, ast.Name):
        raise CalculatorError(
            f"unsupported expression: only named functions can be called ({_unparse(node)})"
        )
    name = node.func.id
    entry = _FUNCTIONS.get(name)
    if entry is None:
        raise CalculatorError(f"unknown name '{name}'")
    if node.keywords:
        raise CalculatorError(f"unsupported expression: keyword arguments ({_unparse(node)})")
    func, min_args, max_args = entry
    count = len(node.args)
    if count < min_args or (max_args is not None and count > max_args):
        if max_args is None:
            expected = f"at least {min_args}"
        elif min_args == max_args:
            expected = str(min_args)
        else:
            expected = f"{min_args} or {max_args}"
        noun = "argument" if expected == "1" else "arguments"
        raise CalculatorError(f"{name}() takes {expected} {noun} ({count} given)")
    args = [_evaluate_node(arg) for arg in node.args]
    what = f"{name}({', '.join(_short(a) for a in args)})"
    return _guarded(what, lambda: func(*args))


def _check_size(tree: ast.Expression, limits: CalculatorLimits) -> None:
    # Count only expression nodes: contexts and operator tokens are not work.
    nodes = sum(1 for n in ast.walk(tree) if isinstance(n, ast.expr))
    if nodes > limits.max_nodes:
        raise CalculatorError(f"expression too complex: {nodes} parts (limit is {limits.max_nodes})")
    # Iterative, so a deep tree cannot exhaust the interpreter's stack before being refused.
    deepest = 0
    stack: list[tuple[ast.AST, int]] = [(tree.body, 1)]
    while stack:
        current, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend(
            (child, depth + 1) for child in ast.iter_child_nodes(current) if isinstance(child, ast.expr)
        )
    if deepest > limits.max_depth:
        raise CalculatorError(f"expression nested too deeply (limit is {limits.max_depth} levels)")


def parse_expression(expression: str, limits: CalculatorLimits | None = None) -> ast.Expression:
    """Check an expression's length, syntax and size (nodes, depth), and return its syntax tree."""
    limits = DEFAULT_LIMITS if limits is None else limits
    if not isinstance(expression, str):
        raise CalculatorError(f"expression must be a string, got {type(expression).__name__}")
    if len(expression) > limits.max_expression_chars:
        raise CalculatorError(
            f"expression too long: {len(expression)} characters (limit is {limits.max_expression_chars})"
        )
    # People write powers with ^ and use typographic operators; Python's ^ would be XOR.
    source = (
        expression.replace("^", "**").replace("×", "*").replace("÷", "/").replace("\u2212", "-")
    ).strip()
    if not source:
        raise CalculatorError("empty expression")
    try:
        tree = ast.parse(source, mode="eval")
    except SyntaxError as exc:
        raise CalculatorError(f"invalid expression: {exc.msg}") from None
    except (ValueError, RecursionError, MemoryError) as exc:
        # Null bytes raise ValueError; pathological nesting can exhaust the parser.
        raise CalculatorError(f"invalid expression: {exc}") from None
    _check_size(tree, limits)
    return tree


def evaluate(expression: str, limits: CalculatorLimits | None = None) -> int | float:
    """Evaluate an arithmetic expression safely; raises CalculatorError with a clear message.

    This runs in the calling process with only the syntax-tree bounds of ``limits``; the
    :class:`Calculator` tool runs it in a worker process (see :func:`calculate`).
    """
    limits = DEFAULT_LIMITS if limits is None else limits
    tree = parse_expression(expression, limits)
    token = _limits_var.set(limits)
    try:
        return _evaluate_node(tree)
    finally:
        _limits_var.reset(token)


def calculate(expression: str, limits: CalculatorLimits | None = None) -> str:
    """The calculator's worker entry point: evaluate and format the number as text."""
    return format_number(evaluate(expression, limits))


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
                    + ", ".join(_FUNCTIONS)
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
        self.pool = pool or WorkerPool(max_workers=workers, memory_mb=memory_mb, name="calculator")

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


# --------------------------------------------------------------------------------------------
# Worker processes
# --------------------------------------------------------------------------------------------


class WorkerError(RuntimeError):
    """A job could not be run to completion in a worker process."""


class WorkerTimeout(WorkerError):
    """The job overran its time limit; its worker was killed."""


class WorkerMemoryError(WorkerError):
    """The job hit the worker's memory limit; the worker was retired."""


class WorkerCrashed(WorkerError):
    """The worker process died while running the job."""


class WorkerPoolClosed(WorkerError):
    """The pool is shut down."""


# A worker that does not report ready within this many seconds is killed (a wedged start).
_WORKER_START_TIMEOUT_S = 30.0


def _limit_memory(limit_bytes: int) -> str | None:
    """Cap this process's memory; return the name of the limit applied, or None if none could be."""
    if resource is None:
        return None
    # RLIMIT_AS bounds every mapping, so a huge allocation fails at once with MemoryError;
    # RLIMIT_DATA is the fallback where the address-space limit cannot be set (macOS).
    for name in ("RLIMIT_AS", "RLIMIT_DATA"):
        which = getattr(resource, name, None)
        if which is None:
            continue
        try:
            _, hard = resource.getrlimit(which)
            value = limit_bytes if hard == resource.RLIM_INFINITY else min(limit_bytes, hard)
            # The hard limit too: nothing in this process may raise it again.
            resource.setrlimit(which, (value, value))
            return name
        except (ValueError, OSError):
            continue
    return None


def _limit_cpu(seconds: int) -> None:
    """A backstop for the parent's timer: SIGXCPU ends this process after ``seconds`` more CPU.

    The parent kills an overrunning worker long before; this only matters if the parent cannot
    (it was killed, or its event loop is stuck), so an orphaned job cannot compute forever.
    """
    if resource is None:
        return
    try:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        soft = math.ceil(usage.ru_utime + usage.ru_stime) + seconds
        _, hard = resource.getrlimit(resource.RLIMIT_CPU)
        if hard != resource.RLIM_INFINITY:
            soft = min(soft, hard)
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
    except (ValueError, OSError):
        pass


def _send_reply(conn: Any, reply: tuple[str, Any]) -> bool:
    """Send a job's reply; False when the parent is gone."""
    try:
        conn.send(reply)
        return True
    except (EOFError, OSError):
        return False
    except MemoryError:
        reply = ("memory", None)
    except Exception as exc:  # noqa: BLE001 - the result (or exception) could not be pickled
        reply = ("error", WorkerError(f"the result could not be sent back: {_describe_exception(exc)}"))
    try:
        conn.send(reply)
        return True
    except Exception:  # noqa: BLE001 - nothing more can be told; the parent sees the worker end
        return False


def _worker_main(conn: Any, memory_bytes: int) -> None:
    """A worker process: apply the limits, report ready, then run jobs until told to stop."""
    # Ctrl-C reaches the whole process group; the parent decides when workers end.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    applied = _limit_memory(memory_bytes)
    if resource is not None:
        try:
            # A worker stopped by SIGXCPU must not write a core file the size of its memory.
            resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
        except (ValueError, OSError):
            pass
    try:
        probe = bytearray(4 << 20)  # a worker that cannot compute anything is useless: say so
        del probe
    except MemoryError:
        with contextlib.suppress(Exception):
            conn.send(("failed", f"a memory limit of {memory_bytes >> 20} MB is too low for a worker"))
        return
    conn.send(("ready", applied))
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return  # the parent went away
        except MemoryError:
            _send_reply(conn, ("memory", None))
            return
        if job is None:
            return
        func, args, cpu_seconds = job
        _limit_cpu(cpu_seconds)
        try:
            reply: tuple[str, Any] = ("ok", func(*args))
        except MemoryError:
            reply = ("memory", None)
        except BaseException as exc:  # noqa: BLE001 - every failure goes back to the caller
            reply = ("error", exc)
        del job, func, args
        if not _send_reply(conn, reply) or reply[0] == "memory":
            # After a MemoryError the heap may be fragmented or half-built: start afresh.
            return


class _Worker:
    """One worker process and the parent's end of its pipe."""

    __slots__ = ("process", "conn", "__weakref__")

    def __init__(self, process: Any, conn: Any) -> None:
        self.process = process
        self.conn = conn

    def alive(self) -> bool:
        try:
            return self.process.exitcode is None
        except ValueError:  # the process object is closed
            return False

    def exit_description(self) -> str:
        try:
            code = self.process.exitcode
        except ValueError:
            code = None
        if code is None:
            return "it closed its pipe"
        if code < 0:
            try:
                return f"it was ended by {signal.Signals(-code).name}"
            except ValueError:
                return f"it was ended by signal {-code}"
        return f"it exited with code {code}"

    def kill(self) -> None:
        """End the process at once (SIGKILL) and close the pipe; safe to call more than once.

        Only for a worker whose pipe no caller is waiting on: a closed descriptor would never
        wake the event loop's reader. Stop a busy worker with :meth:`kill_process`.
        """
        self.kill_process()
        self.close_pipe()

    def kill_process(self) -> None:
        """SIGKILL the process; a caller waiting for its reply wakes up to the end of the pipe."""
        try:
            if self.process.exitcode is None:
                self.process.kill()
        except (OSError, ValueError, AttributeError):
            pass

    def stop(self) -> None:
        """Ask an idle worker to exit on its own."""
        try:
            self.conn.send(None)
        except (OSError, ValueError):
            pass
        self.close_pipe()

    def close_pipe(self) -> None:
        try:
            self.conn.close()
        except OSError:
            pass

    def reap(self, timeout: float) -> None:
        """Wait (blocking) for the process to end, killing it if it does not; free its resources."""
        try:
            self.process.join(timeout)
            if self.process.exitcode is None:
                self.process.kill()
                self.process.join(5.0)
            self.process.close()
        except (OSError, ValueError, AssertionError):
            pass


def _kill_all(workers: set[_Worker]) -> None:
    """The finalizer of a pool dropped without close(): its processes must not outlive it."""
    for worker in list(workers):
        worker.kill()


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class WorkerPool:
    """A few worker processes that run picklable functions with a time and a memory limit.

    Workers are started in a thread (process start-up blocks) from multiprocessing's
    ``forkserver`` (``spawn`` where there is none): a clean single-threaded server process that
    has imported this module once, so a worker is up in milliseconds, and no worker inherits the
    service's threads or sockets. Each worker applies ``RLIMIT_AS`` of ``memory_mb`` to itself
    before taking jobs, so a job that allocates too much gets a MemoryError there
    (:class:`WorkerMemoryError` here; the worker is replaced). A job that overruns its timeout gets
    its worker killed (:class:`WorkerTimeout`); later jobs get other or fresh workers, so nothing
    stays wedged. At most ``max_workers`` run at once; more calls wait their turn, and a caller
    takes whichever worker is free first, the one already running or one just started.

    The event loop never blocks: a job is sent (a small message), and the reply is awaited with
    the loop's reader on the pipe. Results should be small (a number as text). Use the pool from
    one event loop at a time; :meth:`close` stops every worker.
    """

    def __init__(
        self,
        *,
        max_workers: int = DEFAULT_CALCULATOR_WORKERS,
        memory_mb: int = DEFAULT_CALCULATOR_MEMORY_MB,
        name: str = "worker",
        start_method: str | None = None,
    ) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be positive, got {max_workers!r}")
        if memory_mb < 1:
            raise ValueError(f"memory_mb must be positive, got {memory_mb!r}")
        self.max_workers = max_workers
        self.memory_mb = memory_mb
        self.name = name
        if start_method is None:
            start_method = (
                "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
            )
        self._context = multiprocessing.get_context(start_method)
        if start_method == "forkserver":
            # The server imports this module once and forks workers from it (no main module:
            # the service's own start-up does not run again in the server). Takes effect when
            # the server starts, i.e. with the first worker of any pool in this process.
            self._context.set_forkserver_preload([__name__])
        self._workers: set[_Worker] = set()  # every live worker, idle or busy
        self._idle: list[_Worker] = []
        self._starting: set[asyncio.Future[_Worker]] = set()
        self._waiters: collections.deque[asyncio.Future[_Worker | None]] = collections.deque()
        self._dying: list[_Worker] = []  # killed or stopped, not yet reaped
        self._closed = False
        self.started = 0  # workers started so far
        self._finalizer = weakref.finalize(self, _kill_all, self._workers)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def size(self) -> int:
        """Worker processes alive now (idle or busy)."""
        return len(self._workers)

    async def call(self, func: Callable[..., Any], *args: Any, timeout: float) -> Any:
        """Run ``func(*args)`` in a worker; return its result or raise its exception.

        Raises :class:`WorkerTimeout`, :class:`WorkerMemoryError`, :class:`WorkerCrashed` or
        :class:`WorkerPoolClosed` when the job could not finish; cancellation kills the worker.
        ``timeout`` counts from the moment a worker has the job, not the wait for a worker.
        """
        if not timeout > 0:
            raise ValueError(f"timeout must be positive, got {timeout!r}")
        worker = await self._acquire()
        keep = False
        try:
            kind, value = await self._exchange(worker, func, args, timeout)
            keep = kind in ("ok", "error")
        except WorkerCrashed:
            if self._closed:
                raise WorkerPoolClosed(f"the {self.name} pool is shut down") from None
            raise
        finally:
            if keep:
                self._release(worker)
            else:
                self._discard(worker)
        if kind == "ok":
            return value
        if kind == "error":
            if isinstance(value, BaseException):
                raise value
            raise WorkerError(f"the worker sent an unreadable error: {value!r}")
        if kind == "memory":
            raise WorkerMemoryError(f"the job needed more than {self.memory_mb} MB of memory")
        raise WorkerError(f"unexpected reply {kind!r} from a worker")

    async def warm(self, count: int = 1) -> None:
        """Have ``count`` workers (at most ``max_workers``) alive: start the missing ones, and wait.

        A worker that cannot start is logged, not raised: calls will report it.
        """
        if self._closed:
            return
        while len(self._workers) + len(self._starting) < min(count, self.max_workers):
            self._start_one()
        for starting in list(self._starting):
            try:
                await asyncio.shield(starting)
            except Exception as exc:  # noqa: BLE001 - the calls that need a worker report it
                logger.warning("%s worker could not start: %s", self.name, _describe_exception(exc))

    async def close(self, timeout: float = 5.0) -> None:
        """Stop every worker: idle ones are asked to exit, busy ones are killed; then reap them."""
        self._closed = True
        closed = WorkerPoolClosed(f"the {self.name} pool is shut down")
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(closed)
        for starting in list(self._starting):
            # Let it come up: its done-callback sees the pool closed and stops it.
            with contextlib.suppress(Exception):
                await asyncio.shield(starting)
        idle = set(self._idle)
        self._idle.clear()
        workers = list(self._workers)
        self._workers.clear()
        for worker in workers:
            if worker in idle:
                worker.stop()
            else:
                # Its caller sees the pipe end, raises WorkerPoolClosed and closes the pipe.
                worker.kill_process()
        dying = workers + self._dying
        self._dying = []
        if dying:
            await asyncio.to_thread(_reap_all, dying, timeout)

    # -- internals ---------------------------------------------------------------------------

    async def _acquire(self) -> _Worker:
        """An idle worker, or the first to become free (starting one if there is room)."""
        loop = asyncio.get_running_loop()
        while True:
            if self._closed:
                raise WorkerPoolClosed(f"the {self.name} pool is shut down")
            while self._idle:
                worker = self._idle.pop()
                if worker.alive():
                    return worker
                self._discard(worker)
            if len(self._workers) + len(self._starting) < self.max_workers:
                self._start_one()
            waiter: asyncio.Future[_Worker | None] = loop.create_future()
            self._waiters.append(waiter)
            try:
                handed = await waiter
            except asyncio.CancelledError:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
                elif waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                    # A worker (or a turn) was handed over just as we left: pass it on.
                    passed = waiter.result()
                    if passed is not None:
                        self._release(passed)
                    else:
                        self._wake_one()
                raise
            if handed is not None:
                if handed.alive():
                    return handed
                self._discard(handed)
            # None: a worker went away; look again (there may be room to start one now).

    def _start_one(self) -> None:
        """Start a worker in a thread; when it is up, it goes to a waiting caller or the idle ones."""
        # Workers killed earlier are collected in that thread too (already dead: no wait).
        dying, self._dying = self._dying, []
        starting = asyncio.get_running_loop().run_in_executor(None, self._spawn, dying)
        self._starting.add(starting)
        starting.add_done_callback(self._started)

    def _started(self, starting: asyncio.Future[_Worker]) -> None:
        self._starting.discard(starting)
        if starting.cancelled():
            self._wake_one()
            return
        error = starting.exception()
        if error is None:
            worker = starting.result()
            self._workers.add(worker)
            self.started += 1
            self._release(worker)
            return
        if not isinstance(error, WorkerError):
            error = WorkerError(f"could not start a worker process: {_describe_exception(error)}")
        logger.warning("%s worker could not start: %s", self.name, error)
        if not self._workers and not self._starting:
            # Nothing else will serve the callers waiting: they fail with the reason.
            while self._waiters:
                waiter = self._waiters.popleft()
                if not waiter.done():
                    waiter.set_exception(error)

    def _spawn(self, dying: Sequence[_Worker] = ()) -> _Worker:
        """Start a worker and wait for it to report ready (blocking: runs in a thread)."""
        _reap_all(dying, 1.0)
        parent_end, child_end = self._context.Pipe(duplex=True)
        process = self._context.Process(
            target=_worker_main,
            args=(child_end, self.memory_mb << 20),
            name=f"{self.name}-worker",
            daemon=True,  # never outlives the service
        )
        try:
            process.start()
        finally:
            child_end.close()
        worker = _Worker(process, parent_end)
        try:
            if not parent_end.poll(_WORKER_START_TIMEOUT_S):
                raise WorkerError(f"a worker did not start within {_WORKER_START_TIMEOUT_S:g} s")
            status, detail = parent_end.recv()
        except EOFError:
            worker.kill()
            worker.reap(1.0)
            logger.warning(
                "a %s worker ended while starting; a script that starts the service must do so "
                "under `if __name__ == '__main__':` (workers import the main module)",
                self.name,
            )
            raise WorkerError(f"a worker process ended while starting: {worker.exit_description()}") from None
        except BaseException:
            worker.kill()
            worker.reap(1.0)
            raise
        if status != "ready":
            worker.kill()
            worker.reap(1.0)
            raise WorkerError(str(detail))
        if detail is None:
            logger.warning("%s worker runs without a memory limit on this platform", self.name)
        return worker

    def _wake_one(self) -> None:
        """Tell the first waiting caller to look again (a worker went away: room to start one)."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _release(self, worker: _Worker) -> None:
        """A worker is free: hand it to the first waiting caller, or keep it idle."""
        if not self._closed:
            while self._waiters:
                waiter = self._waiters.popleft()
                if not waiter.done():
                    waiter.set_result(worker)
                    return
            if len(self._idle) < self.max_workers:
                self._idle.append(worker)
                return
        self._workers.discard(worker)
        worker.stop()
        self._dying.append(worker)

    def _discard(self, worker: _Worker) -> None:
        """Kill a worker that cannot be trusted with another job; a waiting caller may start one."""
        worker.kill()
        self._workers.discard(worker)
        if worker in self._idle:
            self._idle.remove(worker)
        self._dying.append(worker)
        if not self._closed:
            self._wake_one()

    async def _exchange(
        self, worker: _Worker, func: Callable[..., Any], args: tuple[Any, ...], timeout: float
    ) -> tuple[str, Any]:
        """Send one job and wait for its reply; raise WorkerTimeout or WorkerCrashed."""
        loop = asyncio.get_running_loop()
        try:
            # Small, and the worker is waiting for it: the pipe takes it without blocking.
            worker.conn.send((func, args, math.ceil(timeout) + 1))
        except (OSError, EOFError) as exc:
            raise WorkerCrashed(f"the worker process is gone ({_describe_exception(exc)})") from None
        readable: asyncio.Future[None] = loop.create_future()
        fd = worker.conn.fileno()
        loop.add_reader(fd, _wake, readable)
        try:
            async with asyncio.timeout(timeout):
                await readable
        except TimeoutError:
            raise WorkerTimeout(f"the job took longer than {timeout:g} s") from None
        finally:
            loop.remove_reader(fd)
        try:
            reply = worker.conn.recv()
        except (EOFError, OSError):
            # The pipe ends as the process exits: give it a moment to, for its exit status.
            with contextlib.suppress(Exception):
                await asyncio.to_thread(worker.process.join, 1.0)
            raise WorkerCrashed(
                f"the worker process stopped unexpectedly: {worker.exit_description()}"
            ) from None
        except Exception as exc:  # noqa: BLE001 - e.g. an exception that cannot be unpickled
            return ("error", WorkerError(f"unreadable reply: {_describe_exception(exc)}"))
        if not (isinstance(reply, tuple) and len(reply) == 2):
            raise WorkerCrashed(f"the worker sent an unexpected message: {reply!r:.80}")
        return reply


def _reap_all(workers: Sequence[_Worker], timeout: float) -> None:
    """Wait for stopped or killed workers to end, sharing one deadline (blocking)."""
    deadline = time.monotonic() + timeout
    for worker in workers:
        worker.reap(max(0.0, deadline - time.monotonic()))
