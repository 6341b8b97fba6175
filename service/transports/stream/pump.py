"""Pumps, one outbox, one writer: how a client that follows several logs at once is fed.

A WebSocket follows any number of sessions, and an MCP stream every session its client sent a
message to; both are fed the same way. Each followed log has a *pump* (a task reading it through a
:class:`~service.transports.stream.follow.Follower`) that projects what it reads into items and puts
them in the client's one bounded :class:`Outbox`; one *writer* takes what is queued and writes
it. A client that stops reading fills the outbox, a pump then waits for room, and once an item
has waited ``put_timeout`` the outbox gives up on the client (:class:`TooSlow`): memory stays
flat and the run is never slowed. The client resumes from the last id it saw.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, Generic, TypeVar

from service.core.direct import Deliver, DeliverMany
from service.core.log import EventLog, LogEntry
from service.transports.stream.follow import Ending, Follower, Stop

Item = TypeVar("Item")


class TooSlow(Exception):
    """The client does not read fast enough to keep its outbox from filling."""


class Outbox(Generic[Item]):
    """A bounded queue between a client's pumps and its writer.

    ``on_full`` runs (once) when an item found no room within ``put_timeout``: the transport
    closes its client there. With no ``put_timeout`` a pump waits for room as long as it takes
    (the writer's own send timeout then ends a client that stopped reading).

    With ``write``, the outbox runs its writer itself: a task that exists only while something is
    queued, handing ``write`` everything queued until nothing is left (or until ``write`` says
    the client is gone by returning False). An idle client then holds no task and no queue with
    its waiters, only a list (measured: docs/benchmarks.md, section Ten thousand viewers).
    Without ``write``, a writer of the caller's own calls :meth:`take`.
    """

    __slots__ = (
        "_gone",
        "_items",
        "_maxsize",
        "_on_full",
        "_room",
        "_taker",
        "_write",
        "closed",
        "put_timeout",
        "writer",
    )

    def __init__(
        self,
        maxsize: int,
        put_timeout: float | None,
        on_full: Callable[[], Awaitable[None]] | None = None,
        write: Callable[[list[Item]], Awaitable[bool]] | None = None,
    ) -> None:
        self._items: list[Item] = []
        self._maxsize = maxsize
        self.put_timeout = put_timeout
        self._on_full = on_full
        self._write = write
        self._gone = False  # write said the client is gone: no writer starts again
        self._taker: asyncio.Future[None] | None = None
        self._room: list[asyncio.Future[None]] = []
        self.writer: asyncio.Task[None] | None = None
        self.closed = False

    def qsize(self) -> int:
        """Items waiting for the writer."""
        return len(self._items)

    async def put(self, item: Item) -> None:
        """Queue ``item``; :class:`TooSlow` when it finds no room in time (or the outbox closed)."""
        if self.closed:
            raise TooSlow
        if len(self._items) >= self._maxsize:
            await self._wait_for_room()
        self._items.append(item)
        taker = self._taker
        if taker is not None and not taker.done():
            taker.set_result(None)
        if self._write is not None and self.writer is None and not self._gone:
            self.writer = asyncio.get_running_loop().create_task(self._writing(), name="outbox-writer")

    async def _wait_for_room(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.put_timeout):
                while len(self._items) >= self._maxsize and not self.closed:
                    room: asyncio.Future[None] = loop.create_future()
                    self._room.append(room)
                    await room
        except TimeoutError:
            if self._on_full is not None and not self.closed:
                await self._on_full()
            raise TooSlow from None
        if self.closed:
            raise TooSlow

    async def put_all(self, items: Iterable[Item]) -> None:
        """Queue each of ``items`` in order."""
        for item in items:
            await self.put(item)

    async def take(self) -> list[Item] | None:
        """Everything queued (waiting for at least one item); None once the outbox is closed."""
        while not self._items and not self.closed:
            self._taker = taker = asyncio.get_running_loop().create_future()
            try:
                await taker
            finally:
                self._taker = None
        if self.closed:
            return None
        return self._take_all()

    def _take_all(self) -> list[Item]:
        items, self._items = self._items, []
        if self._room:
            room, self._room = self._room, []
            for waiter in room:
                if not waiter.done():
                    waiter.set_result(None)
        return items

    async def _writing(self) -> None:
        write = self._write
        assert write is not None
        try:
            while self._items and not self.closed:
                if not await write(self._take_all()):
                    self._gone = True
                    return
        finally:
            self.writer = None

    def close(self) -> None:
        """Drop what is queued and wake the writer and the pumps, which then end."""
        if self.closed:
            return
        self.closed = True
        self._take_all()
        taker = self._taker
        if taker is not None and not taker.done():
            taker.set_result(None)


async def pump(
    log: EventLog,
    after: int,
    outbox: Outbox[Item],
    project: Callable[[list[LogEntry]], Iterable[Item]],
    *,
    end: Callable[[Ending], Iterable[Item]] | None = None,
    stop: Stop = Stop.NEVER,
    on_batch: Callable[[list[LogEntry]], None] | None = None,
    skip_purged: bool = False,
    deliver: Deliver | None = None,
    deliver_many: DeliverMany | None = None,
) -> Ending | None:
    """Feed the outbox with ``log``'s entries after ``after``, projected, until the following ends.

    ``end`` projects how a following ended into the items that tell the client; ``on_batch`` runs
    once a batch's items are queued. With ``skip_purged``, a reader that fell behind the purge
    horizon is told (through ``end``) and goes on from the oldest event kept; otherwise that ends
    it. ``deliver`` and ``deliver_many`` may take live entries past the outbox (see
    :class:`~service.transports.stream.follow.Follower`). Returns how the last following ended
    (None if it was cut short by its consumer).
    """
    while True:
        follower = Follower(log, after, stop=stop, deliver=deliver, deliver_many=deliver_many)
        async with follower as batches:
            async for batch in batches:
                await outbox.put_all(project(batch))
                if on_batch is not None:
                    on_batch(batch)
        ending = follower.ending
        if ending is not None and end is not None:
            await outbox.put_all(end(ending))
        if not (skip_purged and ending is not None and ending.reason == "purged"):
            return ending
        after = (ending.oldest_id or ending.last_id + 1) - 1


class Pumps:
    """A client's pump tasks, one per followed key (a session id)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def __contains__(self, key: str) -> bool:
        return key in self._tasks

    def __len__(self) -> int:
        return len(self._tasks)

    def keys(self) -> list[str]:
        """The keys pumped now."""
        return list(self._tasks)

    def start(self, key: str, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` as ``key``'s pump, replacing one that runs."""
        self.stop(key)
        self._tasks[key] = asyncio.create_task(self._run(key, work), name=f"{self._name}-{key}")

    async def _run(self, key: str, work: Coroutine[Any, Any, None]) -> None:
        try:
            await work
        finally:
            if self._tasks.get(key) is asyncio.current_task():
                del self._tasks[key]

    def owns(self, key: str) -> bool:
        """True when the calling task is ``key``'s pump."""
        return self._tasks.get(key) is asyncio.current_task()

    def stop(self, key: str) -> bool:
        """Cancel ``key``'s pump; False when none runs."""
        task = self._tasks.pop(key, None)
        if task is None:
            return False
        task.cancel()
        return True

    def tasks(self) -> list[asyncio.Task[None]]:
        """The running pump tasks."""
        return list(self._tasks.values())

    def cancel_all(self) -> list[asyncio.Task[None]]:
        """Cancel every pump; returns their tasks, to await."""
        tasks, self._tasks = list(self._tasks.values()), {}
        for task in tasks:
            task.cancel()
        return tasks


async def write_until_closed(outbox: Outbox[Item], write: Callable[[list[Item]], Awaitable[bool]]) -> None:
    """The writer: hand ``write`` everything queued, until the outbox closes or ``write`` says
    the client is gone (returns False)."""
    while (items := await outbox.take()) is not None:
        if not await write(items):
            return
