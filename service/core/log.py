"""Event logs: one append-only, byte-bounded log of canonical events per session.

Contract of :class:`EventLog` (every implementation, in memory or on Redis Streams, keeps it):

- ``append`` gives the event the next integer id (1, 2, 3, ...; never reused) and stores it.
  New events are always stored; when the log is over its byte bound the oldest go first.
- ``read(after_id)`` returns the kept events with an id above ``after_id``; if some of those
  were purged it raises :class:`~service.errors.EventsPurged` (or, with ``strict=False``, starts
  at the oldest kept one).
- ``subscribe(after_id)`` is an async iterator of *batches* (lists of entries, in id order):
  first everything kept after ``after_id``, then each new append as it happens. Each subscriber
  reads at its own pace from the log itself, so a slow one never slows the writer or the others
  and costs no memory beyond the log's bound; one that falls behind the purge horizon gets
  ``EventsPurged``. The iterator ends once the log is closed and the subscriber has read all.
- ``subscribe(..., deliver=)`` may, while the subscriber waits, hand it each new entry at once,
  from the appending task, instead of waking it (see :data:`Deliver`); with ``deliver_many=``,
  several at once (:mod:`service.core.direct`). A log is free not to.
"""

from __future__ import annotations

import abc
import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable

from service.core.direct import NO_COALESCING, Coalescing, Deliver, DeliverMany, Direct, DirectSet
from service.core.entry import LogEntry
from service.core.events import Event, TextDelta
from service.core.wakeup import IdleWait, Wakeup
from service.errors import EventsPurged

logger = logging.getLogger(__name__)

# What an entry holds in this process: a fixed part (the entry, the event object, the wire
# encodings the transports cache on it) plus a multiple of the event's JSON. The byte bound counts
# that, so it bounds the memory really used; tests/core/test_log.py holds these two constants to
# what tracemalloc sees (measured: docs/benchmarks.md, section Memory per log entry).
ENTRY_OVERHEAD_BYTES = 1200
ENTRY_JSON_FACTOR = 3


def entry_bytes(json_length: int) -> int:
    """The memory an entry of an event with that much JSON holds, as the byte bound counts it."""
    return ENTRY_OVERHEAD_BYTES + ENTRY_JSON_FACTOR * json_length


# A text delta's JSON is '{"type":"text_delta","text":' + its text as a JSON string + ',"turn":'
# + its turn + '}': pydantic's own output, measured here rather than made per token.
_TEXT_DELTA_FRAME = len('{"type":"text_delta","text":,"turn":}')
_json_string = json.encoder.encode_basestring  # escapes as pydantic does: quotes, \\ and controls


def json_length(event: Event) -> int:
    """``len(event.model_dump_json())``, without serialising the event that comes per token."""
    if type(event) is TextDelta:
        return _TEXT_DELTA_FRAME + len(_json_string(event.text)) + len(str(event.turn))
    return len(event.model_dump_json())


class EventLog(abc.ABC):
    """The interface every event log implements (see the module docstring for the contract)."""

    # True when each append waits on a round trip (a shared store): a run then sends the events
    # its agent yields while one append is on its way together, with append_many.
    round_trips = False

    @abc.abstractmethod
    async def append(self, event: Event, *, fence: str | None = None) -> LogEntry:
        """Store ``event`` under the next id and wake the subscribers.

        ``fence`` is the claim of the run that writes (see ``SessionStore.claim_run``): a shared
        log refuses the append with :class:`~service.errors.RunLost` once that claim has expired,
        so a run another instance declared interrupted writes nothing more.
        """

    async def append_many(self, events: list[Event], *, fence: str | None = None) -> list[LogEntry]:
        """Store ``events`` under the next ids, in order, as :meth:`append` does each."""
        return [await self.append(event, fence=fence) for event in events]

    def synchronous_append(self) -> Callable[[Event], LogEntry] | None:
        """:meth:`append` as a plain function, for a log whose append never waits (a run appends
        per token, and a coroutine per token costs); None for any other log."""
        return None

    def resume_after(self, last_id: int) -> None:
        """Continue a log kept elsewhere: the next append gets ``last_id + 1``, and the ids up to
        ``last_id`` count as purged. Only on a log nothing was appended to yet."""
        raise NotImplementedError(f"{type(self).__name__} resumes through its store")

    @abc.abstractmethod
    async def read(self, after_id: int, limit: int | None = None, *, strict: bool = True) -> list[LogEntry]:
        """Return the kept events after ``after_id`` (at most ``limit``)."""

    @abc.abstractmethod
    def subscribe(
        self,
        after_id: int = 0,
        *,
        idle_timeout: float | None = None,
        deliver: Deliver | None = None,
        deliver_many: DeliverMany | None = None,
    ) -> AsyncIterator[list[LogEntry]]:
        """Batches of entries after ``after_id``: the kept ones, then live ones.

        With ``idle_timeout``, an empty batch comes whenever nothing was appended for that long,
        so a transport can send a keep-alive without cancelling the iterator. With ``deliver``,
        the log may hand live entries to it instead (see :data:`Deliver`); each entry comes once,
        one way or the other, in order.
        """

    @abc.abstractmethod
    async def last_id(self) -> int:
        """The id of the newest event, 0 when none was ever appended."""

    @abc.abstractmethod
    async def first_id(self) -> int:
        """The id of the oldest event kept (``last_id() + 1`` when none is kept)."""

    @abc.abstractmethod
    async def kept_bytes(self) -> int:
        """The size of the kept events (their JSON), which the log keeps under its bound."""

    @abc.abstractmethod
    async def close(self) -> None:
        """No more appends; subscribers end after reading what is kept."""

    @property
    @abc.abstractmethod
    def closed(self) -> bool:
        """True once :meth:`close` was called."""


class MemoryEventLog(EventLog):
    """An :class:`EventLog` held in this process's memory."""

    def __init__(self, max_bytes: int = 10 * 1024 * 1024, coalescing: Coalescing = NO_COALESCING) -> None:
        self._max_bytes = max_bytes
        # A list with a moving start offset gives O(1) lookup by id; it is compacted now and then.
        self._entries: list[LogEntry] = []
        self._start = 0
        self._bytes = 0
        self._last_id = 0
        self._closed = False
        self._wakeup = Wakeup()
        # The subscriptions waiting with a ``deliver``: appends go to them directly.
        self._direct = DirectSet(coalescing)
        self.subscribers = 0  # subscriptions open now, to show that a transport cleans up
        self._subscribers_changed = asyncio.Event()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    @property
    def windows(self) -> int:
        """How many coalescing windows were handed to the waiting subscribers."""
        return self._direct.windows

    @property
    def size_bytes(self) -> int:
        """Bytes held by the kept events."""
        return self._bytes

    def resume_after(self, last_id: int) -> None:
        if self._last_id:
            raise RuntimeError("a log resumes only before its first append")
        self._last_id = last_id

    def _first_id(self) -> int:
        if self._start < len(self._entries):
            return self._entries[self._start].id
        return self._last_id + 1

    async def append(self, event: Event, *, fence: str | None = None) -> LogEntry:
        return self.append_now(event)

    def synchronous_append(self) -> Callable[[Event], LogEntry] | None:
        # Not for a subclass whose append does more than this one's.
        return self.append_now if type(self).append is MemoryEventLog.append else None

    def append_now(self, event: Event) -> LogEntry:
        """:meth:`append`, without a coroutine: nothing here waits (a run appends per token)."""
        if self._closed:
            raise RuntimeError("event log is closed")
        self._last_id += 1
        entry = LogEntry(self._last_id, event, entry_bytes(json_length(event)))
        self._entries.append(entry)
        self._bytes += entry.size
        if self._bytes > self._max_bytes:  # the start moves only here, and the compaction with it
            self._purge()
        if self._direct:
            self._direct.offer(entry)
        self._wake()
        return entry

    def _purge(self) -> None:
        # The newest event always stays, even when it alone is over the bound.
        while self._bytes > self._max_bytes and len(self._entries) - self._start > 1:
            self._bytes -= self._entries[self._start].size
            self._start += 1
        if self._start > 1024 and self._start * 2 > len(self._entries):
            del self._entries[: self._start]
            self._start = 0

    def _wake(self) -> None:
        self._wakeup.notify()

    def _after(self, after_id: int, limit: int | None, strict: bool) -> list[LogEntry]:
        first = self._first_id()
        if after_id < first - 1:
            if strict:
                raise EventsPurged(after_id, first)
            after_id = first - 1
        begin = self._start + (after_id - first + 1)
        end = len(self._entries) if limit is None else min(len(self._entries), begin + limit)
        return self._entries[begin:end]

    async def read(self, after_id: int, limit: int | None = None, *, strict: bool = True) -> list[LogEntry]:
        return self._after(max(after_id, 0), limit, strict)

    async def subscribe(
        self,
        after_id: int = 0,
        *,
        idle_timeout: float | None = None,
        deliver: Deliver | None = None,
        deliver_many: DeliverMany | None = None,
    ) -> AsyncIterator[list[LogEntry]]:
        cursor = max(after_id, 0)
        idle = IdleWait(idle_timeout) if idle_timeout is not None else None
        direct = Direct(deliver, idle, deliver_many) if deliver is not None else None
        self._count_subscriber(+1)
        try:
            while True:
                batch = self._after(cursor, None, strict=True)
                if batch:
                    cursor = batch[-1].id
                    if idle is not None:
                        idle.news()
                    yield batch
                    continue
                if self._closed:
                    return
                # Nothing can be appended between the look above and taking the waiter: no await.
                if direct is None:
                    waiter = self._wakeup.waiter()
                else:
                    waiter = direct.wait_from(cursor)
                    self._direct.add(direct)
                try:
                    if idle is None:
                        await waiter
                        continue
                    if await idle.wait(waiter):
                        continue
                finally:
                    if direct is not None:
                        # What deliver took is behind the subscription now.
                        cursor = direct.cursor
                        self._direct.discard(direct)
                yield []
        finally:
            if idle is not None:
                idle.close()
            self._count_subscriber(-1)

    def _count_subscriber(self, change: int) -> None:
        self.subscribers += change
        changed, self._subscribers_changed = self._subscribers_changed, asyncio.Event()
        changed.set()

    async def wait_subscribers(self, count: int) -> None:
        """Return once exactly ``count`` subscriptions are open."""
        while self.subscribers != count:
            await self._subscribers_changed.wait()

    async def last_id(self) -> int:
        return self._last_id

    async def kept_bytes(self) -> int:
        return self._bytes

    async def first_id(self) -> int:
        return self._first_id()

    async def close(self) -> None:
        self._closed = True
        self._direct.wake_all()
        self._wake()
