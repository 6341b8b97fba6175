"""The calculator's evaluator: arithmetic on the syntax tree, bounded before it is computed.

:func:`evaluate` walks the tree that :func:`ast.parse` builds; it never runs Python code, and it
refuses inputs whose evaluation would be expensive *before* computing them (long inputs, many or
deeply nested parts, huge powers, factorials), so a hostile expression costs nothing. Those
checks (:class:`CalculatorLimits`) are the first line of defence; the second is where the
:class:`~service.agent.calculator.Calculator` tool runs :func:`calculate`: a worker process with
a hard memory and time limit.

This module imports nothing of the service, so a worker process loads only it.
"""

from __future__ import annotations

import ast
import contextvars
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CalculatorError",
    "CalculatorLimits",
    "DEFAULT_LIMITS",
    "FUNCTION_NAMES",
    "Number",
    "calculate",
    "evaluate",
    "format_number",
    "parse_expression",
]

Number = int | float


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
# What the calculator tool's description lists.
FUNCTION_NAMES: tuple[str, ...] = tuple(_FUNCTIONS)


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
    :class:`~service.agent.calculator.Calculator` tool runs it in a worker process (see
    :func:`calculate`).
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
