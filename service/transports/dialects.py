"""Wire dialects: pure functions from a canonical event to its wire payload.

``None`` means the dialect does not show that event. Field names are contracts
(../shared/DESIGN.md): fields may be added, never renamed or removed. Each payload is a plain
dict of its type in :mod:`service.transports.payloads`, which ``GET /openapi.json`` publishes.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from service.core.events import (
    ContextTrimmed,
    Event,
    PlanCreated,
    ReasoningDelta,
    RunDone,
    RunError,
    RunStarted,
    StatusChange,
    StepCompleted,
    TextDelta,
    ToolApprovalRequest,
    ToolApprovalResponse,
    ToolCall,
    ToolExecuting,
    ToolInputDelta,
    ToolResult,
    ToolUse,
    ToolUseStart,
    TurnCompleted,
    Usage,
)
from service.core.log import LogEntry
from service.jsonsafe import dumps, quote
from service.transports import payloads


def usage_dict(usage: Usage) -> payloads.Usage:
    """Usage as every wire names it."""
    return {
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "total_tokens": usage.total_tokens,
    }


def agent(event: Event) -> payloads.AgentEvent | None:
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
        payload: payloads.AgentToolResult = {
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
        done: payloads.AgentDone = {
            "type": "done",
            "turns": event.turns,
            "tool_calls": [_call(call, result=False) for call in event.tool_calls],
            "usage": usage_dict(event.usage),
            "stop_reason": event.stop_reason,
        }
        _flag(done, event)
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


def _done_fields(event: RunDone) -> payloads.DoneFields:
    fields: payloads.DoneFields = {
        "turns": event.turns,
        "output": event.output,
        "tool_calls": [_call(call) for call in event.tool_calls],
        "usage": usage_dict(event.usage),
        "stop_reason": event.stop_reason,
    }
    _flag(fields, event)
    return fields


def _flag(payload: payloads.EndFields, event: RunDone) -> None:
    # Only the flags that are set: a client reads a missing one as false.
    if event.truncated:
        payload["truncated"] = True
    if event.max_turns_reached:
        payload["max_turns_reached"] = True
    if event.cancelled:
        payload["cancelled"] = True


def _call(call: ToolCall, *, result: bool = True) -> payloads.ToolCall:
    payload: payloads.ToolCall = {"tool": call.tool, "input": call.input, "tool_use_id": call.tool_use_id}
    if result and call.result is not None:
        payload["result"] = call.result
    if call.is_error:
        payload["is_error"] = True
    return payload


def session(event: Event) -> payloads.SessionPayload:
    """The **session** dialect (seed 002, plus the types this service adds).

    Every canonical event has a session form, so the ids a session client sees are contiguous.
    The SSE event name is the ``type``.
    """
    if isinstance(event, TextDelta):
        return {"type": "assistant_text", "text": event.text}
    if isinstance(event, ToolInputDelta):
        return {"type": "tool_input_delta", "toolUseId": event.tool_use_id, "delta": event.delta}
    if isinstance(event, ToolUseStart):
        return {"type": "tool_use_start", "toolName": event.tool, "toolUseId": event.tool_use_id}
    if isinstance(event, ToolUse):
        return {
            "type": "tool_use",
            "toolName": event.tool,
            "toolInput": event.input,
            "toolUseId": event.tool_use_id,
        }
    if isinstance(event, ToolExecuting):
        return {"type": "tool_executing", "toolName": event.tool, "toolUseId": event.tool_use_id}
    if isinstance(event, ToolResult):
        return {
            "type": "tool_result",
            "toolUseId": event.tool_use_id,
            "toolName": event.tool,
            "result": event.result,
            "isError": event.is_error,
        }
    if isinstance(event, ReasoningDelta):
        return {"type": "reasoning_text", "text": event.text}
    if isinstance(event, StatusChange):
        return {"type": "status_change", "status": event.status}
    if isinstance(event, RunStarted):
        return {"type": "processing", "run_id": event.run_id, "message": event.message}
    if isinstance(event, TurnCompleted):
        return {
            "type": "usage",
            "turn": event.turn,
            "stop_reason": event.stop_reason,
            "usage": usage_dict(event.usage),
            "total_usage": usage_dict(event.total_usage),
            "latency_ms": event.latency_ms,
        }
    if isinstance(event, PlanCreated):
        return {"type": "plan", "plan": event.plan, "usage": usage_dict(event.usage)}
    if isinstance(event, ContextTrimmed):
        return {
            "type": "context_trimmed",
            "turn": event.turn,
            "dropped_messages": event.dropped_messages,
            "kept_messages": event.kept_messages,
            "estimated_tokens": event.estimated_tokens,
            "max_tokens": event.max_tokens,
        }
    if isinstance(event, StepCompleted):
        return {
            "type": "step",
            "turn": event.turn,
            "step_number": event.step_number,
            "text": event.text,
            "tool_calls": [_call(call) for call in event.tool_calls],
            "error": event.error,
            "usage": usage_dict(event.usage),
        }
    if isinstance(event, RunDone):
        return {"type": "done", **_done_fields(event)}
    if isinstance(event, ToolApprovalRequest):
        return {
            "type": "tool_approval_request",
            "approval_id": event.approval_id,
            "toolUseId": event.tool_use_id,
            "toolName": event.tool,
            "toolInput": event.input,
            "expires_at": event.expires_at,
        }
    if isinstance(event, ToolApprovalResponse):
        answer: payloads.ApprovalResponse = {
            "type": "tool_approval_response",
            "approval_id": event.approval_id,
            "approved": event.approved,
            "reason": event.reason,
            "by": event.by,
        }
        if event.input is not None:
            answer["toolInput"] = event.input
        return answer
    if isinstance(event, RunError):
        return {
            "type": "error",
            "message": event.error,
            "recoverable": event.recoverable,
            "code": event.code,
            "turns": event.turns,
            "usage": usage_dict(event.usage),
        }
    raise TypeError(f"no session form for {type(event).__name__}")


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def steps(event: Event) -> list[payloads.StepsEvent]:
    """The **steps** dialect (seed 000): message, step (planning / action), final, done, error."""
    if isinstance(event, RunStarted):
        return [{"type": "message", "role": "user", "content": event.message, "timestamp": _iso(event.at)}]
    if isinstance(event, PlanCreated):
        return [
            {
                "type": "step",
                "step_type": "planning",
                "step_number": 1,
                "plan": event.plan,
                "token_usage": usage_dict(event.usage),
            }
        ]
    if isinstance(event, StepCompleted):
        calls = [{"tool": call.tool, "input": call.input} for call in event.tool_calls]
        return [
            {
                "type": "step",
                "step_type": "action",
                "step_number": event.step_number,
                "model_output": event.text,
                "code_action": json.dumps(calls, allow_nan=False) if calls else None,
                "observations": "\n".join(event.observations) if event.observations else None,
                "error": event.error,
                "token_usage": usage_dict(event.usage),
            }
        ]
    if isinstance(event, ToolApprovalRequest):
        return [
            {
                "type": "step",
                "step_type": "approval",
                "approval_id": event.approval_id,
                "tool": event.tool,
                "input": event.input,
                "expires_at": event.expires_at,
            }
        ]
    if isinstance(event, RunDone):
        frames: list[payloads.StepsEvent] = []
        if not event.cancelled:
            frames.append({"type": "final", "step_number": event.final_step, "output": event.output})
        frames.append({"type": "done", **_done_fields(event)})
        return frames
    if isinstance(event, RunError):
        return [{"type": "error", "error": event.error, "code": event.code}]
    return []


def session_frame(entry: LogEntry) -> tuple[str, str]:
    """The entry's session-dialect event name and JSON (with ``id`` and ``ts``), made once per entry."""
    cached = entry.encoded.get("session")
    if cached is None:
        event = entry.event
        if type(event) is TextDelta:
            # Most events are text deltas: written straight, the very JSON dumps(session_payload())
            # gives, without building its dict, which makes a token's projection much cheaper
            # (measured: docs/benchmarks.md, section Per-token budget).
            data = (
                f'{{"type":"assistant_text","text":{_string(event.text)},'
                f'"id":{entry.id},"ts":{round(entry.ts, 6)!r}}}'
            )
            cached = entry.encoded["session"] = ("assistant_text", data)
        else:
            payload = session_payload(entry)
            cached = entry.encoded["session"] = (payload["type"], dumps(payload))
    return cached


def agent_block(event: Event) -> str | None:
    """The event's whole SSE block in the agent dialect (``None`` when it does not show it)."""
    if type(event) is TextDelta:
        return f'data: {{"type":"text_delta","text":{_string(event.text)}}}{SSE_SEP}{SSE_SEP}'
    payload = agent(event)
    return None if payload is None else sse_block(dumps(payload))


SSE_SEP = "\r\n"  # aiohttp-sse's separator, so every frame of a stream looks the same


def sse_block(data: str, *, id: int | str | None = None, event: str | None = None) -> str:
    """One SSE event block; ``data`` is compact JSON (one line)."""
    head = "" if id is None else f"id: {id}{SSE_SEP}"
    if event is not None:
        head += f"event: {event}{SSE_SEP}"
    return f"{head}data: {data}{SSE_SEP}{SSE_SEP}"


def session_sse(entry: LogEntry) -> bytes:
    """The entry's whole SSE block in the session dialect, encoded once for every subscriber."""
    cached = entry.encoded.get("sse")
    if cached is None:
        name, data = session_frame(entry)
        cached = entry.encoded["sse"] = sse_block(data, id=entry.id, event=name).encode()
    return cached


def merge_text_runs(batch: list[LogEntry]) -> list[tuple[int, str, str]]:
    """A lagging reader's batch with each run of adjacent text deltas merged into one event.

    The merged event carries the last merged id (so resuming from it loses nothing) and
    ``first_id``, the first one; nothing is lost, and there are far fewer writes.
    """
    frames: list[tuple[int, str, str]] = []
    run: list[LogEntry] = []

    def flush() -> None:
        if len(run) == 1:
            frames.append((run[0].id, *session_frame(run[0])))
        elif run:
            text = "".join(entry.event.text for entry in run)  # type: ignore[union-attr]
            payload: payloads.AssistantText = {
                "type": "assistant_text",
                "text": text,
                "id": run[-1].id,
                "first_id": run[0].id,
                "ts": round(run[-1].ts, 6),
            }
            frames.append((run[-1].id, "assistant_text", dumps(payload)))
        run.clear()

    for entry in batch:
        if isinstance(entry.event, TextDelta):
            run.append(entry)
            continue
        flush()
        frames.append((entry.id, *session_frame(entry)))
    flush()
    return frames


def ws_frame(session_id: str, data: str) -> str:
    """A session-dialect JSON payload as a WebSocket frame: the same fields plus ``session_id``."""
    return f'{{"session_id":{json.dumps(session_id)},{data[1:]}'


def session_payload(entry: LogEntry) -> payloads.SessionPayload:
    """The entry's session-dialect payload as a dict with ``id`` and ``ts`` (for JSON replies)."""
    payload = session(entry.event)
    payload["id"] = entry.id
    payload["ts"] = round(entry.ts, 6)
    return payload


# The service's one JSON codec is service.jsonsafe; a string's JSON as it writes one.
_string = quote
