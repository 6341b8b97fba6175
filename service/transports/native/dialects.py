"""The native face's own dialects, each a table from a canonical event type to its payload:

- **agent** (``POST /agent/stream``, seed 001 §2): ``data:`` lines; an event it does not show is
  absent from its table;
- **steps** (``GET /sessions/{id}/stream``, seed 000): message, step (planning, action,
  approval), final, done, error; an event may give none or several frames.

The session dialect, which the WebSocket and MCP carry too, is :mod:`service.transports.stream.session`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from service.core.events import (
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
    ToolExecuting,
    ToolInputDelta,
    ToolResult,
    ToolUseStart,
)
from service.core.log import LogEntry
from service.jsonsafe import dumps, quote
from service.transports.native import payloads
from service.transports.stream.follow import Ending
from service.transports.stream.frames import SSE_SEP, sse_block
from service.transports.stream.session import (
    done_fields,
    flag,
    merge_text_runs,
    session_sse,
    tool_call,
    usage_dict,
)
from service.transports.stream.sse import Projector


def _agent_tool_result(event: ToolResult) -> payloads.AgentEvent:
    payload: payloads.AgentToolResult = {
        "type": "tool_result",
        "tool": event.tool,
        "result": event.result,
        "id": event.tool_use_id,
    }
    if event.is_error:
        payload["is_error"] = True
    return payload


def _agent_done(event: RunDone) -> payloads.AgentEvent:
    done: payloads.AgentDone = {
        "type": "done",
        "turns": event.turns,
        "tool_calls": [tool_call(call, result=False) for call in event.tool_calls],
        "usage": usage_dict(event.usage),
        "stop_reason": event.stop_reason,
    }
    flag(done, event)
    return done


def _agent_error(event: RunError) -> payloads.AgentEvent:
    return {
        "type": "error",
        "error": event.error,
        "turns": event.turns,
        "code": event.code,
        "recoverable": event.recoverable,
    }


AGENT: dict[type[Event], Callable[[Any], payloads.AgentEvent]] = {
    TextDelta: lambda e: {"type": "text_delta", "text": e.text},
    ToolInputDelta: lambda e: {"type": "tool_input_delta", "delta": e.delta, "id": e.tool_use_id},
    ToolUseStart: lambda e: {"type": "tool_use_start", "tool": e.tool, "id": e.tool_use_id},
    ToolExecuting: lambda e: {"type": "tool_executing", "tool": e.tool, "id": e.tool_use_id},
    ToolResult: _agent_tool_result,
    ReasoningDelta: lambda e: {"type": "reasoning_delta", "text": e.text},
    RunDone: _agent_done,
    RunError: _agent_error,
}


def agent(event: Event) -> payloads.AgentEvent | None:
    """The **agent** dialect's payload; ``None`` when it does not show the event."""
    project = AGENT.get(type(event))
    return None if project is None else project(event)


def agent_block(event: Event) -> str | None:
    """The event's whole SSE block in the agent dialect (``None`` when it does not show it)."""
    if type(event) is TextDelta:
        # Most events are text deltas: written straight, the JSON dumps(agent()) gives.
        return f'data: {{"type":"text_delta","text":{quote(event.text)}}}{SSE_SEP}{SSE_SEP}'
    payload = agent(event)
    return None if payload is None else sse_block(dumps(payload))


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def _steps_action(event: StepCompleted) -> list[payloads.StepsEvent]:
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


def _steps_approval(event: ToolApprovalRequest) -> list[payloads.StepsEvent]:
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


def _steps_done(event: RunDone) -> list[payloads.StepsEvent]:
    frames: list[payloads.StepsEvent] = []
    if not event.cancelled:
        frames.append({"type": "final", "step_number": event.final_step, "output": event.output})
    frames.append({"type": "done", **done_fields(event)})
    return frames


STEPS: dict[type[Event], Callable[[Any], list[payloads.StepsEvent]]] = {
    RunStarted: lambda e: [
        {"type": "message", "role": "user", "content": e.message, "timestamp": _iso(e.at)}
    ],
    PlanCreated: lambda e: [
        {
            "type": "step",
            "step_type": "planning",
            "step_number": 1,
            "plan": e.plan,
            "token_usage": usage_dict(e.usage),
        }
    ],
    StepCompleted: _steps_action,
    ToolApprovalRequest: _steps_approval,
    RunDone: _steps_done,
    RunError: lambda e: [{"type": "error", "error": e.error, "code": e.code}],
}


def steps(event: Event) -> list[payloads.StepsEvent]:
    """The **steps** dialect's frames for the event (none for an event it does not show)."""
    project = STEPS.get(type(event))
    return [] if project is None else project(event)


class AgentProjector(Projector):
    """``POST /agent/stream``: the agent dialect's ``data:`` lines; an unclean ending as its
    ``error``, with where the reader stood."""

    __slots__ = ()

    def frames(self, entry: LogEntry) -> bytes:
        block = agent_block(entry.event)
        return b"" if block is None else block.encode()

    def end(self, ending: Ending | None) -> str:
        if ending is None or ending.clean:
            return ""
        return sse_block(dumps({**(agent(ending.as_error()) or {}), **ending.error_fields()}))


class StepsProjector(Projector):
    """``GET /sessions/{id}/stream``: the steps dialect's frames, each with its entry's id."""

    __slots__ = ()

    def frames(self, entry: LogEntry) -> bytes:
        payloads_ = steps(entry.event)
        if not payloads_:
            return b""
        return "".join(sse_block(dumps(payload), id=entry.id) for payload in payloads_).encode()

    def end(self, ending: Ending | None) -> str:
        if ending is None or ending.clean:
            return ""
        fields = ending.error_fields()
        return "".join(sse_block(dumps({**payload, **fields})) for payload in steps(ending.as_error()))


class SessionProjector(Projector):
    """``GET /sessions/{id}/events``: the session dialect with ``event:`` and ``id:``; a lagging
    reader's runs of text deltas merged; heartbeats with the status as of the last event sent."""

    __slots__ = ("_head", "merge_after", "status")

    def __init__(self, status: str, merge_after: int, head: str = "") -> None:
        # On a shared store the session object is a copy read when the request came: the log's
        # status changes are what keep this current.
        self.status = status
        self.merge_after = merge_after
        self._head = head

    def head(self) -> str:
        return self._head

    def frames(self, entry: LogEntry) -> bytes:
        event = entry.event
        if type(event) is StatusChange:
            self.status = event.status
        return session_sse(entry)

    def batch(self, entries: list[LogEntry], *, merge: bool = False) -> tuple[bytes, int]:
        if len(entries) <= self.merge_after and not merge:
            return super().batch(entries)
        for entry in entries:
            if type(entry.event) is StatusChange:
                self.status = entry.event.status
        merged = "".join(
            sse_block(data, id=entry_id, event=name) for entry_id, name, data in merge_text_runs(entries)
        )
        return merged.encode(), len(entries)

    def shared_batch(self, entries: list[LogEntry], shared: dict[Any, Any]) -> tuple[bytes, int]:
        # A window's text deltas are merged as a lagging reader's are: fewer, larger frames for
        # every viewer to take in. The blocks depend on the entries alone; the status each stream
        # keeps is the last one among them.
        key = (SessionProjector, entries[0].id)
        made = shared.get(key)
        if made is None:
            data, shown = self.batch(entries, merge=True)
            changed = any(type(entry.event) is StatusChange for entry in entries)
            made = shared[key] = (data, shown, self.status if changed else None)
        elif made[2] is not None:
            self.status = made[2]
        return made[0], made[1]

    def heartbeat(self, last_id: int) -> bytes:
        beat = {"type": "heartbeat", "last_id": last_id, "status": self.status}
        return sse_block(dumps(beat), event="heartbeat").encode()

    def end(self, ending: Ending | None) -> str:
        if ending is None or ending.reason not in {"purged", "store_unavailable", "token_expired"}:
            return ""
        # Fell behind the purge horizon (a reconnect with its last id gets the 410 with a
        # snapshot), the shared store went away (the client resumes once it is back), or the
        # client's token expired (it reconnects with a fresh one and its last id).
        error = {
            "type": "error",
            "message": ending.message,
            "code": ending.code,
            "recoverable": True,
            **ending.error_fields(),
        }
        return sse_block(dumps(error), event="error")
