"""JSON from outside the process, parsed with a bound on its nesting.

Every JSON input a client sends (HTTP bodies, WebSocket messages, MCP messages, tokens) goes
through :func:`loads`, and so does every JSON the providers read from a model upstream (with a
bound of their own, :mod:`service.providers.upstream_json`). Python's parser refuses about a thousand levels with ``RecursionError``, and
shallower documents can still exhaust the stack later (validation and re-encoding recurse too),
so nesting past :data:`MAX_DEPTH` is refused up front as malformed input, a ``ValueError``
like any other.

Only strict JSON (RFC 8259) is read: ``json.loads`` takes ``NaN``, ``Infinity`` and
``-Infinity``, and turns a number too large for a float (``1e400``) into infinity, but no
strict parser on the other side (a browser's ``JSON.parse``, PostgreSQL's ``json``) takes them
back, so each is refused here as malformed JSON (:class:`NonFiniteNumber`, a ``ValueError``)
rather than stored and sent on. What the service writes is strict for the same reason: see
:func:`dumps`.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from pydantic_core import from_json

# Deeper than any request, message or tool input this service takes, far below the stack's limit.
MAX_DEPTH = 64


class JsonTooDeep(ValueError):
    """The document nests deeper than allowed."""

    def __init__(self, max_depth: int) -> None:
        super().__init__(f"nested more than {max_depth} levels deep")
        self.max_depth = max_depth


class NonFiniteNumber(ValueError):
    """The document holds ``NaN``, ``Infinity`` or a number too large for a float."""

    def __init__(self, text: str) -> None:
        super().__init__(f"{text} is not a JSON number (NaN, Infinity and numbers too large are refused)")


def _constant(name: str) -> Any:
    raise NonFiniteNumber(name)


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise NonFiniteNumber(text)
    return value


def strict_loads(data: str | bytes | bytearray) -> Any:
    """``json.loads(data)`` that refuses what is not strict JSON (:class:`NonFiniteNumber`)."""
    return json.loads(data, parse_constant=_constant, parse_float=_finite)


# Only a number written with an exponent of three digits or more, or with two hundred digits
# before it (an exponent of two digits adds at most 99), can be too large for a float; a
# document without either needs no look at its floats.
_HUGE_TEXT = re.compile(r"[eE]\+?[0-9]{3}|[0-9]{200}")
_HUGE_BYTES = re.compile(_HUGE_TEXT.pattern.encode())


def parse(data: str | bytes | bytearray) -> Any:
    """:func:`strict_loads`, read by pydantic's JSON parser where it can.

    pydantic-core's parser (a dependency already) reads a model's chunk in a quarter of the time
    ``json.loads`` takes, and a provider reads one per token. It gives what :func:`strict_loads`
    gives for what both read (a property test holds it to that); what it refuses (bad JSON, but
    also lone surrogates, nesting past 200 levels, UTF-16 bytes, a str it cannot encode) goes to
    :func:`strict_loads`, whose answer or error then stands, so nothing is accepted or refused
    differently.
    """
    try:
        value = from_json(data, allow_inf_nan=False)
    except (ValueError, TypeError):  # TypeError: a str it cannot encode (a lone surrogate in it)
        return strict_loads(data)
    # from_json reads 1e400 as infinity whatever allow_inf_nan says.
    huge = _HUGE_TEXT if isinstance(data, str) else _HUGE_BYTES
    if huge.search(data) is not None and not finite(value):  # type: ignore[arg-type]
        return strict_loads(data)  # raises NonFiniteNumber, as json.loads with the hook would
    return value


def loads(data: str | bytes | bytearray, *, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads`` that raises :class:`JsonTooDeep` (a ``ValueError``) past ``max_depth``."""
    try:
        value = parse(data)
    except RecursionError:
        raise JsonTooDeep(max_depth) from None
    # Counting brackets is cheap: a document with fewer than max_depth of them can't be too deep.
    if isinstance(data, str):
        brackets = data.count("[") + data.count("{")
    else:
        brackets = data.count(b"[") + data.count(b"{")
    if brackets > max_depth and too_deep(value, max_depth):
        raise JsonTooDeep(max_depth)
    return value


def finite(value: Any) -> bool:
    """False when ``value`` (parsed JSON) holds a float that is NaN or infinite."""
    stack: list[Any] = [value]
    while stack:
        node = stack.pop()
        if type(node) is float:
            if not math.isfinite(node):
                return False
        elif isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return True


_ENCODER = json.JSONEncoder(allow_nan=False)


def dumps(value: Any) -> str:
    """``json.dumps(value)``, but strict: a NaN or infinite float raises ``ValueError`` rather
    than being written as ``NaN`` or ``Infinity``, which strict parsers refuse."""
    return _ENCODER.encode(value)


def too_deep(value: Any, max_depth: int = MAX_DEPTH) -> bool:
    """True when ``value`` (parsed JSON) nests lists and objects more than ``max_depth`` deep."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth > max_depth:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False
