"""Windowed write-through delivery (service/core/direct.py): a log with many waiting subscribers
holds its new entries for a window and hands each subscriber all of them at once, each entry
once and in order, with one ``shared`` dict per window for everyone given the same entries."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from service.core import direct
from service.core.direct import Coalescing
from service.core.events import TextDelta
from service.core.log import LogEntry, MemoryEventLog

# A window for any audience: 1 s per subscriber, capped at 20 ms (a test never waits it out by
# sleeping: it waits for the delivery itself).
ALWAYS = Coalescing(max_window_s=0.02, per_subscriber_s=1.0)


class Viewer:
    """A subscription with ``deliver`` and ``deliver_many``, and what it received which way."""

    def __init__(self, log: MemoryEventLog, accept: Callable[[list[int]], bool] = lambda ids: True) -> None:
        self.one: list[int] = []
        self.many: list[list[int]] = []
        self.batches: list[list[int]] = []
        self.shared: list[dict[Any, Any]] = []
        self.changed = asyncio.Event()
        self.accept = accept

        def deliver(entry: LogEntry) -> bool:
            if not self.accept([entry.id]):
                return False
            self.one.append(entry.id)
            self.changed.set()
            return True

        def deliver_many(entries: list[LogEntry], shared: dict[Any, Any]) -> bool:
            ids = [entry.id for entry in entries]
            if not self.accept(ids):
                return False
            self.many.append(ids)
            self.shared.append(shared)
            shared.setdefault("made", 0)
            shared["made"] += 1
            self.changed.set()
            return True

        self.subscription: AsyncIterator[list[LogEntry]] = log.subscribe(
            0, deliver=deliver, deliver_many=deliver_many
        )
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for batch in self.subscription:
            self.batches.append([entry.id for entry in batch])
            self.changed.set()

    def received(self) -> list[int]:
        """Every id, in the order it arrived (taken, handed over together, or read as a batch)."""
        seen = self.one + [i for ids in self.many for i in ids] + [i for ids in self.batches for i in ids]
        return sorted(seen) if len(set(seen)) == len(seen) else seen  # duplicates show as such

    async def until(self, last_id: int) -> None:
        while last_id not in self.one + [i for ids in self.many + self.batches for i in ids]:
            self.changed.clear()
            await self.changed.wait()

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


async def waiting_viewers(log: MemoryEventLog, count: int, **options: Any) -> list[Viewer]:
    viewers = [Viewer(log, **options) for _ in range(count)]
    await log.wait_subscribers(count)
    await asyncio.sleep(0)  # one step: from subscribing to its wait, nothing to read on the way
    return viewers


def text(n: int) -> TextDelta:
    return TextDelta(text=f"t{n}")


def test_the_window_grows_with_the_audience_up_to_its_cap() -> None:
    coalescing = Coalescing(max_window_s=0.1, per_subscriber_s=10e-6, min_window_s=0.002)
    assert coalescing.window(100) == 0.0  # 1 ms: under the floor, each entry goes at once
    assert coalescing.window(1_000) == pytest.approx(0.01)
    assert coalescing.window(5_000) == pytest.approx(0.05)
    assert coalescing.window(100_000) == 0.1
    assert Coalescing(max_window_s=0.0).window(100_000) == 0.0


async def test_without_a_window_each_entry_goes_at_once() -> None:
    log = MemoryEventLog()
    (viewer,) = await waiting_viewers(log, 1)
    for n in range(1, 4):
        await log.append(text(n))
    assert viewer.one == [1, 2, 3] and viewer.many == []
    await viewer.stop()


async def test_held_entries_go_to_every_viewer_at_once_with_one_shared_dict() -> None:
    log = MemoryEventLog(coalescing=ALWAYS)
    viewers = await waiting_viewers(log, 3)
    for n in range(1, 5):
        await log.append(text(n))
    assert all(viewer.one == [] and viewer.many == [] for viewer in viewers)  # held, not yet sent
    for viewer in viewers:
        await viewer.until(4)
    assert [viewer.many for viewer in viewers] == [[[1, 2, 3, 4]]] * 3
    (shared,) = {id(viewer.shared[0]) for viewer in viewers}  # one dict for the window
    assert viewers[0].shared[0]["made"] == 3
    # The next window starts with the next append.
    await log.append(text(5))
    for viewer in viewers:
        await viewer.until(5)
    assert [viewer.many[-1] for viewer in viewers] == [[5]] * 3
    for viewer in viewers:
        await viewer.stop()


async def test_a_viewer_that_declines_reads_the_window_as_a_batch_in_order() -> None:
    log = MemoryEventLog(coalescing=ALWAYS)
    refusing = {"on": True}
    fussy, easy = await waiting_viewers(
        log, 1, accept=lambda ids: not refusing["on"]
    ) + await waiting_viewers(log, 1)
    for n in range(1, 4):
        await log.append(text(n))
    await fussy.until(3)
    await easy.until(3)
    assert fussy.many == [] and fussy.batches == [[1, 2, 3]]
    assert easy.many == [[1, 2, 3]]
    # Caught up again, it is handed the next window.
    refusing["on"] = False
    await log.append(text(4))
    await fussy.until(4)
    await easy.until(4)
    assert fussy.many == [[4]] and fussy.received() == [1, 2, 3, 4]
    assert easy.many == [[1, 2, 3], [4]]
    for viewer in (fussy, easy):
        await viewer.stop()


async def test_a_viewer_that_read_part_of_a_window_is_handed_only_the_rest() -> None:
    log = MemoryEventLog(coalescing=ALWAYS)
    (early,) = await waiting_viewers(log, 1)
    await log.append(text(1))  # held for early
    # A viewer that comes meanwhile reads entry 1 from the log and then waits, caught up.
    late = Viewer(log)
    await late.until(1)
    await log.wait_subscribers(2)
    await log.append(text(2))
    await early.until(2)
    await late.until(2)
    assert early.many == [[1, 2]] and early.received() == [1, 2]
    assert late.batches == [[1]] and late.many == [[2]] and late.received() == [1, 2]
    for viewer in (early, late):
        await viewer.stop()


async def test_closing_the_log_in_a_window_ends_every_viewer_with_all_the_entries() -> None:
    log = MemoryEventLog(coalescing=ALWAYS)
    viewers = await waiting_viewers(log, 2)
    for n in range(1, 4):
        await log.append(text(n))
    await log.close()
    for viewer in viewers:
        await viewer.task  # the subscription ends once it has read what is kept
        assert viewer.received() == [1, 2, 3] and viewer.many == []


async def test_groups_take_turns_and_each_viewer_gets_every_entry_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(direct, "GROUP_SIZE", 2)
    log = MemoryEventLog(coalescing=ALWAYS)
    viewers = await waiting_viewers(log, 6)
    assert [len(group) for group in log._direct.groups] == [2, 2, 2]
    for n in range(1, 4):
        await log.append(text(n))
    # The first group's turn comes a third of the window in; the others' after it, in order.
    await viewers[0].until(3)
    for viewer in viewers:
        await viewer.until(3)
    await log.append(text(4))
    for viewer in viewers:
        await viewer.until(4)
    for viewer in viewers:
        assert viewer.received() == [1, 2, 3, 4] and viewer.batches == []
    # Every group was handed each window once; what all were handed is held no more.
    assert log.windows == 6 and log._direct._held == []
    for viewer in viewers:
        await viewer.stop()


async def test_an_entry_after_a_gap_is_held_for_the_next_window() -> None:
    # A shared log's reader may skip ids the log purged: what was held goes at once, and the
    # entry after the gap starts the next window (the viewers at the old cursor read a batch).
    coalesced = direct.DirectSet(ALWAYS)
    taken: list[int] = []
    coalesced.add(direct.Direct(lambda entry: taken.append(entry.id) is None, None))
    log = MemoryEventLog()
    first = await log.append(text(1))
    coalesced.offer(first)
    gap = await log.append(text(2))
    after_gap = await log.append(text(3))
    del gap
    coalesced.offer(after_gap)
    assert taken == [1]  # the window before the gap went at once
    assert coalesced._held == [after_gap] and coalesced._timer is not None
    coalesced.wake_all()
