"""A run's state: the query in flight, and what it has done so far."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from service.core.events import (
    Event,
    PlanCreated,
    TextDelta,
    ToolCall,
    ToolResult,
    ToolUse,
    TurnCompleted,
    Usage,
)
from service.core.options import RunOptions
from service.core.sessions import Session


@dataclass
class Progress:
    """What a run has done so far, so a cancel or a purge snapshot can report it."""

    turns: int = 0
    usage: Usage = field(default_factory=Usage)
    tool_calls: list[ToolCall] = field(default_factory=list)
    text_parts: list[str] = field(default_factory=list)
    _inputs: dict[str, Any] = field(default_factory=dict)

    def observe(self, event: Event) -> None:
        if isinstance(event, TextDelta):
            self.text_parts.append(event.text)
        elif isinstance(event, TurnCompleted):
            self.turns = event.turn
            self.usage = event.total_usage
        elif isinstance(event, PlanCreated):
            self.usage = self.usage + event.usage
        elif isinstance(event, ToolUse):
            self._inputs[event.tool_use_id] = event.input
        elif isinstance(event, ToolResult):
            self.tool_calls.append(
                ToolCall(
                    tool=event.tool,
                    input=self._inputs.get(event.tool_use_id),
                    tool_use_id=event.tool_use_id,
                    is_error=event.is_error,
                    result=event.result,
                )
            )

    @property
    def text(self) -> str:
        """The answer's text so far."""
        return "".join(self.text_parts)


@dataclass
class Run:
    """A query in flight."""

    id: str
    session: Session
    message: str
    max_turns: int
    task: asyncio.Task[None] | None = None
    stop_reason: str | None = None
    fence: str | None = None
    progress: Progress = field(default_factory=Progress)
    options: RunOptions | None = None
    taken: int = 0  # events taken from the agent: the newest has id run_start_id + 1 + taken
    # The id of its run_started event, and of the first event it logged (a rewind's, if any).
    start_id: int = 0
    first_id: int = 0
    # The agent it runs with, as defined when it started (a reload changes later queries only).
    agent: Any = None
    span: Any = None  # the query's invoke_agent span (service.core.traces), ended with the run

    @property
    def agent_name(self) -> str:
        """The name of the agent it runs with (its session's, for an agent without one)."""
        return getattr(self.agent, "name", self.session.agent)

    async def wait(self) -> None:
        """Return once the run has written its terminal event."""
        if self.task is not None:
            await asyncio.shield(self.task)
