"""Wire dialects: pure functions from a canonical event to its wire payload.

``None`` means the dialect does not show that event. Field names are contracts
(../shared/DESIGN.md): fields may be added, never renamed or removed.
"""

from __future__ import annotations

from typing import Any

from service.core.events import (
    Event,
    ReasoningDelta,
    RunDone,
    RunError,
    TextDelta,
    ToolExecuting,
    ToolInputDelta,
    ToolResult,
    ToolUseStart,
    Usage,
)


def usage_dict(usage: Usage) -> dict[str, int]:
    """Usage as every wire names it."""
    return {
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "total_tokens": usage.total_tokens,
    }


def agent(event: Event) -> dict[str, Any] | None:
    """The **agent** dialect of ``POST /agent/stream`` (seed 001 §2)."""
    if isinstance(event, TextDelta):
        return {"type": "text_delta", "text": event.text}
    if isinstance(event, ToolInputDelta):
        return {"type": "tool_input_delta", "delta": event.delta, "id": event.tool_use_id}
    if isinstance(event, ToolUseStart):
        return {"type": "tool_use_start", "tool": event.tool, "id": event.tool_use_id}
    if isinstance(event, ToolExecuting):
        return {"type": "tool_executing", "tool": event.tool, "id": event.tool_use_id}
    if isinstance(event, ToolResult):
        payload: dict[str, Any] = {
            "type": "tool_result",
            "tool": event.tool,
            "result": event.result,
            "id": event.tool_use_id,
        }
        if event.is_error:
            payload["is_error"] = True
        return payload
    if isinstance(event, ReasoningDelta):
        return {"type": "reasoning_delta", "text": event.text}
    if isinstance(event, RunDone):
        done: dict[str, Any] = {
            "type": "done",
            "turns": event.turns,
            "tool_calls": [
                {"tool": call.tool, "input": call.input, "tool_use_id": call.tool_use_id}
                | ({"is_error": True} if call.is_error else {})
                for call in event.tool_calls
            ],
            "usage": usage_dict(event.usage),
            "stop_reason": event.stop_reason,
        }
        if event.truncated:
            done["truncated"] = True
        if event.max_turns_reached:
            done["max_turns_reached"] = True
        if event.cancelled:
            done["cancelled"] = True
        return done
    if isinstance(event, RunError):
        return {
            "type": "error",
            "error": event.error,
            "turns": event.turns,
            "code": event.code,
            "recoverable": event.recoverable,
        }
    return None
