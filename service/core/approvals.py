"""Tool approvals: a tool call that waits for a person, held as events in the session's log.

When the agent asks (an :data:`Approver` call), the run logs one ``tool_approval_request`` per
call and the status ``waiting`` in one step, then waits for a ``tool_approval_response`` to each.
The wait is a coroutine following the session's own log: it holds no thread and no upstream
connection (the model's stream for that turn has ended before the agent asks). Whoever answers
first, on whichever instance, logs the answer through the store's one-step check-and-append
(:meth:`~service.core.sessions.SessionStore.answer_approval`), and the waiting run reads it from
its log like any subscriber, so an answer sent to another instance sharing Redis resumes it.

An unanswered request expires at its ``expires_at`` (read from an injectable :class:`Clock`): the
run answers it itself, denied with the reason ``expired``, through the same check-and-append, so a
person who answers at the last moment and the expiry cannot both win. A cancel while waiting
cancels the run's task like any other; a restart of the instance leaves the session's claim to
expire, and the query is then ended as interrupted like any other whose instance went away.

A call of a tool the client runs itself (a browser-side tool) is held the same way
(:meth:`ApprovalDesk.hand_over`): a ``client_tool_request`` per call, the status ``waiting``, and a
``client_tool_result`` from whichever tab or instance answers first; unanswered by
``AGENT_CLIENT_TOOL_TIMEOUT_S``, the call gets an error result and the model goes on.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Protocol

from opentelemetry.trace import Tracer

from service.core import waiting
from service.core.events import (
    ClientToolRequest,
    ClientToolResult,
    Event,
    ToolApprovalRequest,
    ToolApprovalResponse,
    ToolUse,
)
from service.core.log import LogEntry
from service.core.sessions import (
    BY_TIMEOUT,
    RUNNING,
    WAITING,
    Answer,
    Request,
    Session,
    SessionStore,
    answer_locally,
    open_locally,
)
from service.core.traces import NO_TRACER, traceparent
from service.errors import RunLost

EXPIRED = "expired"
CLIENT_TOOL_TIMED_OUT = (
    "The client did not return this tool's result in time, so it has none. Answer without it."
)


@dataclass(frozen=True, slots=True)
class Decision:
    """How a person (or the expiry) answered one tool call; ``input`` replaces the model's
    input when an approver edited it (None: run it as the model wrote it)."""

    approved: bool
    reason: str = ""
    input: Any = None
    by: str = ""


# What the agent calls with the tool uses that need approval: their decisions by tool_use_id.
Approver = Callable[[Sequence[ToolUse]], Awaitable[dict[str, Decision]]]
# What the agent calls with its uses of the client's tools: their results by tool_use_id.
HandOver = Callable[[Sequence[ToolUse]], Awaitable[dict[str, ClientToolResult]]]


class Clock(Protocol):
    """Wall-clock time as approvals read it; tests give one they move by hand."""

    def now(self) -> float:
        """Epoch seconds."""
        ...

    async def sleep_until(self, when: float) -> None:
        """Return once :meth:`now` has reached ``when``."""
        ...


class SystemClock:
    """The real clock."""

    def now(self) -> float:
        """Epoch seconds."""
        return time.time()

    async def sleep_until(self, when: float) -> None:
        """Sleep until ``when`` (epoch seconds)."""
        await asyncio.sleep(max(0.0, when - time.time()))


class ApprovalDesk:
    """Asks for approvals on a run's behalf and waits for the answers (see the module docstring)."""

    def __init__(
        self,
        store: SessionStore | None,
        *,
        timeout_s: float = 600.0,
        client_tool_timeout_s: float = 600.0,
        clock: Clock | None = None,
        tracer: Tracer = NO_TRACER,
    ) -> None:
        self._store = store
        self.timeout_s = timeout_s
        self.client_tool_timeout_s = client_tool_timeout_s
        self.clock: Clock = clock or SystemClock()
        self.tracer = tracer  # the app's (service.telemetry): a span per wait

    async def ask(
        self,
        session: Session,
        fence: str | None,
        uses: Sequence[ToolUse],
        logged: Callable[[list[Event]], None],
    ) -> dict[str, Decision]:
        """Log a request per use, wait until each is answered or expired, and go back to running.
        ``logged`` hears the events the run itself logs. The decisions are by ``tool_use_id``."""
        expires_at = self.clock.now() + self.timeout_s
        waits = [waiting.start_approval(self.tracer, use) for use in uses]
        requests = [
            ToolApprovalRequest(
                approval_id=f"ap_{secrets.token_urlsafe(12)}",
                tool=use.tool,
                tool_use_id=use.tool_use_id,
                input=use.input,
                expires_at=expires_at,
                turn=use.turn,
                trace=traceparent(span),
            )
            for use, span in zip(uses, waits, strict=True)
        ]
        with waiting.ended(waits, requests) as answers:
            answers.update(await self._hold(session, fence, requests, logged, expires_at, _approval_expired))
        return {
            request.tool_use_id: Decision(
                approved=answers[request.approval_id].approved,
                reason=answers[request.approval_id].reason,  # type: ignore[union-attr]
                input=answers[request.approval_id].input,  # type: ignore[union-attr]
                by=answers[request.approval_id].by,
            )
            for request in requests
        }

    async def hand_over(
        self,
        session: Session,
        fence: str | None,
        uses: Sequence[ToolUse],
        logged: Callable[[list[Event]], None],
    ) -> dict[str, ClientToolResult]:
        """Log a request per call of a client tool, wait until each has its result (or an error
        one at the timeout), and go back to running. The results are by ``tool_use_id``."""
        expires_at = self.clock.now() + self.client_tool_timeout_s
        waits = [waiting.start_client_tool(self.tracer, use) for use in uses]
        requests = [
            ClientToolRequest(
                tool=use.tool,
                tool_use_id=use.tool_use_id,
                input=use.input,
                expires_at=expires_at,
                turn=use.turn,
                trace=traceparent(span),
            )
            for use, span in zip(uses, waits, strict=True)
        ]
        with waiting.ended(waits, requests) as answers:
            answers.update(
                await self._hold(session, fence, requests, logged, expires_at, _client_tool_expired)
            )
        return {request.tool_use_id: answers[request.approval_id] for request in requests}  # type: ignore[misc]

    async def _hold(
        self,
        session: Session,
        fence: str | None,
        requests: Sequence[Request],
        logged: Callable[[list[Event]], None],
        expires_at: float,
        expired: Callable[[Request], Answer],
    ) -> dict[str, Answer]:
        """Open ``requests`` with the status ``waiting``, wait for their answers, and go back to
        ``running``; the answers by approval id."""
        entries = await self._set_status(session, fence, WAITING, list(requests))
        logged([entry.event for entry in entries])
        answers = await self._wait(session, requests, entries[-1].id, expires_at, expired)
        entries = await self._set_status(session, fence, RUNNING, [])
        logged([entry.event for entry in entries])
        return answers

    async def answer(self, session: Session, response: Answer) -> str | None:
        """Log ``response`` if its approval is pending (None); else the approval's state."""
        if self._store is not None:
            return await self._store.answer_approval(session, response)
        state = answer_locally(session, response)
        if state is None:
            await session.log.append(response)
        return state

    async def _set_status(
        self, session: Session, fence: str | None, status: str, requests: list[Request]
    ) -> list[LogEntry]:
        if self._store is not None:
            return await self._store.set_status(session, fence, status, requests)
        return await open_locally(session, fence, status, requests)

    async def _wait(
        self,
        session: Session,
        requests: Sequence[Request],
        after: int,
        expires_at: float,
        expired: Callable[[Request], Answer],
    ) -> dict[str, Answer]:
        """The answers to ``requests``, as the log tells them; the expiry answers what is left."""
        wanted = {request.approval_id for request in requests}
        answers: dict[str, Answer] = {}

        async def follow() -> None:
            async with aclosing(session.log.subscribe(after)) as batches:
                async for batch in batches:
                    for entry in batch:
                        event = entry.event
                        if (
                            isinstance(event, ToolApprovalResponse | ClientToolResult)
                            and event.approval_id in wanted
                        ):
                            answers.setdefault(event.approval_id, event)
                    if len(answers) == len(wanted):
                        return

        follower = asyncio.ensure_future(follow())
        expiry = asyncio.ensure_future(self.clock.sleep_until(expires_at))
        try:
            await asyncio.wait({follower, expiry}, return_when=asyncio.FIRST_COMPLETED)
            if not follower.done():
                for request in requests:
                    if request.approval_id not in answers:
                        # Lost to a person who answered meanwhile: then the log holds theirs.
                        await self.answer(session, expired(request))
            await follower
        finally:
            for task in (follower, expiry):
                task.cancel()
            await asyncio.gather(follower, expiry, return_exceptions=True)
        if len(answers) < len(wanted):
            # The log ended (the session was deleted) before every answer came.
            raise RunLost(f"session {session.id} ended while its query waited for an approval")
        return answers


def _approval_expired(request: Request) -> Answer:
    return ToolApprovalResponse(
        approval_id=request.approval_id, approved=False, reason=EXPIRED, by=BY_TIMEOUT
    )


def _client_tool_expired(request: Request) -> Answer:
    return ClientToolResult(tool_use_id=request.tool_use_id, error=CLIENT_TOOL_TIMED_OUT, by=BY_TIMEOUT)
