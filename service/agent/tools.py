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

The calculator evaluates arithmetic by walking the syntax tree that :func:`ast.parse` builds; it
never runs Python code, and it refuses inputs whose evaluation would be expensive *before*
computing them (huge powers, factorials, deep nesting), so a hostile expression costs nothing.
"""

from __future__ import annotations

import abc
import ast
import asyncio
import inspect
import logging
import math
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

logger = logging.getLogger(__name__)

__all__ = [
    "Calculator",
    "CalculatorError",
    "FunctionTool",
    "Tool",
    "ToolExecutor",
    "ToolOutcome",
    "ToolSource",
    "builtin_tools",
    "evaluate",
    "format_number",
]

Number = int | float

# Bedrock (and Anthropic) reject other tool names, so refuse them when registering rather than
# on the first request to the model.
_TOOL_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


# --------------------------------------------------------------------------------------------
# Tools
# --------------------------------------------------------------------------------------------


class Tool(abc.ABC):
    """A tool the model may call."""

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


class ToolExecutor:
    """Runs the model's tool calls with a timeout, turning every failure into an error outcome."""

    def __init__(
        self,
        tools: Iterable[Tool] = (),
        *,
        timeout: float = 30.0,
        max_result_chars: int = 100_000,
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
    if value.bit_length() > MAX_INT_BITS:
        raise CalculatorError(f"integer result too large (limit is {MAX_INT_BITS} bits)")


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
        if bits > 1 and (bits - 1) * exponent >= MAX_INT_BITS:
            raise CalculatorError(f"integer result too large (limit is {MAX_INT_BITS} bits)")
    return base**exponent


def _factorial(n: Number) -> int:
    value = _as_int("factorial", n)
    if not 0 <= value <= MAX_FACTORIAL:
        raise CalculatorError(f"factorial() needs an integer from 0 to {MAX_FACTORIAL}")
    return math.factorial(value)


def _comb_perm(func: Callable[..., int], name: str) -> Callable[..., int]:
    def call(*args: Number) -> int:
        ints = [_as_int(name, a) for a in args]
        if any(abs(i) > MAX_COMB_ARG for i in ints):
            raise CalculatorError(f"{name}() arguments must be at most {MAX_COMB_ARG}")
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
    digits = max(-_MAX_ROUND_DIGITS, min(_MAX_ROUND_DIGITS, digits))
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


def _check_size(tree: ast.Expression) -> None:
    # Count only expression nodes: contexts and operator tokens are not work.
    nodes = sum(1 for n in ast.walk(tree) if isinstance(n, ast.expr))
    if nodes > MAX_NODES:
        raise CalculatorError(f"expression too complex: {nodes} parts (limit is {MAX_NODES})")
    # Iterative, so a deep tree cannot exhaust the interpreter's stack before being refused.
    deepest = 0
    stack: list[tuple[ast.AST, int]] = [(tree.body, 1)]
    while stack:
        current, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend(
            (child, depth + 1) for child in ast.iter_child_nodes(current) if isinstance(child, ast.expr)
        )
    if deepest > MAX_DEPTH:
        raise CalculatorError(f"expression nested too deeply (limit is {MAX_DEPTH} levels)")


def evaluate(expression: str) -> int | float:
    """Evaluate an arithmetic expression safely; raises CalculatorError with a clear message."""
    if not isinstance(expression, str):
        raise CalculatorError(f"expression must be a string, got {type(expression).__name__}")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(
            f"expression too long: {len(expression)} characters (limit is {MAX_EXPRESSION_CHARS})"
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
    _check_size(tree)
    return _evaluate_node(tree)


class Calculator(Tool):
    """Evaluates arithmetic expressions exactly and safely."""

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

    async def call(self, input: dict[str, Any]) -> str:
        """Evaluate ``input["expression"]`` and return the number as text."""
        expression = input.get("expression")
        if not isinstance(expression, str):
            raise CalculatorError("input needs an 'expression' string")
        # Cheap by construction (everything costly is refused up front), so no thread needed.
        return format_number(evaluate(expression))


def builtin_tools() -> list[Tool]:
    """The tools every agent gets."""
    return [Calculator()]
