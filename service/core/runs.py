"""Runs: one query of a session, driven in the background into the session's event log.

The run manager knows the agent only through the :class:`Agent` protocol, so the core stays
free of providers and tools. A run's log always ends the query with exactly one terminal
event: the agent's ``done`` or ``error``, or one the manager writes on cancel or shutdown.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from service.core.events import (
    Event,
    PlanCreated,
    RunDone,
    RunError,
    RunStarted,
    StatusChange,
    TextDelta,
    ToolCall,
    ToolResult,
    ToolUse,
    TurnCompleted,
    Usage,
    is_terminal,
)
from service.core.sessions import IDLE, RUNNING, Session
from service.errors import Overloaded, RunInProgress

log = logging.getLogger(__name__)

CANCELLED = "cancelled"
SHUTDOWN = "shutdown"


class Agent(Protocol):
    """What the run manager needs of an agent: a stream of canonical events for one query."""

    def run(self, messages: list[dict[str, Any]], user_text: str, max_turns: int) -> AsyncIterator[Event]:
        """Append the user's text to ``messages``, work, and yield events ending with done/error."""
        ...


@dataclass
class _Progress:
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
    progress: _Progress = field(default_factory=_Progress)

    async def wait(self) -> None:
        """Return once the run has written its terminal event."""
        if self.task is not None:
            await asyncio.shield(self.task)


class RunManager:
    """Starts, cancels and tracks the runs of this instance."""

    def __init__(self, agent: Agent, *, default_max_turns: int = 10, max_concurrent: int = 256) -> None:
        self._agent = agent
        self._default_max_turns = default_max_turns
        self._max_concurrent = max_concurrent
        self._runs: dict[str, Run] = {}
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def active(self) -> int:
        """How many runs are in flight."""
        return len(self._runs)

    async def wait_idle(self) -> None:
        """Return once no run is in flight."""
        await self._idle.wait()

    def get(self, session_id: str) -> Run | None:
        """The run in flight for that session, if any."""
        return self._runs.get(session_id)

    async def start(self, session: Session, message: str, max_turns: int | None = None) -> Run:
        """Start a query on ``session``; :class:`RunInProgress` if one runs already."""
        if session.id in self._runs:
            raise RunInProgress(session.id)
        if len(self._runs) >= self._max_concurrent:
            raise Overloaded(f"{self._max_concurrent} queries are already running")
        run = Run(
            id=secrets.token_hex(8),
            session=session,
            message=message,
            max_turns=max_turns or self._default_max_turns,
        )
        self._runs[session.id] = run
        self._idle.clear()
        session.status = RUNNING
        session.touch()
        await session.log.append(RunStarted(run_id=run.id, message=message, max_turns=run.max_turns))
        await session.log.append(StatusChange(status=RUNNING))
        run.task = asyncio.create_task(self._drive(run), name=f"run-{session.id}")
        return run

    def snapshot(self, session: Session) -> dict[str, Any]:
        """What a client needs to rebuild its view without the events: the conversation so far,
        the running query's text and finished tool calls with their results, and the usage."""
        run = self._runs.get(session.id)
        current = None
        if run is not None:
            current = {
                "message": run.message,
                "text": run.progress.text,
                "tool_calls": [call.model_dump() for call in run.progress.tool_calls],
                "usage": run.progress.usage.model_dump(),
            }
        return {
            "status": session.status,
            "messages": session.messages,
            "current_query": current,
            "usage": session.usage.model_dump(),
        }

    async def cancel(self, session_id: str, reason: str = CANCELLED) -> bool:
        """Cancel the session's query; the log gets its terminal event. False if none ran."""
        run = self._runs.get(session_id)
        if run is None or run.task is None:
            return False
        run.stop_reason = run.stop_reason or reason
        run.task.cancel()
        await asyncio.wait([run.task])
        await self._finish_unstarted(run)
        return True

    async def shutdown(self) -> None:
        """Cancel every run; each log gets an ``error`` saying the server is shutting down."""
        runs = list(self._runs.values())
        for run in runs:
            run.stop_reason = SHUTDOWN
            if run.task is not None:
                run.task.cancel()
        tasks = [run.task for run in runs if run.task is not None]
        if tasks:
            await asyncio.wait(tasks)
        for run in runs:
            await self._finish_unstarted(run)

    async def _finish_unstarted(self, run: Run) -> None:
        # A task cancelled before its first step never runs its body, so its terminal
        # event is written here: a cancel sent before the query really started still ends it.
        if self._runs.get(run.session.id) is run:
            await self._finish(run, await self._stopped(run))

    async def _stopped(self, run: Run) -> Event:
        """The terminal event of a run stopped from outside (cancel or shutdown)."""
        progress = run.progress
        if run.stop_reason == SHUTDOWN:
            return RunError(
                error="the server is shutting down",
                code="shutdown",
                turns=progress.turns,
                recoverable=True,
                usage=progress.usage,
            )
        if not run.session.log.closed:
            await run.session.log.append(StatusChange(status=CANCELLED))
        return RunDone(
            turns=progress.turns,
            tool_calls=progress.tool_calls,
            usage=progress.usage,
            stop_reason=CANCELLED,
            cancelled=True,
        )

    async def _drive(self, run: Run) -> None:
        session, progress = run.session, run.progress
        event_log = session.log
        try:
            async for event in self._agent.run(session.messages, run.message, run.max_turns):
                if is_terminal(event):
                    await self._finish(run, event)
                    return
                # Logged first, then counted: a snapshot never runs ahead of the log's last id.
                await event_log.append(event)
                progress.observe(event)
                if isinstance(event, TurnCompleted | PlanCreated):
                    session.usage = session.usage + event.usage
            await self._finish(
                run, RunError(error="the agent stopped without a result", turns=progress.turns)
            )
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None:
                current.uncancel()
            await self._finish(run, await self._stopped(run))
        except Exception:
            log.exception("run %s of session %s failed", run.id, session.id)
            await self._finish(
                run, RunError(error="internal error", code="internal_error", turns=progress.turns)
            )

    async def _finish(self, run: Run, terminal: Event) -> None:
        # Free the session before the terminal event is seen, so a client that reads `done`
        # may start its next query at once without a 409.
        session = run.session
        self._runs.pop(session.id, None)
        if not self._runs:
            self._idle.set()
        session.status = IDLE
        session.touch()
        if not session.log.closed:
            await session.log.append(StatusChange(status=IDLE))
            await session.log.append(terminal)
