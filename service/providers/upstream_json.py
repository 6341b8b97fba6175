"""JSON from a model upstream, read so that nesting too deep is bad JSON rather than a crash.

``json.loads`` raises RecursionError on JSON nested about a thousand levels deep, and JSON some
hundreds of levels deep parses but cannot go on: pydantic stops serialising an event at about
200 levels, and the conversation is sent back to the model. Every JSON the providers read from
an upstream (stream chunks, tool inputs, error bodies) goes through :func:`loads`, which refuses
anything deeper than :data:`MAX_DEPTH` with the ValueError any other malformed JSON gives, so
each caller's handling of bad JSON covers it too. ``NaN``, ``Infinity`` and numbers too large
for a float are refused the same way (:mod:`service.jsonsafe`): a tool input holding one
becomes an error result the model reads, not a value written on as ``NaN``.
"""

from __future__ import annotations

from typing import Any

from service import jsonsafe

__all__ = ["MAX_DEPTH", "loads"]

# Far deeper than any chunk or tool input a model sends, and far below what breaks downstream.
MAX_DEPTH = 100


def loads(text: str | bytes, *, finite_only: bool = True) -> Any:
    """``json.loads``; JSON nested deeper than :data:`MAX_DEPTH`, ``NaN`` or ``Infinity``, and
    (unless ``finite_only`` is false) a number too large for a float raise ValueError like bad
    JSON does (:func:`service.jsonsafe.loads`)."""
    return jsonsafe.loads(text, max_depth=MAX_DEPTH, finite_only=finite_only)
