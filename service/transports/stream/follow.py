"""Following a session's event log: the one subscription path every transport reads through.

A :class:`Follower` hands out batches of log entries after an id, then says how the following
ended, as a typed :class:`Ending`: the run's terminal event was reached (``done``), the log
closed (``closed``: the session was deleted or the server is going away), the reader fell behind
the purge horizon (``purged``), or the shared store went away (``store_unavailable``); a writer
also ends a following when the client's token expires (``token_expired``). A
transport never meets :class:`~service.errors.EventsPurged` or
:class:`~service.errors.StoreUnavailable` from the log, so no stream can end without telling
its client why, and no error can escape once a stream's headers are out.

When to stop is the caller's choice (:class:`Stop`): at the first terminal event (one run's
stream: ``POST /agent/stream``, ``GET /sessions/{id}/stream``, a WebSocket ``run``), at a
terminal event that is the log's newest (the session stream, which closes after the ``done``
that ends the log), or never (WebSocket and MCP subscriptions, which end when their client
leaves).
"""

from __future__ import annotations

import enum
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal

from service.core.direct import Deliver, DeliverMany
from service.core.events import RunError, is_terminal
from service.core.log import EventLog, LogEntry
from service.errors import EventsPurged, StoreUnavailable

EndReason = Literal["done", "closed", "purged", "store_unavailable", "token_expired"]


class Stop(enum.Enum):
    """When a follower stops by itself."""

    NEVER = "never"
    AT_TERMINAL = "at_terminal"
    AT_REST = "at_rest"


@dataclass(frozen=True, slots=True)
class Ending:
    """How a following ended, and the last id it handed out."""

    reason: EndReason
    last_id: int
    message: str = ""
    oldest_id: int | None = None

    @property
    def clean(self) -> bool:
        """True when the reader saw everything it asked for (the run's end)."""
        return self.reason == "done"

    @property
    def code(self) -> str:
        """The error code a client sees for an unclean ending."""
        return {"purged": "events_purged", "closed": "stream_ended"}.get(self.reason, self.reason)

    def as_error(self) -> RunError:
        """The ending as a canonical error event (not logged), for dialects that end with one."""
        return RunError(error=self.message, code=self.code, recoverable=True)

    def error_fields(self) -> dict[str, int]:
        """Where a reader stood: ``last_id``, and ``oldest_id`` when events were purged."""
        fields = {"last_id": self.last_id}
        if self.oldest_id is not None:
            fields["oldest_id"] = self.oldest_id
        return fields


class Follower:
    """Batches of a log's entries after ``after``; :attr:`ending` says how they ended.

    Use as ``async with Follower(log, after) as batches: async for batch in batches: ...``.
    With ``idle_timeout``, an empty batch comes whenever nothing was appended for that long, so a
    transport can send a keep-alive. :attr:`last_id` is the id of the last entry handed out.
    :attr:`waiting` is True while the follower waits on the log for what comes next: only then may
    a shutdown interrupt it without cutting anything short (the SSE streams' drain relies on it).

    With ``deliver`` (see :data:`~service.core.direct.Deliver`), live entries may be handed to it
    while the follower waits, except the one it stops at; :attr:`last_id` counts those too. With
    ``deliver_many`` as well, a log that holds its entries for a window hands them over together.
    """

    def __init__(
        self,
        log: EventLog,
        after: int,
        *,
        stop: Stop = Stop.NEVER,
        idle_timeout: float | None = None,
        deliver: Deliver | None = None,
        deliver_many: DeliverMany | None = None,
    ) -> None:
        self.log = log
        self.last_id = after
        self.stop = stop
        self.idle_timeout = idle_timeout
        self._deliver = deliver
        self._deliver_many = deliver_many
        self.waiting = False
        self.ending: Ending | None = None
        self._batches = self._follow()

    async def __aenter__(self) -> AsyncGenerator[list[LogEntry], None]:
        return self._batches

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._batches.aclose()

    async def _follow(self) -> AsyncGenerator[list[LogEntry], None]:
        deliver = self._take if self._deliver is not None else None
        many = self._take_many if deliver is not None and self._deliver_many is not None else None
        subscription = self.log.subscribe(
            self.last_id, idle_timeout=self.idle_timeout, deliver=deliver, deliver_many=many
        )
        # Read once: this loop runs once per batch for every subscriber.
        stop = self.stop
        try:
            while True:
                self.waiting = True
                try:
                    batch = await anext(subscription)
                except StopAsyncIteration:
                    break
                finally:
                    self.waiting = False
                if not batch:
                    yield batch
                    continue
                terminal = None if stop is Stop.NEVER else self._cut(batch)
                if terminal is not None:
                    batch = batch[: terminal + 1]
                self.last_id = batch[-1].id
                yield batch
                if terminal is not None and (
                    stop is Stop.AT_TERMINAL or self.last_id == await self.log.last_id()
                ):
                    self.ending = Ending("done", self.last_id)
                    return
            self.ending = Ending("closed", self.last_id, "the stream ended early")
        except EventsPurged as exc:
            # This reader fell behind the purge horizon; resuming from last_id gets the 410 with a
            # snapshot to rebuild from.
            self.ending = Ending("purged", self.last_id, str(exc), exc.oldest_id)
        except StoreUnavailable as exc:
            # The client resumes from last_id once the store is back (a 503 until then).
            self.ending = Ending(
                "store_unavailable", self.last_id, str(exc) or "session storage is unavailable"
            )
        finally:
            await subscription.aclose()

    def _take(self, entry: LogEntry) -> bool:
        """An entry handed over while the follower waits: the transport's ``deliver`` writes it,
        unless it is where this follower stops (that one comes as a batch, to end the stream)."""
        if self.stop is not Stop.NEVER and is_terminal(entry.event):
            return False
        if not self._deliver(entry):  # type: ignore[misc]
            return False
        self.last_id = entry.id
        return True

    def _take_many(self, entries: list[LogEntry], shared: dict[Any, Any]) -> bool:
        """Entries handed over together (see :meth:`_take`): a stretch holding the entry this
        follower stops at comes as a batch."""
        if self.stop is not Stop.NEVER:
            key = ("terminal", entries[0].id)  # the same for every follower given these entries
            ends = shared.get(key)
            if ends is None:
                ends = shared[key] = any(is_terminal(entry.event) for entry in entries)
            if ends:
                return False
        if not self._deliver_many(entries, shared):  # type: ignore[misc]
            return False
        self.last_id = entries[-1].id
        return True

    def _cut(self, batch: list[LogEntry]) -> int | None:
        """The index of the terminal event this follower stops at, if the batch holds one."""
        if self.stop is Stop.AT_TERMINAL:
            for index, entry in enumerate(batch):
                if is_terminal(entry.event):
                    return index
        elif self.stop is Stop.AT_REST and is_terminal(batch[-1].event):
            return len(batch) - 1
        return None


class ThroughRun:
    """A query's log entries after ``after`` through to its terminal event, going on past the
    stretches purged before they were read (a log too small for the run): :attr:`skipped` says
    some were, and the run's end still tells how it ended (``RunDone.output`` has the whole
    answer). :attr:`ending` is how the last following ended.

    Use ``async with contextlib.aclosing(ThroughRun(log).batches()) as batches``, so a reader that
    stops early closes its subscription at once.
    """

    def __init__(self, log: EventLog, after: int = 0) -> None:
        self.log = log
        self.after = after
        self.skipped = False
        self.ending: Ending | None = None

    async def batches(self) -> AsyncGenerator[list[LogEntry], None]:
        """The entries, a batch at a time."""
        after = self.after
        while True:
            follower = Follower(self.log, after, stop=Stop.AT_TERMINAL)
            async with follower as batches:
                async for batch in batches:
                    yield batch
            ending = self.ending = follower.ending
            if ending is None or ending.reason != "purged":
                return
            self.skipped = True
            after = (ending.oldest_id or ending.last_id + 1) - 1
