"""JSON from outside the process, parsed with a bound on its nesting.

Every JSON input a client sends (HTTP bodies, WebSocket messages, MCP messages, tokens) goes
through :func:`loads`, and so does every JSON the providers read from a model upstream (with a
bound of their own, :mod:`service.providers.upstream_json`). Python's parser refuses about a thousand levels with ``RecursionError``, and
shallower documents can still exhaust the stack later (validation and re-encoding recurse too),
so nesting past :data:`MAX_DEPTH` is refused up front as malformed input, a ``ValueError``
like any other.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic_core import from_json

# Deeper than any request, message or tool input this service takes, far below the stack's limit.
MAX_DEPTH = 64


class JsonTooDeep(ValueError):
    """The document nests deeper than allowed."""

    def __init__(self, max_depth: int) -> None:
        super().__init__(f"nested more than {max_depth} levels deep")
        self.max_depth = max_depth


def parse(data: str | bytes | bytearray) -> Any:
    """``json.loads(data)``, read by pydantic's JSON parser where it can.

    pydantic-core's parser (a dependency already) reads a model's chunk in a quarter of the time
    ``json.loads`` takes, and a provider reads one per token. It gives what ``json.loads`` gives
    for what both read (a property test holds it to that); what it refuses (bad JSON, but also
    lone surrogates, nesting past 200 levels, UTF-16 bytes, a str it cannot encode) goes to ``json.loads``, whose answer
    or error then stands, so nothing is accepted or refused differently.
    """
    try:
        return from_json(data)
    except (ValueError, TypeError):  # TypeError: a str it cannot encode (a lone surrogate in it)
        return json.loads(data)


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
