"""The one reader per instance: a blocking ``XREAD`` over the logs its clients follow, decoding each
new entry once into a shared in-memory tail and waking the local subscribers.

A log whose query runs on this instance is kept current by the instance's own appends
(:meth:`Tail.stored`), so the reader leaves it out of its ``XREAD`` while they go on: Redis does not
send the run's tokens back to the instance that wrote them. The log comes back into the read
:data:`LOCAL_QUIET_S` after the last local append, or at once when an append finds that another
instance wrote in between (a gap before its ids).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import deque
from typing import Any

from redis.asyncio.connection import Connection
from redis.exceptions import RedisError

from service.core.direct import NO_COALESCING, Coalescing, DirectSet
from service.core.events import Event, StatusChange
from service.core.log import LogEntry
from service.core.sessions import (
    ACTIVE,
    IDLE,
    RUNNING,
)
from service.core.wakeup import Wakeup
from service.errors import StoreUnavailable
from service.store.connection import (
    READ_BATCH,
    TAIL_ENTRIES,
    RedisConnections,
    decode_entry,
    held,
    send_commands,
    stream_entry_id,
    unavailable,
)

log = logging.getLogger(__name__)

# How long after this instance's last append to a log the reader leaves that log out of its XREAD.
LOCAL_QUIET_S = 0.25


class Tail:
    """One followed log on this instance: the newest entries, decoded once, and a wake-up."""

    __slots__ = (
        "session_id",
        "key",
        "cursor",
        "entries",
        "wakeup",
        "closed",
        "failed",
        "refs",
        "status",
        "appended",
        "pending",
        "local_until",
        "regap",
        "direct",
    )

    def __init__(
        self, session_id: str, key: str, cursor: int, status: str, coalescing: Coalescing = NO_COALESCING
    ) -> None:
        self.session_id = session_id
        self.key = key
        self.cursor = cursor  # the newest id the reader has seen
        self.entries: deque[LogEntry] = deque(maxlen=TAIL_ENTRIES)
        self.wakeup = Wakeup()
        self.closed = False
        self.failed: StoreUnavailable | None = None
        self.refs = 0
        # RUNNING while a query is in flight (waiting for an approval too), so it is checked.
        self.status = RUNNING if status in ACTIVE else IDLE
        # Entries this instance appended, by id, and the events of appends on their way, by their
        # JSON: the reader takes these instead of decoding the same JSON again.
        self.appended: dict[int, LogEntry] = {}
        self.pending: dict[str, Event] = {}
        # Until when (time.monotonic()) this instance's own appends keep the tail current, so the
        # reader need not read the log; ``regap`` is called when an append finds a gap.
        self.local_until = 0.0
        self.regap: Any = None
        # The subscriptions waiting with a deliver, caught up with the cursor: each new entry is
        # handed to them (in windows, when they are many) instead of waking their tasks.
        self.direct = DirectSet(coalescing)

    def wake(self) -> None:
        self.wakeup.notify()
        if self.closed or self.failed is not None:
            self.direct.wake_all()

    def take(self, entry: LogEntry) -> None:
        """Add the entry that follows the cursor (the caller wakes the subscribers)."""
        self.cursor = entry.id
        event = entry.event
        if isinstance(event, StatusChange):
            self.status = RUNNING if event.status in ACTIVE else IDLE
        self.entries.append(entry)
        if self.direct:
            self.direct.offer(entry)

    def stored(self, entries: list[LogEntry]) -> None:
        """Entries this instance has just appended. When they follow the cursor they are the
        subscribers' at once (a round trip sooner than through the reader, which then skips
        them); otherwise the reader takes them when it gets there."""
        if entries[0].id <= self.cursor + 1 and not self.closed and self.failed is None:
            # Following the cursor, or partly read already by the reader (it can be quicker
            # than the append's reply): the rest are the subscribers' now.
            fresh = entries if entries[0].id > self.cursor else [e for e in entries if e.id > self.cursor]
            for entry in fresh:
                self.take(entry)
            if fresh:
                self.wake()
            self.local_until = time.monotonic() + LOCAL_QUIET_S
            return
        if self.local_until:
            # Another instance wrote in between: the reader must read this log again, now.
            self.local_until = 0.0
            if self.regap is not None:
                self.regap()
        appended = self.appended
        for entry in entries:
            if entry.id > self.cursor and len(appended) < TAIL_ENTRIES:
                appended[entry.id] = entry

    def after(self, cursor: int) -> list[LogEntry] | None:
        """The cached entries after ``cursor``; ``None`` when the cache does not reach back."""
        if cursor >= self.cursor:
            return []
        entries = self.entries
        if not entries or entries[0].id > cursor + 1:
            return None
        # The newest ``self.cursor - cursor`` entries, taken from the right end: O(batch).
        wanted = self.cursor - cursor
        if wanted == 1:
            return [entries[-1]]
        batch = list(itertools.islice(reversed(entries), wanted))
        batch.reverse()
        return batch


class Fanout:
    """The one Redis reader of an instance, feeding every local subscriber of every session."""

    def __init__(self, backend: RedisConnections) -> None:
        self.backend = backend
        self.tails: dict[str, Tail] = {}
        self._by_key: dict[str, Tail] = {}
        self._wake_key = f"{backend.prefix}:wake:{backend.instance_id}"
        self._wake_cursor = "$"
        self._check_interval = backend.check_interval_s
        self._last_check = time.monotonic()
        self._last_exists_check = time.monotonic()
        self.subscribers = 0
        self._subscribers_changed = asyncio.Event()
        self._connection: Connection | None = None  # the reader's own, for its blocking XREAD
        self._pokes: set[asyncio.Task[None]] = set()
        self.coalescing = NO_COALESCING  # the app's (AGENT_COALESCE_*), for each new tail
        self._windows_before = 0  # the coalescing windows of the tails dropped since

    def _count(self, change: int) -> None:
        self.subscribers += change
        changed, self._subscribers_changed = self._subscribers_changed, asyncio.Event()
        changed.set()

    @property
    def windows(self) -> int:
        """How many coalescing windows this instance's tails handed to their subscribers."""
        return self._windows_before + sum(tail.direct.windows for tail in self.tails.values())

    def subscribers_of(self, session_id: str) -> int:
        tail = self.tails.get(session_id)
        return tail.refs if tail is not None else 0

    async def wait_subscribers(self, session_id: str, count: int) -> None:
        while self.subscribers_of(session_id) != count:
            await self._subscribers_changed.wait()

    async def watch(self, session_id: str, status: str) -> Tail:
        tail = self.tails.get(session_id)
        if tail is None:
            backend = self.backend
            async with backend.call():
                last = int(await backend.redis.hget(backend.meta_key(session_id), "last_id") or 0)
            tail = self.tails.get(session_id)  # another subscriber may have won the race
            if tail is None:
                tail = Tail(session_id, backend.log_key(session_id), last, status, self.coalescing)
                tail.regap = self._regap
                self.tails[session_id] = tail
                self._by_key[tail.key] = tail
                await self._poke()
        tail.refs += 1
        self._count(+1)
        return tail

    def unwatch(self, tail: Tail) -> None:
        tail.refs -= 1
        if tail.refs <= 0 and self.tails.get(tail.session_id) is tail:
            self._windows_before += tail.direct.windows
            del self.tails[tail.session_id]
            self._by_key.pop(tail.key, None)
        self._count(-1)

    def reread(self, session_id: str) -> None:
        """This instance wrote to the log other than through its appends (a script that ends or
        claims a query): the reader reads it again now if it had left it out."""
        tail = self.tails.get(session_id)
        if tail is not None and tail.local_until:
            tail.local_until = 0.0
            self._regap()

    def _regap(self) -> None:
        task = asyncio.get_running_loop().create_task(self._poke())
        self._pokes.add(task)
        task.add_done_callback(self._pokes.discard)

    async def _poke(self) -> None:
        """Make the blocked XREAD return, so it picks up a newly followed log."""
        with contextlib.suppress(StoreUnavailable, RedisError):
            async with self.backend.call():
                await self.backend.redis.xadd(self._wake_key, {"w": "1"}, maxlen=16, approximate=True)

    def fail_all(self, error: StoreUnavailable) -> None:
        for tail in list(self.tails.values()):
            tail.failed = error
            tail.wake()
        # Failed tails are dropped: a resuming client starts a fresh one.
        self.tails.clear()
        self._by_key.clear()

    def streams(self) -> tuple[dict[str, str], float]:
        """What the next ``XREAD`` reads (key -> the id after which) and how long it may block."""
        streams: dict[str, str] = {self._wake_key: self._wake_cursor}
        now = time.monotonic()
        block = self._check_interval
        for tail in self.tails.values():
            if tail.local_until > now:
                # Kept current by this instance's appends: read again once they pause.
                block = min(block, tail.local_until - now)
            else:
                streams[tail.key] = f"{tail.cursor}-0"
        return streams, block

    async def run(self) -> None:
        backend = self.backend
        delay = 0.05
        while not backend.stopping:
            streams, block = self.streams()
            try:
                if self._wake_cursor == "$":
                    # Learn the wake stream's position first, so no poke is missed later.
                    async with backend.call():
                        newest = await backend.reader_redis.xrevrange(self._wake_key, count=1)
                    self._wake_cursor = newest[0][0] if newest else "0-0"
                    continue
                # A Redis that hangs ends the followed logs too, once the block plus the deadline
                # is over, and its subscribers resume once it answers again.
                command = (
                    "XREAD",
                    "COUNT",
                    READ_BATCH,
                    "BLOCK",
                    max(1, int(block * 1000)),
                    "STREAMS",
                    *streams,
                    *streams.values(),
                )
                async with backend.call(extra_s=self._check_interval):
                    if self._connection is None:
                        self._connection = await held(backend.reader_redis)
                    # The reply as Redis sends it: {key: [[id, [field, value, ...]], ...]} (RESP3,
                    # redis-py's default), or [[key, entries], ...] (RESP2)
                    (result,) = await send_commands(self._connection, [command])
                if isinstance(result, Exception):
                    raise result
                delay = 0.05
                backend.connected = True
            except asyncio.CancelledError:
                raise
            except (StoreUnavailable, RedisError) as exc:
                if backend.stopping:
                    return
                backend.connected = False
                if self.tails:
                    log.warning("lost Redis (%s): ending %d followed log(s); retrying", exc, len(self.tails))
                self.fail_all(exc if isinstance(exc, StoreUnavailable) else unavailable(exc))
                self._wake_cursor = "$"
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            for key, items in result.items() if isinstance(result, dict) else result or ():
                if key == self._wake_key:
                    self._wake_cursor = items[-1][0]
                    continue
                tail = self._by_key.get(key)
                if tail is not None:
                    self._deliver(tail, items)
            if time.monotonic() - self._last_check >= self._check_interval:
                await self._check()

    def _deliver(self, tail: Tail, items: list[list[Any]]) -> None:
        for stream_id, fields in items:
            entry_id = stream_entry_id(stream_id)
            if entry_id <= tail.cursor:
                continue  # this instance's own append, the subscribers' already
            if entry_id != tail.cursor + 1:
                # Entries were purged before this reader saw them: the cache must stay
                # contiguous, so it starts over (readers further back go to Redis).
                tail.entries.clear()
                tail.appended.clear()
            entry = tail.appended.pop(entry_id, None) or decode_entry(
                stream_id, dict(zip(fields[::2], fields[1::2], strict=True)), tail.pending
            )
            if entry is None:
                # The mark of a deleted session is not an event: the cursor stays on the last one.
                tail.closed = True
                break
            tail.take(entry)
        tail.wake()

    async def _check(self) -> None:
        """End the queries of followed sessions whose claims expired; notice deleted sessions."""
        self._last_check = time.monotonic()
        backend = self.backend
        running = [tail for tail in self.tails.values() if tail.status == RUNNING]
        try:
            if running:
                async with backend.call(), backend.control.pipeline(transaction=False) as pipe:
                    for tail in running:
                        await backend.control_scripts["REAP"](
                            keys=backend.session_keys(tail.session_id),
                            args=[*backend.interrupt_args(), ""],
                            client=pipe,
                        )
                    await pipe.execute()
            if time.monotonic() - self._last_exists_check >= 5.0 and self.tails:
                self._last_exists_check = time.monotonic()
                tails = list(self.tails.values())
                async with backend.call(), backend.control.pipeline(transaction=False) as pipe:
                    for tail in tails:
                        pipe.exists(backend.meta_key(tail.session_id))
                    found = await pipe.execute()
                for tail, exists in zip(tails, found, strict=True):
                    if not exists:
                        tail.closed = True
                        tail.wake()
        except (StoreUnavailable, RedisError) as exc:
            log.warning("session check failed: %s", exc)
