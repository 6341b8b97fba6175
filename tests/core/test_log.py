"""The in-memory event log: ids, bounds, replay, live fan-out and purge."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.core.events import EVENT_ADAPTER, RunDone, TextDelta
from service.core.log import MemoryEventLog, entry_bytes, json_length
from service.errors import EventsPurged


async def test_ids_start_at_one_and_increase() -> None:
    log = MemoryEventLog()
    ids = [(await log.append(TextDelta(text=str(n)))).id for n in range(5)]
    assert ids == [1, 2, 3, 4, 5]
    assert await log.last_id() == 5
    assert await log.first_id() == 1
    assert [e.id for e in await log.read(2)] == [3, 4, 5]
    assert [e.id for e in await log.read(0, limit=2)] == [1, 2]
    assert await log.read(5) == []


async def test_empty_log_ids() -> None:
    log = MemoryEventLog()
    assert await log.last_id() == 0
    assert await log.first_id() == 1
    assert await log.read(0) == []


async def test_byte_bound_purges_oldest_and_always_keeps_the_new() -> None:
    size = entry_bytes(len(TextDelta(text="x" * 100).model_dump_json()))
    log = MemoryEventLog(max_bytes=size * 3)
    for _ in range(10):
        await log.append(TextDelta(text="x" * 100))
    assert await log.first_id() == 8
    assert log.size_bytes <= size * 3
    with pytest.raises(EventsPurged) as info:
        await log.read(1)
    assert info.value.oldest_id == 8
    assert [e.id for e in await log.read(0, strict=False)] == [8, 9, 10]
    # reading from just before the horizon is not a gap
    assert [e.id for e in await log.read(7)] == [8, 9, 10]
    big = await log.append(TextDelta(text="y" * 10_000))
    assert [e.id for e in await log.read(0, strict=False)] == [big.id]


async def test_subscribe_replays_then_goes_live() -> None:
    log = MemoryEventLog()
    for n in range(3):
        await log.append(TextDelta(text=str(n)))
    seen: list[int] = []
    third_live = asyncio.Event()

    async def reader() -> None:
        async for batch in log.subscribe(1):
            seen.extend(entry.id for entry in batch)
            if seen[-1] >= 5:
                third_live.set()
                return

    task = asyncio.create_task(reader())
    await log.append(TextDelta(text="live-4"))
    await log.append(TextDelta(text="live-5"))
    await asyncio.wait_for(third_live.wait(), 5)
    await task
    assert seen == [2, 3, 4, 5]


async def test_many_subscribers_see_the_same_sequence() -> None:
    log = MemoryEventLog()
    results: list[list[int]] = [[] for _ in range(20)]

    async def reader(out: list[int]) -> None:
        async for batch in log.subscribe(0):
            out.extend(entry.id for entry in batch)

    tasks = [asyncio.create_task(reader(out)) for out in results]
    for n in range(50):
        await log.append(TextDelta(text=str(n)))
        if n % 7 == 0:
            await asyncio.sleep(0)  # let readers interleave with the writer
    await log.append(RunDone(turns=1))
    await log.close()
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert all(out == list(range(1, 52)) for out in results)


async def test_subscriber_behind_the_purge_horizon_gets_purged() -> None:
    size = len(TextDelta(text="abc").model_dump_json())
    log = MemoryEventLog(max_bytes=size * 2)
    for _ in range(5):
        await log.append(TextDelta(text="abc"))
    with pytest.raises(EventsPurged):
        async for _ in log.subscribe(0):
            pass


async def test_closed_log_ends_subscriptions_after_draining() -> None:
    log = MemoryEventLog()
    await log.append(TextDelta(text="a"))
    await log.close()
    batches = [batch async for batch in log.subscribe(0)]
    assert [[e.id for e in b] for b in batches] == [[1]]
    with pytest.raises(RuntimeError):
        await log.append(TextDelta(text="b"))


def test_events_round_trip_through_json() -> None:
    event = RunDone(turns=2, truncated=True)
    again = EVENT_ADAPTER.validate_json(event.model_dump_json())
    assert again == event


def test_every_event_class_survives_a_round_trip_through_json() -> None:
    """A log kept outside the process (Redis) rebuilds each event from its JSON alone."""
    import inspect

    from service.core import events as module

    classes = [
        cls
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if issubclass(cls, module._Event) and cls is not module._Event
    ]
    assert len(classes) >= 14
    for cls in classes:
        required = {name: field for name, field in cls.model_fields.items() if field.is_required()}
        samples = {"str": "x", "int": 1, "float": 1.0, "bool": True}
        values = {}
        for name, field in required.items():
            annotation = str(field.annotation)
            kind = next((k for k in samples if k in annotation), None)
            values[name] = samples[kind] if kind else {}
        event = cls(**values)
        assert module.EVENT_ADAPTER.validate_json(event.model_dump_json()) == event, cls


@pytest.mark.slow
async def test_the_byte_bound_counts_the_memory_an_entry_really_holds() -> None:
    """tracemalloc against the log's count, for small and large events, with the encodings the
    SSE and WebSocket transports cache on each entry."""
    import gc
    import tracemalloc

    from service.core.events import ToolResult
    from service.transports.stream import session as dialects

    def cache_encodings(entry: Any) -> None:
        dialects.session_sse(entry)
        entry.encoded["ws"] = dialects.ws_frame("a-session-id-of-22-chr", dialects.session_frame(entry)[1])

    samples = [
        (5000, lambda n: TextDelta(text=f"word{n} ")),
        (1000, lambda n: ToolResult(tool="calculator", tool_use_id=f"tooluse_{n:020d}", result="x" * 2000)),
    ]
    tracemalloc.start()
    try:
        for count, make in samples:
            log = MemoryEventLog(max_bytes=10**12)
            gc.collect()
            before = tracemalloc.get_traced_memory()[0]
            for n in range(count):
                cache_encodings(await log.append(make(n)))
            gc.collect()
            held = tracemalloc.get_traced_memory()[0] - before
            assert 0.7 < log.size_bytes / held < 1.4, (log.size_bytes / count, held / count)
    finally:
        tracemalloc.stop()


@settings(max_examples=500, deadline=None)
@given(st.text(), st.integers(min_value=0, max_value=10**12))
def test_a_text_deltas_json_length_is_measured_without_serialising_it(text: str, turn: int) -> None:
    event = TextDelta(text=text, turn=turn)
    assert json_length(event) == len(event.model_dump_json())


@pytest.mark.parametrize("text", ['"quoted"', "back\\slash", "line\nbreak\ttab\x00\x1f\x7f", "é中😀\u2028"])
def test_text_that_json_escapes_is_measured_as_pydantic_writes_it(text: str) -> None:
    event = TextDelta(text=text, turn=3)
    assert json_length(event) == len(event.model_dump_json())
    assert json_length(RunDone(turns=1)) == len(RunDone(turns=1).model_dump_json())
