"""A run's appends on a log that waits on a round trip for each: grouped by burst, in order, and
stopped the same way as one append at a time."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from service.core.events import Event, RunDone, TextDelta
from service.core.log import LogEntry, MemoryEventLog
from service.core.runs import RunManager
from service.core.sessions import IDLE, MemorySessionStore
from service.errors import RunLost, StoreUnavailable


class RoundTripLog(MemoryEventLog):
    """A memory log that says its appends wait on a round trip, records each ``append_many``
    call, and can hold the first one until released or make it fail."""

    round_trips = True

    def __init__(self) -> None:
        super().__init__()
        self.groups: list[list[str]] = []
        self.stored = asyncio.Event()  # set after each group
        self.hold: asyncio.Event | None = None
        self._held = False
        self.fail: Exception | None = None

    async def append_many(self, events: list[Event], *, fence: str | None = None) -> list[LogEntry]:
        if self.hold is not None and not self._held:
            self._held = True
            await self.hold.wait()
        if self.fail is not None:
            raise self.fail
        self.groups.append([event.text for event in events])  # type: ignore[attr-defined]
        entries = await super().append_many(events, fence=fence)
        stored, self.stored = self.stored, asyncio.Event()
        stored.set()
        return entries


class BurstAgent:
    """Yields its bursts of text deltas, each burst at once; between bursts it waits on ``step``
    (or only lets the loop run, without it), then says ``yielded``, waits for ``finish`` (saying
    ``cancelled`` if it is cancelled there) and ends with done."""

    def __init__(self, bursts: list[list[str]], step: asyncio.Event | None = None) -> None:
        self.bursts = bursts
        self.step = step
        self.yielded = asyncio.Event()
        self.finish = asyncio.Event()
        self.finish.set()
        self.cancelled = asyncio.Event()

    async def run(
        self,
        messages: list[dict[str, Any]],
        user_text: str,
        max_turns: int,
        options: Any = None,
        charge: Any = None,
        sink: Any = None,
    ) -> AsyncIterator[Event]:
        for n, burst in enumerate(self.bursts):
            if n:
                if self.step is not None:
                    await self.step.wait()
                else:
                    await asyncio.sleep(0)  # a new step of the run's task: a new burst
            for text in burst:
                yield TextDelta(text=text)
        self.yielded.set()
        try:
            await self.finish.wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        yield RunDone(turns=1)


async def _session(log: RoundTripLog) -> Any:
    return await MemorySessionStore(lambda: log).create()


async def _texts(log: MemoryEventLog) -> list[str]:
    return [entry.event.text for entry in await log.read(0) if isinstance(entry.event, TextDelta)]


async def test_each_burst_is_stored_by_one_call() -> None:
    log, step = RoundTripLog(), asyncio.Event()
    agent = BurstAgent([["a", "b", "c", "d", "e"], ["f", "g", "h"]], step)
    run = await RunManager(agent).start(await _session(log), "hi")
    await log.stored.wait()  # the first burst is in before the second comes
    step.set()
    await run.wait()
    assert log.groups == [["a", "b", "c", "d", "e"], ["f", "g", "h"]]
    assert [entry.event.type for entry in await log.read(0)][-2:] == ["status_change", "done"]


async def test_bursts_that_queue_behind_a_slow_append_join_up_to_sixteen_events() -> None:
    log = RoundTripLog()
    log.hold = asyncio.Event()
    singles = [[f"t{n}"] for n in range(20)]
    agent = BurstAgent([["first"], *singles])
    agent.finish.clear()
    run = await RunManager(agent).start(await _session(log), "hi")
    await agent.yielded.wait()  # every burst is queued behind the first, held, append
    log.hold.set()
    agent.finish.set()
    await run.wait()
    assert log.groups == [["first"], [f"t{n}" for n in range(16)], [f"t{n}" for n in range(16, 20)]]
    assert await _texts(log) == ["first", *(f"t{n}" for n in range(20))]


async def test_a_cancel_logs_what_was_queued_before_how_the_run_stopped() -> None:
    log = RoundTripLog()
    log.hold = asyncio.Event()
    agent = BurstAgent([["a"], ["b"], ["c"]])
    agent.finish.clear()
    runs = RunManager(agent)
    session = await _session(log)
    await runs.start(session, "hi")
    await agent.yielded.wait()
    cancelling = asyncio.create_task(runs.cancel(session.id))
    await agent.cancelled.wait()  # the run is stopping while its first append is still held
    log.hold.set()
    assert await cancelling
    types = [entry.event.type for entry in await log.read(0)]
    assert types[2:] == ["text_delta", "text_delta", "text_delta", "status_change", "status_change", "done"]
    assert [entry.event.status for entry in await log.read(0) if entry.event.type == "status_change"][1:] == [
        "cancelled",
        IDLE,
    ]


async def test_a_store_that_stays_away_ends_the_run_with_its_error() -> None:
    log = RoundTripLog()
    log.fail = StoreUnavailable("session storage (Redis) is unavailable")
    runs = RunManager(BurstAgent([["a", "b"]]))
    session = await _session(log)
    await (await runs.start(session, "hi")).wait()
    last = (await log.read(0))[-1].event
    assert last.type == "error" and last.code == "store_unavailable"  # type: ignore[union-attr]
    assert session.status == IDLE and runs.active == 0


async def test_a_lost_claim_stops_the_run_without_a_word_more() -> None:
    log = RoundTripLog()
    log.fail = RunLost("the run's claim expired")
    runs = RunManager(BurstAgent([["a", "b"]]))
    session = await _session(log)
    await (await runs.start(session, "hi")).wait()
    assert [entry.event.type for entry in await log.read(0)] == ["run_started", "status_change"]
    assert runs.active == 0
