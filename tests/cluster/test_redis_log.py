"""The Redis event log and session store against a real Redis, in process."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from service.core.events import TextDelta
from service.core.log import entry_bytes
from service.core.sessions import MemorySessionStore
from service.errors import EventsPurged, RunInProgress, RunLost, SessionNotFound
from service.store.redis import RedisBackend, RedisEventLog, RedisSessionStore


@pytest.fixture
async def backend(redis_url: str, redis_prefix: str) -> AsyncIterator[RedisBackend]:
    made = RedisBackend(redis_url, prefix=redis_prefix, lock_ttl_s=1.0, max_bytes=60_000, session_ttl_s=60)
    await made.start()
    yield made
    await made.stop()


@pytest.fixture
def store(backend: RedisBackend) -> RedisSessionStore:
    return RedisSessionStore(backend, MemorySessionStore())


async def test_ids_are_exact_and_the_byte_bound_drops_the_oldest(store: RedisSessionStore) -> None:
    session = await store.create()
    log = session.log
    sizes = []
    for n in range(100):
        entry = await log.append(TextDelta(text=f"word {n:03d} " + "x" * 30))
        assert entry.id == n + 1
        sizes.append(entry.size)
    assert await log.last_id() == 100
    kept = await log.kept_bytes()
    first = await log.first_id()
    assert kept <= 60_000 and kept == sum(sizes[first - 1 :])
    assert kept + sizes[first - 2] > 60_000  # it dropped no more than it had to
    with pytest.raises(EventsPurged) as purged:
        await log.read(0)
    assert purged.value.oldest_id == first
    entries = await log.read(0, strict=False)
    assert [e.id for e in entries] == list(range(first, 101))
    assert entries[-1].event == TextDelta(text="word 099 " + "x" * 30)
    # One event larger than the whole bound is still kept, alone.
    big = await log.append(TextDelta(text="y" * 30_000))
    assert await log.first_id() == big.id == 101
    assert [e.id for e in await log.read(100, strict=False)] == [101]


async def test_a_retried_append_is_stored_once(store: RedisSessionStore, backend: RedisBackend) -> None:
    session = await store.create()
    raw = TextDelta(text="once").model_dump_json()
    args = ["", raw, f"{time.time():.6f}", len(raw), backend.max_bytes, "token-1"]
    keys = backend.session_keys(session.id)
    first = await backend.scripts["APPEND"](keys=keys, args=args)
    again = await backend.scripts["APPEND"](keys=keys, args=args)
    assert first == again == 1
    assert [e.id for e in await session.log.read(0)] == [1]


async def test_a_burst_is_stored_by_one_call_and_a_retried_one_once(
    redis_url: str, redis_prefix: str
) -> None:
    backend = RedisBackend(redis_url, prefix=redis_prefix)  # the default bound: 10 MB
    await backend.start()
    try:
        session = await RedisSessionStore(backend, MemorySessionStore()).create()
        before = backend.appender.batches
        burst = [TextDelta(text=f"t{n}") for n in range(5)]
        entries = await session.log.append_many(burst)
        assert [entry.id for entry in entries] == [1, 2, 3, 4, 5]
        assert backend.appender.batches - before == 1
        assert [entry.event for entry in await session.log.read(0)] == burst
        # The same call again (a retry after a lost reply) stores nothing twice and answers the same.
        raws = [TextDelta(text=text).model_dump_json() for text in ("x", "y")]
        args = [
            "",
            raws[0],
            f"{time.time():.6f}",
            len(raws[0]),
            backend.max_bytes,
            "token-2",
            raws[1],
            len(raws[1]),
        ]
        keys = backend.session_keys(session.id)
        first = await backend.scripts["APPEND"](keys=keys, args=args)
        again = await backend.scripts["APPEND"](keys=keys, args=args)
        assert first == again == 7
        assert [e.event.text for e in await session.log.read(5)] == ["x", "y"]
    finally:
        await backend.stop()


async def test_no_call_pushes_more_than_a_sixteenth_of_the_bound(
    store: RedisSessionStore, backend: RedisBackend
) -> None:
    session = await store.create()
    burst = [TextDelta(text=f"t{n}") for n in range(5)]
    size = entry_bytes(len(burst[0].model_dump_json()))
    assert 2 * size <= backend.max_bytes // 16 < 3 * size  # two such entries to a call
    before = backend.appender.batches
    entries = await session.log.append_many(burst)
    assert backend.appender.batches - before == 3
    assert [entry.id for entry in entries] == [1, 2, 3, 4, 5]
    assert [entry.event for entry in await session.log.read(0)] == burst


async def test_subscribers_here_get_this_instance_s_appends_as_appended(store: RedisSessionStore) -> None:
    session = await store.create()
    batches = session.log.subscribe(0)
    first = asyncio.ensure_future(anext(batches))
    await session.log.wait_subscribers(1)
    burst = [TextDelta(text=f"t{n}") for n in range(3)]
    await session.log.append_many(burst)
    got = await first
    while len(got) < 3:
        got += await anext(batches)
    # The very events appended: nothing was decoded again on the way to the subscriber.
    assert [entry.id for entry in got] == [1, 2, 3]
    assert all(entry.event is event for entry, event in zip(got, burst, strict=True))
    await batches.aclose()


async def test_appends_are_fenced_by_the_run_claim(store: RedisSessionStore, backend: RedisBackend) -> None:
    session = await store.create()
    fence = await store.claim_run(session, "run-1")
    assert fence is not None and fence.endswith(":run-1")
    with pytest.raises(RunInProgress):
        await store.claim_run(await store.get(session.id), "run-2")
    await session.log.append(TextDelta(text="mine"), fence=fence)
    with pytest.raises(RunLost):
        await session.log.append(TextDelta(text="not mine"), fence="other:run-9")
    # The claim expires (its instance stopped renewing it): the old run may write no more, and
    # the next reader of the session ends the query as interrupted.
    await backend.redis.delete(backend.lock_key(session.id))
    with pytest.raises(RunLost):
        await session.log.append(TextDelta(text="too late"), fence=fence)
    reloaded = await store.get(session.id)
    assert reloaded.status == "idle"
    last = (await reloaded.log.read(0))[-1].event
    assert last.type == "error" and last.code == "interrupted" and last.recoverable


async def test_subscribers_follow_through_the_instance_reader(store: RedisSessionStore) -> None:
    session = await store.create()
    await session.log.append(TextDelta(text="before"))

    async def follow() -> list[int]:
        got: list[int] = []
        async for batch in session.log.subscribe(0):
            got.extend(entry.id for entry in batch)
            if got[-1] == 50:
                return got
        return got

    followers = [asyncio.create_task(follow()) for _ in range(3)]
    await session.log.wait_subscribers(3)
    for n in range(49):
        await session.log.append(TextDelta(text=f"live {n}"))
    for got in await asyncio.wait_for(asyncio.gather(*followers), 10):
        assert got == list(range(1, 51))
    await session.log.wait_subscribers(0)


async def test_deleting_a_session_ends_its_subscribers(store: RedisSessionStore) -> None:
    session = await store.create()
    await session.log.append(TextDelta(text="only"))

    async def follow() -> list[int]:
        ids = []
        async for batch in session.log.subscribe(0):
            ids += [entry.id for entry in batch]
        return ids

    follower = asyncio.create_task(follow())
    await session.log.wait_subscribers(1)
    await store.delete(session.id)
    assert await asyncio.wait_for(follower, 10) == [1]
    with pytest.raises(SessionNotFound):
        await store.get(session.id)
    with pytest.raises(SessionNotFound):
        await store.delete(session.id)


async def test_idle_sessions_expire_on_redis(redis_url: str, redis_prefix: str) -> None:
    backend = RedisBackend(redis_url, prefix=redis_prefix, session_ttl_s=1.0)
    store = RedisSessionStore(backend, MemorySessionStore())
    try:
        session = await store.create()
        assert await store.count() == 1
        await session.log.append(TextDelta(text="kept a second"))
        assert 0 < await backend.redis.pttl(backend.log_key(session.id)) <= 1000
        # Redis forgets the session by itself once its time-to-live passes.
        deadline = time.monotonic() + 5
        while await backend.redis.exists(backend.meta_key(session.id)):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        with pytest.raises(SessionNotFound):
            await store.get(session.id)
        assert await store.count() == 0
        assert await RedisEventLog(backend, session.id).last_id() == 0
    finally:
        await backend.stop()


async def test_session_cap_holds_across_instances(redis_url: str, redis_prefix: str) -> None:
    stores = [
        RedisSessionStore(RedisBackend(redis_url, prefix=redis_prefix, max_sessions=3), MemorySessionStore())
        for _ in range(2)
    ]
    try:
        await stores[0].create()
        await stores[1].create()
        await stores[0].create()
        from service.errors import SessionLimitReached

        with pytest.raises(SessionLimitReached):
            await stores[1].create()
        # Short-lived sessions stay on their instance and cost the shared cap nothing.
        assert (await stores[1].create(ephemeral=True)).ephemeral
    finally:
        for store in stores:
            await store.backend.stop()


async def test_concurrent_appends_share_round_trips(store: RedisSessionStore, backend: RedisBackend) -> None:
    sessions = [await store.create() for _ in range(50)]
    before = backend.appender.batches
    for round_ in range(3):
        entries = await asyncio.gather(*(s.log.append(TextDelta(text=f"r{round_}")) for s in sessions))
        assert [entry.id for entry in entries] == [round_ + 1] * 50
    # 150 appends from 50 sessions at once went in far fewer pipelines than appends.
    assert backend.appender.batches - before <= 12
    for session in sessions:
        assert [e.event.text for e in await session.log.read(0)] == ["r0", "r1", "r2"]


async def test_appends_survive_redis_forgetting_its_scripts(
    store: RedisSessionStore, backend: RedisBackend
) -> None:
    session = await store.create()
    await session.log.append(TextDelta(text="one"))
    await backend.redis.script_flush()  # what a Redis restart does
    entry = await session.log.append(TextDelta(text="two"))
    assert entry.id == 2 and [e.id for e in await session.log.read(0)] == [1, 2]


async def test_the_reader_leaves_out_a_log_this_instance_keeps_current_and_reads_it_again(
    redis_url: str, redis_prefix: str
) -> None:
    here, there = (
        RedisSessionStore(
            RedisBackend(redis_url, prefix=redis_prefix, session_ttl_s=60), MemorySessionStore()
        )
        for _ in range(2)
    )
    for store in (here, there):
        await store.backend.start()
    try:
        session = await here.create()
        key = here.backend.log_key(session.id)
        got: list[tuple[int, str]] = []

        async def follow(until: int) -> None:
            async for batch in session.log.subscribe(0):
                got.extend((entry.id, entry.event.text) for entry in batch)
                if got[-1][0] == until:
                    return

        follower = asyncio.create_task(follow(7))
        await session.log.wait_subscribers(1)
        await session.log.append_many([TextDelta(text=f"here {n}") for n in range(3)])
        # Its own appends keep the tail current: Redis need not send them back to this instance.
        assert key not in here.backend.fanout.streams()[0]
        # Another instance writes in between: this instance's next append finds the gap (unless
        # the reader was still reading the log), and the reader reads the log again, so the
        # subscriber gets every event in order.
        await (await there.get(session.id)).log.append(TextDelta(text="there 1"))
        await session.log.append_many([TextDelta(text=f"here {n}") for n in range(3, 5)])
        # Another instance writes after this one stopped: the reader reads it again too.
        await (await there.get(session.id)).log.append(TextDelta(text="there 2"))
        await asyncio.wait_for(follower, 10)
        texts = ["here 0", "here 1", "here 2", "there 1", "here 3", "here 4", "there 2"]
        assert got == list(enumerate(texts, start=1))
    finally:
        for store in (here, there):
            await store.backend.stop()
