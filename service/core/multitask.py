"""A second message while a query runs: what ``multitask_strategy`` asks for.

- ``reject`` (the default): :class:`~service.errors.RunInProgress`, a 409.
- ``enqueue``: the message waits behind the running query and starts once it has ended (at most
  ``AGENT_MAX_QUEUED`` per session on an instance; past that, a 429). Each instance keeps its
  own queue, in order: a queued message starts when the session's query ends, whichever
  instance ran it, as the end is read from the session's log.
- ``interrupt``: the running query is cancelled (its partial answer kept and marked
  ``interrupted``) and the new one starts.
- ``rollback``: cancelled and its message rewound away with everything after it (logged as
  ``conversation_rewound``), then the new one starts.

With no query running, every strategy starts the message at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections import deque
from contextlib import aclosing
from dataclasses import dataclass, field

from service.core.events import RunStarted, is_terminal
from service.core.options import RunOptions
from service.core.run_state import Run
from service.core.runs import RunManager
from service.core.sessions import Session
from service.errors import QuotaExceeded, RunInProgress

log = logging.getLogger(__name__)

REJECT, ENQUEUE, INTERRUPT, ROLLBACK = "reject", "enqueue", "interrupt", "rollback"
STRATEGIES = (REJECT, ENQUEUE, INTERRUPT, ROLLBACK)
# How often an interrupt retries when another sender's query starts between its cancel and its start.
_INTERRUPT_TRIES = 3


@dataclass
class Sent:
    """What became of a message: its run, started now, or its place in the queue (1: next),
    with ``started`` resolving to its run once it starts (or to the error that dropped it)."""

    run: Run | None = None
    queued: int = 0
    started: asyncio.Future[Run] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


@dataclass
class _Queued:
    message: str
    max_turns: int | None
    options: RunOptions | None
    sent: Sent


class Multitask:
    """Sends messages to sessions by a strategy, and keeps the queued ones of this instance."""

    def __init__(self, runs: RunManager, *, max_queued: int = 8) -> None:
        self.runs = runs
        self.max_queued = max_queued
        self._queues: dict[str, deque[_Queued]] = {}
        self._drainers: dict[str, asyncio.Task[None]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def queued(self, session_id: str) -> int:
        """How many messages wait on this instance behind the session's query."""
        return len(self._queues.get(session_id, ()))

    async def send(
        self,
        session: Session,
        message: str,
        max_turns: int | None = None,
        options: RunOptions | None = None,
        strategy: str = REJECT,
    ) -> Sent:
        """Start ``message`` on ``session`` as ``strategy`` says (see the module docstring)."""
        if strategy == ENQUEUE:
            return await self._enqueue(session, message, max_turns, options)
        if strategy in (INTERRUPT, ROLLBACK):
            # One at a time per session here: a second interrupt stops the query the first
            # started, not one still starting (another instance's is retried below).
            lock = self._locks.setdefault(session.id, asyncio.Lock())
            try:
                async with lock:
                    return await self._interrupt(session, message, max_turns, options, strategy == ROLLBACK)
            finally:
                if not lock.locked():
                    self._locks.pop(session.id, None)
        return _now(await self.runs.start(session, message, max_turns, options))

    async def _interrupt(
        self,
        session: Session,
        message: str,
        max_turns: int | None,
        options: RunOptions | None,
        rollback: bool,
    ) -> Sent:
        for attempt in range(_INTERRUPT_TRIES):
            # After a first try lost to another sender's query, that one is stopped too.
            if attempt or session.active or self.runs.get(session.id) is not None:
                options = await self._stop(session, options, rollback=rollback)
            try:
                return _now(await self.runs.start(session, message, max_turns, options))
            except RunInProgress:
                if attempt == _INTERRUPT_TRIES - 1:
                    raise
        raise AssertionError("unreachable")

    async def _stop(
        self, session: Session, options: RunOptions | None, *, rollback: bool
    ) -> RunOptions | None:
        """Cancel the session's query; for a rollback, ``options`` that also rewind its message
        (if the conversation still holds it: a query cancelled before it said anything may have
        left nothing, and a rollback sent at the same moment may have taken it already)."""
        wanted = ""
        if rollback:
            local = self.runs.get(session.id)
            start_id = local.start_id if local is not None else session.run_start_id
            if start_id:
                entries = await session.log.read(start_id - 1, 1, strict=False)
                if entries and isinstance(entries[0].event, RunStarted):
                    wanted = entries[0].event.message_id
        await self.runs.cancel(session.id)
        if not wanted or (options is not None and options.rewind_to):
            return options
        return dataclasses.replace(
            options or RunOptions(), rewind_to=wanted, resume=False, rewind_if_held=True
        )

    async def _enqueue(
        self, session: Session, message: str, max_turns: int | None, options: RunOptions | None
    ) -> Sent:
        queue = self._queues.get(session.id)
        if not queue:
            try:
                return _now(await self.runs.start(session, message, max_turns, options))
            except RunInProgress:
                pass
            queue = self._queues.get(session.id)  # another message was queued meanwhile
        if queue is None:
            queue = self._queues[session.id] = deque()
        if len(queue) >= self.max_queued:
            raise QuotaExceeded(
                f"{self.max_queued} messages already wait behind this session's query; retry once it ends",
                quota="queued",
                limit=self.max_queued,
                retry_after=1,
            )
        sent = Sent(queued=len(queue) + 1)
        queue.append(_Queued(message, max_turns, options, sent))
        if session.id not in self._drainers:
            self._drainers[session.id] = asyncio.create_task(self._drain(session), name=f"queue-{session.id}")
        return sent

    async def _drain(self, session: Session) -> None:
        """Start the session's queued messages in order, each once the query before it ended."""
        queue = self._queues[session.id]
        try:
            while queue and not session.log.closed:
                after = await session.log.last_id()
                head = queue[0]
                try:
                    run = await self.runs.start(session, head.message, head.max_turns, head.options)
                except RunInProgress:
                    await _ended(session, after)
                    continue
                except Exception as exc:  # noqa: BLE001 (dropped, and said so to whoever waits)
                    log.warning("a queued message of session %s was dropped: %s", session.id, exc)
                    queue.popleft()
                    if not head.sent.started.done():
                        head.sent.started.set_exception(exc)
                    continue
                queue.popleft()
                if not head.sent.started.done():
                    head.sent.started.set_result(run)
        finally:
            if self._drainers.get(session.id) is asyncio.current_task():
                del self._drainers[session.id]
            if self._queues.get(session.id) is queue:
                self._drop_all(session.id)

    def drop(self, session_id: str) -> None:
        """Forget the session's queued messages (it is being deleted): none of them starts."""
        drainer = self._drainers.pop(session_id, None)
        if drainer is not None:
            drainer.cancel()
        self._drop_all(session_id)

    def _drop_all(self, session_id: str) -> None:
        queue = self._queues.pop(session_id, deque())
        for item in queue:
            if not item.sent.started.done():
                item.sent.started.cancel()

    async def shutdown(self) -> None:
        """Drop every queued message (their queries never start)."""
        drainers = list(self._drainers.values())
        for task in drainers:
            task.cancel()
        for task in drainers:
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _now(run: Run) -> Sent:
    sent = Sent(run=run)
    sent.started.set_result(run)
    return sent


async def _ended(session: Session, after: int) -> None:
    """Return once the session's log holds a query's end after ``after`` (or the log ends)."""
    async with aclosing(session.log.subscribe(after)) as batches:
        async for batch in batches:
            if any(is_terminal(entry.event) for entry in batch):
                return
