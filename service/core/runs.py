"""Runs: one query of a session, driven in the background into the session's event log.

The run manager knows the agent only through the :class:`Agent` protocol, so the core stays
free of providers and tools. A run's log always ends the query with exactly one terminal
event: the agent's ``done`` or ``error``, or one the manager writes on cancel or shutdown.

A run first claims its session in the store (on Redis: a lock with an expiry, renewed while the
run lives), so one query runs per session across instances; every append of the run carries
that claim as a fence, and the conversation is kept when the run ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

from opentelemetry.trace import Tracer

from service.core import conversation, traces
from service.core.approvals import ApprovalDesk, Approver
from service.core.committer import Committer
from service.core.conversation import rewind, text_of
from service.core.events import (
    Event,
    PlanCreated,
    RunDone,
    RunError,
    RunStarted,
    Sink,
    StatusChange,
    TurnCompleted,
    Usage,
    is_terminal,
)
from service.core.log import EventLog
from service.core.options import RunOptions
from service.core.run_parts import Agent, Agents, NoGate, NoObserver, RunGate, RunObserver
from service.core.run_state import Progress, Run
from service.core.sessions import (
    IDLE,
    RUNNING,
    Session,
    SessionStore,
    append_unless_closed,
    close_approvals,
)
from service.errors import MessageNotFound, Overloaded, RunInProgress, RunLost, StoreUnavailable
from service.logs import run_id_var, session_id_var

log = logging.getLogger(__name__)

CANCELLED = "cancelled"
SHUTDOWN = "shutdown"
# The events whose usage counts against the session and its owner's quota.
_USAGE_EVENTS = frozenset({TurnCompleted, PlanCreated})


class RunManager:
    """Starts, cancels and tracks the runs of this instance."""

    def __init__(
        self,
        agent: Agent | None = None,
        *,
        agents: Agents | None = None,
        store: SessionStore | None = None,
        observer: RunObserver | None = None,
        gate: RunGate | None = None,
        default_max_turns: int = 10,
        max_concurrent: int = 256,
        approvals: ApprovalDesk | None = None,
        tracer: Tracer = traces.NO_TRACER,
    ) -> None:
        # One agent for every session, or the agents by the name each session is bound to.
        self._agent = agent
        self._agents = agents
        self.approvals = approvals
        self._store = store
        self._observer = observer or NoObserver()
        self._gate = gate or NoGate()
        self._default_max_turns = default_max_turns
        self._max_concurrent = max_concurrent
        self.tracer = tracer
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
        """The run in flight on this instance for that session, if any."""
        return self._runs.get(session_id)

    def claims(self) -> list[tuple[str, str]]:
        """``(session id, fence)`` of every local run holding a shared claim, to renew them."""
        return [(run.session.id, run.fence) for run in self._runs.values() if run.fence is not None]

    async def start(
        self,
        session: Session,
        message: str,
        max_turns: int | None = None,
        options: RunOptions | None = None,
    ) -> Run:
        """Start a query on ``session``; :class:`RunInProgress` if one runs already. ``options``
        go to the agent as they are (see :class:`~service.core.options.RunOptions`)."""
        if session.id in self._runs:
            raise RunInProgress(session.id)
        if len(self._runs) >= self._max_concurrent:
            raise Overloaded(f"{self._max_concurrent} queries are already running")
        options = with_ids(options or RunOptions())
        agent, agent_turns = (
            self._agents.resolve(session.agent) if self._agents is not None else (self._agent, None)
        )
        run = Run(
            id=secrets.token_hex(8),
            session=session,
            message=message,
            max_turns=max_turns or agent_turns or self._default_max_turns,
            options=options,
            agent=agent,
        )
        admitted = self._gate.admit(session.owner)  # may refuse (a quota)
        if admitted is not None:
            await admitted
            if session.id in self._runs:  # another start won while the gate was asked
                self._gate.release(session.owner)
                raise RunInProgress(session.id)
            if len(self._runs) >= self._max_concurrent:
                self._gate.release(session.owner)
                raise Overloaded(f"{self._max_concurrent} queries are already running")
        self._runs[session.id] = run  # from here on the gate's slot is released by _forget
        self._idle.clear()
        try:
            session.run_message = message
            if self._store is not None:
                run.fence = await self._store.claim_run(session, run.id)
            session.status = RUNNING
            session.run_id = run.id
            session.touch()
            message_id = options.message_id
            index = rewind_index(session.messages, options) if options.rewind_to else None
            if index is not None:
                rewound = rewind(session.messages, index, session.usage)
                session.usage = rewound.usage
                session.cut = index if session.cut is None else min(session.cut, index)
                run.first_id = (await session.log.append(rewound, fence=run.fence)).id
                if options.resume:
                    run.message = session.run_message = message = text_of(session.messages[-1])
                    message_id = conversation.message_id(session.messages, len(session.messages) - 1)
            started = await session.log.append(
                RunStarted(
                    run_id=run.id,
                    message=message,
                    max_turns=run.max_turns,
                    message_id=message_id,
                    reply_id=options.reply_id,
                    request=options.request,
                ),
                fence=run.fence,
            )
            session.run_start_id = run.start_id = started.id
            run.first_id = run.first_id or started.id
            await session.log.append(StatusChange(status=RUNNING), fence=run.fence)
            self._observer.run_started(run.id, appended=2, agent=run.agent_name)
        except BaseException:
            # Claimed by someone else, or the store failed: nothing runs, nothing is held here,
            # and the session says so (it was marked running just before the first append).
            if session.run_id == run.id:
                session.status = IDLE
                session.run_id = ""
            self._forget(run)
            if run.fence is not None:
                with _suppress_store_errors(run):
                    await self._store_finish(run, [])
            raise
        # The run's task starts from a copy of this context: its log lines carry both ids.
        context = contextvars.copy_context()
        context.run(session_id_var.set, session.id)
        context.run(run_id_var.set, run.id)
        # The query's span, a child of the request's, and the parent of its model turns and
        # tool calls (they start in the task, where it is the current span).
        run.span = traces.start_query(self.tracer, run.agent, run.agent_name, session.id)
        if run.span.get_span_context().is_valid:  # the no-op tracer's span is not: nothing to do
            context.run(traces.make_current, run.span)
        run.task = asyncio.create_task(self._drive(run), name=f"run-{session.id}", context=context)
        return run

    def _forget(self, run: Run) -> Awaitable[None] | None:
        """Drop the run from this instance and give its gate slot back; what the gate returned
        (see :class:`RunGate`), to await when the release must be complete."""
        released = None
        if self._runs.get(run.session.id) is run:
            del self._runs[run.session.id]
            released = self._gate.release(run.session.owner)
        if not self._runs:
            self._idle.set()
        return released

    async def snapshot(self, session: Session) -> dict[str, Any]:
        """What a client needs to rebuild its view without the events: the conversation so far,
        the running query's text and finished tool calls with their results, and the usage; for a
        query this instance runs, also its answer's id (``reply_id``), which a client keys the
        answer by until it is in the conversation.

        A query running on another instance is summed up from its events in the shared log.
        """
        run = self._runs.get(session.id)
        current = None
        progress: Progress | None = None
        message = reply_id = ""
        partial = False
        if run is not None:
            progress, message = run.progress, run.message
            reply_id = run.options.reply_id if run.options is not None else ""
        elif session.active and session.run_start_id:
            progress, message = Progress(), session.run_message
            entries = await session.log.read(session.run_start_id, strict=False)
            # A query so long that its own first events were purged can only be summed up
            # from what is kept; the snapshot says so.
            partial = bool(entries) and entries[0].id > session.run_start_id + 1
            for entry in entries:
                progress.observe(entry.event)
        if progress is not None:
            current = {
                "message": message,
                "text": progress.text,
                "tool_calls": [call.model_dump() for call in progress.tool_calls],
                "usage": progress.usage.model_dump(),
            }
            if partial:
                current["partial"] = True
            if reply_id:
                current["reply_id"] = reply_id
        return {
            "status": session.status,
            "messages": session.messages,
            "current_query": current,
            "usage": session.usage.model_dump(),
        }

    async def cancel(self, session_id: str, reason: str = CANCELLED) -> bool:
        """Cancel the session's query wherever it runs; once this returns, the log holds its
        terminal event. False if none ran."""
        run = self._runs.get(session_id)
        if run is None:
            if self._store is not None:
                return await self._store.cancel_elsewhere(session_id)
            return False
        if run.task is None:
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
            await run.session.log.append(StatusChange(status=CANCELLED), fence=run.fence)
        return RunDone(
            turns=progress.turns,
            tool_calls=progress.tool_calls,
            usage=progress.usage,
            stop_reason=CANCELLED,
            cancelled=True,
            agent=run.agent_name,
        )

    def _logged(self, run: Run, events: list[Event]) -> None:
        """Count events once they are in the log (a snapshot never runs ahead of its last id)."""
        for event in events:
            self._logged_one(run, event)

    def _logged_one(self, run: Run, event: Event) -> None:
        run.progress.observe(event)
        self._observer.event_logged(run.id, event)
        if type(event) in _USAGE_EVENTS:  # one lookup per token, not a chain of isinstance
            session = run.session
            session.usage = session.usage + event.usage
            self._gate.used(session.owner, event.usage)

    async def _drive(self, run: Run) -> None:
        log.info("query started (max %d turns)", run.max_turns)
        session, progress = run.session, run.progress
        event_log = session.log
        # On a shared store the events that come while an append is on its way go in one call.
        committer = (
            Committer(event_log, run.fence, lambda events: self._logged(run, events))
            if event_log.round_trips
            else None
        )
        append_now = event_log.synchronous_append()  # per token: no coroutine where none is needed
        sink = (
            self._sink(run, event_log, append_now) if committer is None and append_now is not None else None
        )
        try:
            async for event in self._agent_events(run, committer, sink):
                run.taken += 1
                if self._ids_to_reserve(run, run.taken):
                    await self._store.reserve_ids(session, session.run_start_id + 1 + run.taken)
                if is_terminal(event):
                    if committer is not None:
                        await committer.drain()
                    await self._finish(run, event)
                    return
                if committer is None:
                    if append_now is not None:
                        append_now(event)
                    else:
                        await event_log.append(event, fence=run.fence)
                    self._logged_one(run, event)
                elif committer.add(event):
                    await committer.drain()
            if committer is not None:
                await committer.drain()
            await self._finish(
                run, RunError(error="the agent stopped without a result", turns=progress.turns)
            )
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None:
                current.uncancel()
            try:
                if committer is not None:
                    await _settle(committer, run)  # what the run yielded is logged before how it stopped
                stopped = await self._stopped(run)
            except RunLost as exc:
                # Whoever stopped it (a lost claim, a deleted session) has said why.
                log.info("run %s of session %s stopped without its end logged: %s", run.id, session.id, exc)
                self._lost(run, exc)
                return
            except StoreUnavailable as exc:
                stopped = RunError(error=str(exc), code="store_unavailable", recoverable=True)
            await self._finish(run, stopped)
        except RunLost as exc:
            # Its claim expired (another instance ends the query as interrupted), or the session
            # itself is gone (deleted, or Redis lost its data): nothing more is the run's to log.
            log.warning("run %s of session %s stopped: %s", run.id, session.id, exc)
            self._lost(run, exc)
        except StoreUnavailable as exc:
            # The shared log could not take the events for longer than the claim lives (the
            # store retried them until then): the query stops, and once the store is back its
            # watchers are told it was interrupted (its claim will have expired).
            log.warning("run %s of session %s stopped: %s", run.id, session.id, exc)
            await self._finish(run, RunError(error=str(exc), code="store_unavailable", recoverable=True))
        except Exception:
            log.exception("run %s of session %s failed", run.id, session.id)
            await self._finish(
                run, RunError(error="internal error", code="internal_error", turns=progress.turns)
            )

    def _lost(self, run: Run, exc: RunLost) -> None:
        """The run no longer holds its session (see :class:`RunLost`): it ends here without a
        terminal event of its own, and is counted as ended all the same."""
        self._forget(run)
        lost = RunError(error=str(exc), code="run_lost")
        self._end_span(run, lost)
        self._observer.run_finished(run.id, lost, appended=0)

    def _ids_to_reserve(self, run: Run, taken: int) -> bool:
        """Whether the store must reserve more ids before the run's ``taken``-th event is logged."""
        session = run.session
        return bool(self._store) and 0 < session.ids_renew_at <= session.run_start_id + 1 + taken

    def _sink(self, run: Run, event_log: EventLog, append_now: Callable[[Event], Any]) -> Sink:
        """What :meth:`_drive` does with an event it appends at once, for the agent's provider to
        do where it read a text delta (:data:`~service.core.events.Sink`). It declines what has
        to wait (ids to reserve in the store first) and a closed log, which ``_drive`` then meets
        as before."""

        def take(event: Event) -> bool:
            if event_log.closed or self._ids_to_reserve(run, run.taken + 1):
                return False
            append_now(event)
            run.taken += 1
            self._logged_one(run, event)
            return True

        return take

    def _agent_events(self, run: Run, committer: Committer | None, sink: Sink | None) -> AsyncIterator[Event]:
        """The agent's events for the run; with a desk, its tool uses may wait for approval; with
        ``sink`` (and an agent that takes one), the text deltas it takes are not among them."""
        session = run.session
        desk = self.approvals
        extra: dict[str, Any] = {"charge": lambda usage: self._charge_cut_turn(run, usage)}
        if sink is not None:
            extra["sink"] = sink
        if desk is not None and run.options is not None and run.options.client_tools_wait:

            async def hand_over(uses: Any) -> Any:
                if committer is not None:
                    await committer.drain()
                return await desk.hand_over(
                    session, run.fence, uses, lambda events: self._logged(run, events)
                )

            extra["hand_over"] = hand_over
        # Without an approver the agent declines the calls that need one, and says why.
        if desk is not None and (run.options is None or run.options.approvals):

            async def approve(uses: Any) -> Any:
                if committer is not None:
                    await committer.drain()  # the requests follow what the run logged before them
                return await desk.ask(session, run.fence, uses, lambda events: self._logged(run, events))

            approver: Approver = approve
            extra["approve"] = approver
        return run.agent.run(  # type: ignore[no-any-return]
            session.messages, run.message, run.max_turns, run.options, **extra
        )

    def _charge_cut_turn(self, run: Run, usage: Usage) -> None:
        """A model turn cancelled mid-answer: its usage (estimated by the agent) counts like a
        finished turn's, in the run's ``done``, the session's total and the owner's quota."""
        progress, session = run.progress, run.session
        progress.turns += 1
        progress.usage = progress.usage + usage
        session.usage = session.usage + usage
        self._gate.used(session.owner, usage)

    async def _finish(self, run: Run, terminal: Event) -> None:
        # Free the session before the terminal event is seen, so a client that reads `done`
        # may start its next query at once without a 409.
        session = run.session
        released = self._forget(run)
        session.status = IDLE
        session.run_id, session.run_message, session.run_start_id = "", "", 0
        session.touch()
        self._observer.run_finished(run.id, terminal, appended=2)
        self._end_span(run, terminal)  # before the terminal event is seen: its trace is whole
        log.info(
            "query ended: %s after %d turn(s)",
            getattr(terminal, "code", None) or getattr(terminal, "stop_reason", None) or terminal.type,
            run.progress.turns,
        )
        if released is not None:
            await released  # the owner's slot is free everywhere before anyone reads the end
        with _suppress_store_errors(run):
            await self._store_finish(run, [StatusChange(status=IDLE), terminal])

    @staticmethod
    def _end_span(run: Run, terminal: Event) -> None:
        if run.span is not None:
            span, run.span = run.span, None
            traces.end_query(span, terminal)

    async def _store_finish(self, run: Run, events: list[Event]) -> None:
        if self._store is not None:
            await self._store.finish_run(run.session, run.fence, events)
        else:
            close_approvals(run.session)
            await append_unless_closed(run.session.log, events)


def with_ids(options: RunOptions) -> RunOptions:
    """``options`` with the ids of the query's messages filled in: the user's (unless the query
    adds none) and the answer's."""
    message_id = options.message_id or ("" if options.resume else conversation.new_message_id())
    reply_id = options.reply_id or conversation.new_message_id()
    if message_id == options.message_id and reply_id == options.reply_id:
        return options
    return dataclasses.replace(options, message_id=message_id, reply_id=reply_id)


def rewind_index(messages: list[dict[str, Any]], options: RunOptions) -> int | None:
    """Where a query's rewind cuts ``messages``: before the answer it regenerates (``resume``)
    or before the user's message it edits. :class:`MessageNotFound` when the conversation holds
    no such message (None with ``rewind_if_held``). Checked once the run holds the session, on the
    conversation as it stands then: another tab may have cut it, and a shared store's copy is
    read afresh by the claim."""
    wanted = options.rewind_to
    index = conversation.find(messages, wanted)
    if index is None and options.rewind_if_held:
        return None
    if options.resume:
        if index is None or not conversation.answer_starts(messages, index):
            raise MessageNotFound(f"this session holds no answer with the id {wanted!r} to regenerate")
    elif index is None or not conversation.is_user_text(messages[index]):
        raise MessageNotFound(f"this session holds no message of the user with the id {wanted!r} to edit")
    return index


async def _settle(committer: Committer, run: Run) -> None:
    """Wait for a stopped run's queued appends; only a lost run or store goes on to the caller."""
    try:
        await committer.drain()
    except (RunLost, StoreUnavailable):
        raise
    except Exception:
        log.exception("run %s of session %s: its last events could not be logged", run.id, run.session.id)


@contextlib.contextmanager
def _suppress_store_errors(run: Run) -> Iterator[None]:
    """Log, rather than raise, a store failure while a run ends: its claim then expires and
    watchers are told the query was interrupted."""
    try:
        yield
    except (RunLost, StoreUnavailable) as exc:
        log.warning("run %s of session %s could not end cleanly: %s", run.id, run.session.id, exc)
