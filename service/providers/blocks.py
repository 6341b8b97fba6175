"""The pieces both stream parsers assemble a turn from: content blocks, token usage, numbers.

A block gathers its deltas and gives itself back in Bedrock's message format, the one format
the agent loop keeps the conversation in whatever the provider. A tool-use block gathers its
input as JSON text and parses it when the block stops; a bad input (malformed, nested too deep,
not an object) is recorded on the tool use for the model to read, never raised.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from service.core.events import Usage
from service.providers import upstream_json
from service.providers.base import PendingToolUse

__all__ = ["Block", "ReasoningBlock", "TextBlock", "ToolBlock", "as_int", "usage_from"]


@dataclass
class TextBlock:
    """State of a text block; Bedrock opens it with its first delta, not with a start event."""

    parts: list[str] = field(default_factory=list)
    closed: bool = False

    def content(self) -> dict[str, Any] | None:
        """The block as Bedrock expects it back, or None when it must be left out."""
        text = "".join(self.parts)
        # Bedrock rejects a conversation holding a blank text block, so an empty one is dropped.
        return {"text": text} if text.strip() else None


@dataclass
class ToolBlock:
    """State of a tool-use block: its input arrives as JSON text in fragments."""

    tool: str
    tool_use_id: str
    parts: list[str] = field(default_factory=list)
    closed: bool = False
    pending: PendingToolUse | None = None

    def close(self) -> PendingToolUse:
        """Parse the gathered input; never raises, a bad input is recorded instead."""
        raw = "".join(self.parts).strip()
        parsed: Any = {}
        error: str | None = None
        if raw:
            try:
                value = upstream_json.loads(raw)
            except ValueError as exc:
                error = f"tool input is not valid JSON: {exc}"
            else:
                if isinstance(value, dict):
                    parsed = value
                else:
                    error = f"tool input is not a JSON object: got {type(value).__name__}"
        self.closed = True
        self.pending = PendingToolUse(self.tool, self.tool_use_id, parsed, error)
        return self.pending

    def content(self) -> dict[str, Any]:
        """The block as Bedrock expects it back."""
        parsed = self.pending.input if self.pending is not None else {}
        return {"toolUse": {"toolUseId": self.tool_use_id, "name": self.tool, "input": parsed}}


@dataclass
class ReasoningBlock:
    """State of a reasoning block: visible text plus signature, or opaque redacted bytes."""

    parts: list[str] = field(default_factory=list)
    signature_parts: list[str] = field(default_factory=list)
    redacted: bytearray | None = None
    closed: bool = False

    def content(self) -> dict[str, Any] | None:
        """The block as Bedrock expects it back, or None when nothing arrived."""
        if self.redacted is not None:
            return {"reasoningContent": {"redactedContent": bytes(self.redacted)}}
        text = "".join(self.parts)
        signature = "".join(self.signature_parts)
        if not text and not signature:
            return None
        reasoning: dict[str, Any] = {"text": text}
        if signature:
            reasoning["signature"] = signature
        return {"reasoningContent": {"reasoningText": reasoning}}


Block = TextBlock | ToolBlock | ReasoningBlock


def usage_from(raw: dict[str, Any], input_key: str, output_key: str, total_key: str) -> Usage:
    """Usage from a provider's own field names; a missing total is the sum."""
    input_tokens = as_int(raw.get(input_key)) or 0
    output_tokens = as_int(raw.get(output_key)) or 0
    total = as_int(raw.get(total_key))
    return Usage(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        total_tokens=total if total is not None else input_tokens + output_tokens,
    )


def as_int(value: Any) -> int | None:
    """``value`` as an int, or None when it is not a finite number."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value):  # botocore's parser reads NaN too
        return int(value)
    return None
