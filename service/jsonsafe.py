"""JSON from outside the process, parsed with a bound on its nesting.

Every JSON input a client sends (HTTP bodies, WebSocket messages, MCP messages, tokens) goes
through :func:`loads`, and so does every JSON the providers read from a model upstream (with a
bound of their own, :mod:`service.providers.upstream_json`). Python's parser refuses about a thousand levels with ``RecursionError``, and
shallower documents can still exhaust the stack later (validation and re-encoding recurse too),
so nesting past :data:`MAX_DEPTH` is refused up front as malformed input, a ``ValueError``
like any other.

Only strict JSON (RFC 8259) is read. ``json.loads`` takes ``NaN``, ``Infinity`` and
``-Infinity``, and reads a number too large for a float (``1e400``) as infinity, but a
browser's ``JSON.parse`` and PostgreSQL take none of them back: :func:`parse` refuses the three
names, and :func:`loads` also a number too large, each a :class:`NonFiniteNumber` (a
``ValueError``, malformed JSON like any other). What the service writes is strict for the same
reason (:func:`dumps`).
"""

from __future__ import annotations

import base64
import json
import math
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
    """The document holds ``NaN``, ``Infinity`` or ``-Infinity``, or a number too large for a float."""

    def __init__(self, what: str) -> None:
        super().__init__(
            f"{what} is not a JSON number: NaN, Infinity and numbers too large for a float are refused"
        )


def _constant(name: str) -> Any:
    raise NonFiniteNumber(name)


def strict_loads(data: str | bytes | bytearray) -> Any:
    """``json.loads(data)``, refusing ``NaN``, ``Infinity`` and ``-Infinity``
    (:class:`NonFiniteNumber`); like it, it reads ``1e400`` as infinity."""
    return json.loads(data, parse_constant=_constant)


def parse(data: str | bytes | bytearray) -> Any:
    """:func:`strict_loads`, read by pydantic's JSON parser where it can.

    pydantic-core's parser (a dependency already) reads a model's chunk in a fraction of the time
    ``json.loads`` takes (measured: docs/benchmarks.md, section Counters and JSON off the
    per-token path (6034038)), and a provider reads one per token. It gives what
    :func:`strict_loads` gives for what both read (a property test holds it to that); what it
    refuses (bad JSON, but also lone surrogates, nesting past 200 levels, UTF-16 bytes, a str it
    cannot encode) goes to :func:`strict_loads`, whose answer or error then stands, so nothing is
    accepted or refused differently. A number too large for a float is read as infinity by both,
    as ``json.loads`` reads it: looking for one costs a walk of every chunk, so :func:`loads` does
    it, not this.
    """
    try:
        return from_json(data, allow_inf_nan=False)
    except (ValueError, TypeError):  # TypeError: a str it cannot encode (a lone surrogate in it)
        return strict_loads(data)


def loads(data: str | bytes | bytearray, *, max_depth: int = MAX_DEPTH, finite_only: bool = True) -> Any:
    """:func:`parse`, refusing nesting past ``max_depth`` (:class:`JsonTooDeep`) and, unless
    ``finite_only`` is false, a number too large for a float (:class:`NonFiniteNumber`); both
    are ``ValueError``."""
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
    if finite_only and not finite(value):
        raise NonFiniteNumber("a number too large for a float (such as 1e400)")
    return value


def loads_object(text: str) -> dict[str, Any] | None:
    """A tool call's arguments as a JSON object (blank text: an empty one); None when the text is
    not a JSON object."""
    if not text.strip():
        return {}
    try:
        value = loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def arguments_text(value: Any) -> str:
    """A tool input as a call's ``arguments`` (None: an empty object), the inverse of
    :func:`loads_object`."""
    return json.dumps(value if value is not None else {}, separators=(",", ":"), allow_nan=False)


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


def _default(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode("ascii")
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


# The one encoder of everything the service writes (every wire, the database, Redis): compact,
# UTF-8, bytes (redacted reasoning) as base64. json.dumps with options would build one per call.
# Strict: a NaN or infinity raises rather than going out as ``NaN``, which no browser's
# JSON.parse reads; the edges refuse them, so one here is a bug.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=_default, allow_nan=False)
# A string as JSON, as dumps writes it (ensure_ascii=False): for writers that put JSON together
# from parts.
quote = json.encoder.encode_basestring


def dumps(value: Any) -> str:
    """``value`` as compact strict JSON; ``ValueError`` on a NaN or an infinity."""
    return _ENCODER.encode(value)


def jsonable(value: Any) -> Any:
    """``value`` with bytes turned to base64 text, so it can go into a JSON reply."""
    return json.loads(dumps(value))


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
