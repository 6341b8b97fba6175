"""The **session** dialect: the service's own event payload, which the session SSE stream, the
WebSocket, MCP's notifications, polling and every JSON reply that shows an event carry.

A pure table from a canonical event type to its payload. Field names are contracts
(../shared/DESIGN.md): fields may be added, never renamed or removed. Each payload is a plain dict
of its type in :mod:`service.transports.stream.payloads`, which ``GET /openapi.json`` publishes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from service.core.events import (
    ClientToolRequest,
    ClientToolResult,
    ContextTrimmed,
    ConversationRewound,
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
from service.core.sessions import Session
from service.jsonsafe import dumps, quote
from service.transports.stream import payloads
from service.transports.stream.frames import sse_block


def usage_dict(usage: Usage) -> payloads.Usage:
    """Usage as every wire names it."""
    return {
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "total_tokens": usage.total_tokens,
    }


def done_fields(event: RunDone) -> payloads.DoneFields:
    fields: payloads.DoneFields = {
        "turns": event.turns,
        "output": event.output,
        "tool_calls": [tool_call(call) for call in event.tool_calls],
        "usage": usage_dict(event.usage),
        "stop_reason": event.stop_reason,
    }
    flag(fields, event)
    return fields


def flag(payload: payloads.EndFields, event: RunDone) -> None:
    # Only the flags that are set: a client reads a missing one as false.
    if event.truncated:
        payload["truncated"] = True
    if event.max_turns_reached:
        payload["max_turns_reached"] = True
    if event.cancelled:
        payload["cancelled"] = True
    if event.agent:
        payload["agent"] = event.agent


def tool_call(call: ToolCall, *, result: bool = True) -> payloads.ToolCall:
    payload: payloads.ToolCall = {"tool": call.tool, "input": call.input, "tool_use_id": call.tool_use_id}
    if result and call.result is not None:
        payload["result"] = call.result
    if call.is_error:
        payload["is_error"] = True
    return payload


def _tool_use(event: ToolUse) -> payloads.SessionPayload:
    return {
        "type": "tool_use",
        "toolName": event.tool,
        "toolInput": event.input,
        "toolUseId": event.tool_use_id,
    }


def _tool_result(event: ToolResult) -> payloads.SessionPayload:
    return {
        "type": "tool_result",
        "toolUseId": event.tool_use_id,
        "toolName": event.tool,
        "result": event.result,
        "isError": event.is_error,
    }


def _turn(event: TurnCompleted) -> payloads.SessionPayload:
    return {
        "type": "usage",
        "turn": event.turn,
        "stop_reason": event.stop_reason,
        "usage": usage_dict(event.usage),
        "total_usage": usage_dict(event.total_usage),
        "latency_ms": event.latency_ms,
    }


def _trimmed(event: ContextTrimmed) -> payloads.SessionPayload:
    return {
        "type": "context_trimmed",
        "turn": event.turn,
        "dropped_messages": event.dropped_messages,
        "kept_messages": event.kept_messages,
        "estimated_tokens": event.estimated_tokens,
        "max_tokens": event.max_tokens,
    }


def _step(event: StepCompleted) -> payloads.SessionPayload:
    return {
        "type": "step",
        "turn": event.turn,
        "step_number": event.step_number,
        "text": event.text,
        "tool_calls": [tool_call(call) for call in event.tool_calls],
        "error": event.error,
        "usage": usage_dict(event.usage),
    }


def _approval_request(event: ToolApprovalRequest) -> payloads.SessionPayload:
    return {
        "type": "tool_approval_request",
        "approval_id": event.approval_id,
        "toolUseId": event.tool_use_id,
        "toolName": event.tool,
        "toolInput": event.input,
        "expires_at": event.expires_at,
    }


def _approval_response(event: ToolApprovalResponse) -> payloads.SessionPayload:
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


def _client_tool_request(event: ClientToolRequest) -> payloads.SessionPayload:
    return {
        "type": "client_tool_request",
        "toolUseId": event.tool_use_id,
        "toolName": event.tool,
        "toolInput": event.input,
        "expires_at": event.expires_at,
    }


def _client_tool_result(event: ClientToolResult) -> payloads.SessionPayload:
    result: payloads.ClientToolResult = {
        "type": "client_tool_result",
        "toolUseId": event.tool_use_id,
        "by": event.by,
    }
    if event.error is not None:
        result["error"] = event.error
    else:
        result["output"] = event.output
    return result


def _started(event: RunStarted) -> payloads.SessionPayload:
    payload: payloads.Processing = {"type": "processing", "run_id": event.run_id, "message": event.message}
    if event.message_id:
        payload["message_id"] = event.message_id
    if event.reply_id:
        payload["reply_id"] = event.reply_id
    return payload


def _rewound(event: ConversationRewound) -> payloads.SessionPayload:
    return {
        "type": "conversation_rewound",
        "message_id": event.message_id,
        "kept": event.kept,
        "removed": event.removed,
        "usage": usage_dict(event.usage),
    }


def _error(event: RunError) -> payloads.SessionPayload:
    return {
        "type": "error",
        "message": event.error,
        "recoverable": event.recoverable,
        "code": event.code,
        "turns": event.turns,
        "usage": usage_dict(event.usage),
    }


# Every canonical event has a session form, so the ids a session client sees are contiguous.
SESSION: dict[type[Event], Callable[[Any], payloads.SessionPayload]] = {
    TextDelta: lambda e: {"type": "assistant_text", "text": e.text},
    ToolInputDelta: lambda e: {"type": "tool_input_delta", "toolUseId": e.tool_use_id, "delta": e.delta},
    ToolUseStart: lambda e: {"type": "tool_use_start", "toolName": e.tool, "toolUseId": e.tool_use_id},
    ToolUse: _tool_use,
    ToolExecuting: lambda e: {"type": "tool_executing", "toolName": e.tool, "toolUseId": e.tool_use_id},
    ToolResult: _tool_result,
    ReasoningDelta: lambda e: {"type": "reasoning_text", "text": e.text},
    StatusChange: lambda e: {"type": "status_change", "status": e.status},
    RunStarted: _started,
    TurnCompleted: _turn,
    PlanCreated: lambda e: {"type": "plan", "plan": e.plan, "usage": usage_dict(e.usage)},
    ContextTrimmed: _trimmed,
    StepCompleted: _step,
    RunDone: lambda e: {"type": "done", **done_fields(e)},
    ToolApprovalRequest: _approval_request,
    ToolApprovalResponse: _approval_response,
    ClientToolRequest: _client_tool_request,
    ClientToolResult: _client_tool_result,
    ConversationRewound: _rewound,
    RunError: _error,
}


def session(event: Event) -> payloads.SessionPayload:
    """The **session** dialect (seed 002, plus the types this service adds); the SSE event name
    is the ``type``."""
    project = SESSION.get(type(event))
    if project is None:
        raise TypeError(f"no session form for {type(event).__name__}")
    return project(event)


def pending_approvals(session_: Session) -> list[dict[str, Any]]:
    """The session's approvals that wait for an answer, as ``tool_approval_request`` payloads."""
    return [session(request) for request in session_.pending_approvals()]  # type: ignore[misc]


def pending_client_tools(session_: Session) -> list[dict[str, Any]]:
    """The session's client tool calls that wait for a result, as ``client_tool_request`` payloads."""
    return [session(request) for request in session_.pending_client_tools()]  # type: ignore[misc]


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
