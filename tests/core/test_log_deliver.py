"""Write-through delivery: a waiting subscription's ``deliver`` takes new entries on the appending
task, and whatever it declines comes as a batch, each entry once and in order."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import pytest

from service.core.events import TextDelta
from service.core.log import LogEntry, MemoryEventLog


class Reader:
    """A task reading a subscription's batches, and what its ``deliver`` took."""

    def __init__(self, log: MemoryEventLog, take: Callable[[LogEntry], bool], **options: float) -> None:
        self.taken: list[int] = []
        self.batches: list[list[int]] = []
        self.got_batch = asyncio.Event()

        def deliver(entry: LogEntry) -> bool:
            if not take(entry):
                return False
            self.taken.append(entry.id)
            return True

        self.subscription: AsyncIterator[list[LogEntry]] = log.subscribe(0, deliver=deliver, **options)
        self.task = asyncio.create_task(self._read())

    @classmethod
    async def waiting(cls, log: MemoryEventLog, take: Callable[[LogEntry], bool], **options: float) -> Reader:
        """A reader subscribed and waiting for the next append (the log holds nothing yet)."""
        reader = cls(log, take, **options)
        await log.wait_subscribers(1)
        await asyncio.sleep(0)  # one step: from subscribing to its wait, nothing to read on the way
        return reader

    async def _read(self) -> None:
        async for batch in self.subscription:
            self.batches.append([entry.id for entry in batch])
            self.got_batch.set()

    async def next_batch(self) -> list[int]:
        await self.got_batch.wait()
        self.got_batch.clear()
        return self.batches[-1]

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


def text(n: int) -> TextDelta:
    return TextDelta(text=f"t{n}")


async def test_a_waiting_subscriber_takes_appends_without_waking() -> None:
    log = MemoryEventLog()
    reader = await Reader.waiting(log, lambda entry: True)
    for n in range(1, 4):
        await log.append(text(n))
    assert reader.taken == [1, 2, 3]  # each on the appending task, before append returned
    assert reader.batches == []
    await reader.stop()


async def test_a_declined_entry_and_those_after_it_come_as_one_batch_in_order() -> None:
    log = MemoryEventLog()
    refuse = {2}
    reader = await Reader.waiting(log, lambda entry: entry.id not in refuse)
    await log.append(text(1))
    await log.append(text(2))  # declined: the reader is woken
    await log.append(text(3))  # not offered: the reader has not caught up yet
    assert await reader.next_batch() == [2, 3]
    assert reader.taken == [1]
    await log.append(text(4))  # caught up and waiting again: taken
    assert reader.taken == [1, 4]
    await reader.stop()


@pytest.mark.traceback_expected  # a bug in a transport's deliver is logged whole
async def test_a_deliver_that_raises_is_a_decline_and_the_append_goes_on() -> None:
    log = MemoryEventLog()

    def broken(entry: LogEntry) -> bool:
        raise RuntimeError("a transport's bug")

    reader = await Reader.waiting(log, broken)
    entry = await log.append(text(1))
    assert entry.id == 1 and await log.last_id() == 1
    assert await reader.next_batch() == [1]
    await reader.stop()


async def test_close_wakes_a_waiting_subscriber_and_ends_it() -> None:
    log = MemoryEventLog()
    reader = await Reader.waiting(log, lambda entry: True)
    await log.append(text(1))
    await log.close()
    await asyncio.wait_for(reader.task, 1)
    assert reader.taken == [1] and reader.batches == []


async def test_what_deliver_takes_restarts_the_idle_period() -> None:
    """A keep-alive comes after ``idle_timeout`` without news; entries taken by deliver are news,
    so appends more often than that keep it away, and it comes once they stop."""
    log = MemoryEventLog()
    reader = await Reader.waiting(log, lambda entry: True, idle_timeout=0.3)
    appended = 0

    async def append_for_twice_the_idle_period() -> None:
        nonlocal appended
        for n in range(1, 13):
            await log.append(text(n))
            appended = n
            await asyncio.sleep(0.05)  # the model's pace, not a wait for something

    appender = asyncio.create_task(append_for_twice_the_idle_period())
    keep_alive = await asyncio.wait_for(reader.next_batch(), 5)
    assert keep_alive == []
    assert appended == 12 and appender.done()  # not before the appends stopped
    assert reader.taken == list(range(1, 13))
    await reader.stop()


async def test_an_unsubscribed_reader_is_forgotten() -> None:
    log = MemoryEventLog()
    reader = await Reader.waiting(log, lambda entry: True)
    await reader.stop()
    await log.append(text(1))
    assert reader.taken == []
