"""A session's event log as a Redis Stream (see :mod:`service.store.redis`)."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from redis.exceptions import ResponseError

from service.core.direct import Deliver, DeliverMany, Direct
from service.core.events import Event
from service.core.log import EventLog, LogEntry, entry_bytes
from service.core.sessions import (
    IDLE,
)
from service.core.wakeup import IdleWait
from service.errors import RunLost
from service.store.backend import RedisBackend
from service.store.connection import READ_BATCH, TAIL_ENTRIES, decode_entry, stream_entry_id

log = logging.getLogger(__name__)


class RedisEventLog(EventLog):
    """A session's event log as a Redis Stream (see the module docstring)."""

    round_trips = True

    def __init__(self, backend: RedisBackend, session_id: str, status: str = IDLE) -> None:
        self._backend = backend
        self._session_id = session_id
        self._status = status
        self._closed = False
        # The keys every call names, made once per log rather than once per event.
        self._keys = backend.session_keys(session_id)
        self._meta_key, self._log_key = self._keys[0], self._keys[1]

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def subscribers(self) -> int:
        """Subscriptions open on this instance now."""
        return self._backend.fanout.subscribers_of(self._session_id)

    async def wait_subscribers(self, count: int) -> None:
        """Return once exactly ``count`` subscriptions are open on this instance."""
        await self._backend.fanout.wait_subscribers(self._session_id, count)

    async def kept_bytes(self) -> int:
        backend = self._backend
        async with backend.call():
            value = await backend.redis.hget(self._meta_key, "bytes")
        return int(value or 0)

    async def append(self, event: Event, *, fence: str | None = None) -> LogEntry:
        return (await self.append_many([event], fence=fence))[0]

    async def append_many(self, events: list[Event], *, fence: str | None = None) -> list[LogEntry]:
        """Store ``events`` under the next ids, in one call to Redis per sixteenth of the byte bound
        they hold: a run's burst costs one round trip (or a few, for a burst that big)."""
        raws = [event.model_dump_json() for event in events]
        sizes = [entry_bytes(len(raw)) for raw in raws]
        # No call pushes more than a sixteenth of the bound out of the log, so a reader a few
        # round trips behind the run is not purged by its batching (an append per round trip,
        # as before batching, never purged one either).
        share = self._backend.max_bytes // 16
        entries: list[LogEntry] = []
        start = total = 0
        for end, size in enumerate(sizes):
            if total and total + size > share:
                entries += await self._append_call(
                    events[start:end], raws[start:end], sizes[start:end], fence
                )
                start, total = end, 0
            total += size
        return entries + await self._append_call(events[start:], raws[start:], sizes[start:], fence)

    async def _append_call(
        self, events: list[Event], raws: list[str], sizes: list[int], fence: str | None
    ) -> list[LogEntry]:
        backend = self._backend
        ts = time.time()
        # Sized as the memory log sizes it, so the one bound keeps the same history in both
        # stores (an entry takes less in Redis, so Redis stays well within it). The token makes
        # a repeated append (redis-py's retries, or a run's below) count once.
        args: list[Any] = [
            fence or "",
            raws[0],
            f"{ts:.6f}",
            sizes[0],
            backend.max_bytes,
            backend.next_token(),
        ]
        for raw, size in zip(raws[1:], sizes[1:], strict=True):
            args += (raw, size)
        tail = backend.fanout.tails.get(self._session_id)
        if tail is not None and len(tail.pending) < TAIL_ENTRIES:
            # The reader may see these entries before the reply comes: it need not decode them.
            tail.pending.update(zip(raws, events, strict=True))
        try:
            if fence:
                last_id = await backend.outlast(lambda: backend.appender.append(self._keys, args))
            else:
                last_id = await backend.appender.append(self._keys, args)
        except ResponseError as exc:
            if "RUNLOST" in str(exc):
                raise RunLost(f"session {self._session_id}: the run's claim expired") from None
            if "NOSESSION" in str(exc):
                self._closed = True
                if fence:
                    # The session vanished under its query: deleted, or Redis came back without
                    # its data. Losing it is not a failure of this service.
                    raise RunLost(
                        f"session {self._session_id} was lost from the store while its query ran "
                        "(deleted, or Redis restarted without its data)"
                    ) from None
                raise RuntimeError("event log is closed") from None
            raise
        finally:
            if tail is not None:
                for raw in raws:
                    tail.pending.pop(raw, None)
        first_id = int(last_id) - len(events) + 1
        entries = [
            LogEntry(first_id + n, event, size, ts)
            for n, (event, size) in enumerate(zip(events, sizes, strict=True))
        ]
        tail = backend.fanout.tails.get(self._session_id)
        if tail is not None:
            tail.stored(entries)
        return entries

    async def _range(self, after_id: int, limit: int | None) -> list[LogEntry]:
        backend = self._backend
        async with backend.call():
            items = await backend.redis.xrange(self._log_key, min=f"{after_id + 1}-0", count=limit or None)
        entries = []
        for stream_id, fields in items:
            entry = decode_entry(stream_id, fields)
            if entry is None:
                self._closed = True
                break
            entries.append(entry)
        return entries

    async def read(self, after_id: int, limit: int | None = None, *, strict: bool = True) -> list[LogEntry]:
        after_id = max(after_id, 0)
        entries = await self._range(after_id, limit)
        if entries and entries[0].id > after_id + 1 and strict:
            from service.errors import EventsPurged

            raise EventsPurged(after_id, entries[0].id)
        return entries

    @property
    def windows(self) -> int:
        """How many coalescing windows this instance handed to its subscribers (of every log)."""
        return self._backend.fanout.windows

    async def subscribe(
        self,
        after_id: int = 0,
        *,
        idle_timeout: float | None = None,
        deliver: Deliver | None = None,
        deliver_many: DeliverMany | None = None,
    ) -> AsyncIterator[list[LogEntry]]:
        # Live entries come from the instance's reader, into the log's tail: a subscription caught
        # up with the tail and given a ``deliver`` is handed them there (service.core.direct).
        fanout = self._backend.fanout
        cursor = max(after_id, 0)
        tail = await fanout.watch(self._session_id, self._status)
        idle = IdleWait(idle_timeout) if idle_timeout is not None else None
        direct = Direct(deliver, idle, deliver_many) if deliver is not None else None
        try:
            while True:
                if tail.failed is not None:
                    raise tail.failed
                waiter = None
                batch = tail.after(cursor)
                if batch is None:
                    # Taken before the read, which waits: what the reader brings meanwhile wakes it.
                    waiter = tail.wakeup.waiter()
                    batch = await self.read(cursor, READ_BATCH)
                if batch:
                    cursor = batch[-1].id
                    if idle is not None:
                        idle.news()
                    yield batch
                    continue
                if tail.closed or self._closed:
                    return
                handed = False
                if waiter is None:
                    if direct is not None and tail.failed is None and cursor == tail.cursor:
                        waiter = direct.wait_from(cursor)
                        tail.direct.add(direct)
                        handed = True
                    else:
                        waiter = tail.wakeup.waiter()
                try:
                    idle_ran_out = idle is not None and not await idle.wait(waiter)
                    if idle is None:
                        await waiter
                finally:
                    if handed:
                        # What deliver took is behind the subscription now.
                        cursor = direct.cursor  # type: ignore[union-attr]
                        tail.direct.discard(direct)  # type: ignore[arg-type]
                if idle_ran_out:
                    yield []
        finally:
            if idle is not None:
                idle.close()
            fanout.unwatch(tail)

    async def last_id(self) -> int:
        backend = self._backend
        async with backend.call():
            value = await backend.redis.hget(self._meta_key, "last_id")
        return int(value or 0)

    async def first_id(self) -> int:
        backend = self._backend
        async with backend.call():
            async with backend.redis.pipeline(transaction=False) as pipe:
                pipe.xrange(self._log_key, count=1)
                pipe.hget(self._meta_key, "last_id")
                first, last = await pipe.execute()
        if first and "c" not in first[0][1]:
            return stream_entry_id(first[0][0])
        return int(last or 0) + 1

    async def close(self) -> None:
        self._closed = True
