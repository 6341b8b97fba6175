"""JSON from a model upstream, read so that nesting too deep is bad JSON rather than a crash.

``json.loads`` raises RecursionError on JSON nested about a thousand levels deep, and JSON some
hundreds of levels deep parses but cannot go on: pydantic stops serialising an event at about
200 levels, and the conversation is sent back to the model. Every JSON the providers read from
an upstream (stream chunks, tool inputs, error bodies) goes through :func:`loads`, which refuses
anything deeper than :data:`MAX_DEPTH` with the ValueError any other malformed JSON gives, so
each caller's handling of bad JSON covers it too.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["MAX_DEPTH", "loads"]

# Far deeper than any chunk or tool input a model sends, and far below what breaks downstream.
MAX_DEPTH = 100


def loads(text: str | bytes) -> Any:
    """``json.loads``; JSON nested deeper than :data:`MAX_DEPTH` raises ValueError like bad JSON does."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError(f"JSON nested more than {MAX_DEPTH} levels deep") from None
    # Each level opens with a bracket, so text with few of them cannot be deep: no walk needed.
    if _brackets(text) > MAX_DEPTH and _deeper_than(value, MAX_DEPTH):
        raise ValueError(f"JSON nested more than {MAX_DEPTH} levels deep")
    return value


def _brackets(text: str | bytes) -> int:
    if isinstance(text, str):
        return text.count("{") + text.count("[")
    return text.count(b"{") + text.count(b"[")


def _deeper_than(value: Any, limit: int) -> bool:
    """True when ``value`` nests objects and arrays more than ``limit`` levels deep (no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth + 1 > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False
