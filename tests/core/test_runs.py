"""The run manager, driven by small scripted agents (the core knows agents only by protocol)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from service.core.events import Event, RunDone, TextDelta, TurnCompleted, Usage
from service.core.runs import RunManager
from service.core.sessions import IDLE, RUNNING, MemorySessionStore
from service.errors import Overloaded, RunInProgress, SessionNotFound


class ScriptedAgent:
    """Yields a fixed answer; optionally waits on a gate mid-answer."""

    def __init__(self, gate: asyncio.Event | None = None, fail: bool = False) -> None:
        self.gate = gate
        self.fail = fail
        self.started = asyncio.Event()

    async def run(
        self,
        messages: list[dict[str, Any]],
        user_text: str,
        max_turns: int,
        options: Any = None,
        charge: Any = None,
        sink: Any = None,
    ) -> AsyncIterator[Event]:
        messages.append({"role": "user", "content": [{"text": user_text}]})
        self.started.set()
        yield TextDelta(text="hello")
        if self.fail:
            raise RuntimeError("boom")
        yield TurnCompleted(
            turn=1,
            stop_reason="end_turn",
            usage=Usage(input_tokens=3, output_tokens=1, total_tokens=4),
            total_usage=Usage(input_tokens=3, output_tokens=1, total_tokens=4),
        )
        if self.gate is not None:
            await self.gate.wait()
        yield RunDone(turns=1, usage=Usage(input_tokens=3, output_tokens=1, total_tokens=4))


async def _types(store: MemorySessionStore, session_id: str) -> list[str]:
    session = await store.get(session_id)
    return [entry.event.type for entry in await session.log.read(0)]


async def test_a_run_writes_its_events_and_ends_idle() -> None:
    store = MemorySessionStore()
    runs = RunManager(ScriptedAgent())
    session = await store.create()
    run = await runs.start(session, "hi")
    assert session.status == RUNNING
    await run.wait()
    assert await _types(store, session.id) == [
        "run_started",
        "status_change",
        "text_delta",
        "turn_completed",
        "status_change",
        "done",
    ]
    assert session.status == IDLE and runs.active == 0
    assert session.messages[0]["content"][0]["text"] == "hi"


async def test_second_query_while_one_runs_is_refused() -> None:
    gate = asyncio.Event()
    runs = RunManager(ScriptedAgent(gate))
    session = await MemorySessionStore().create()
    run = await runs.start(session, "one")
    with pytest.raises(RunInProgress):
        await runs.start(session, "two")
    gate.set()
    await run.wait()
    await (await runs.start(session, "three")).wait()


async def test_cancel_writes_a_cancelled_done_with_progress() -> None:
    gate = asyncio.Event()
    agent = ScriptedAgent(gate)
    store = MemorySessionStore()
    runs = RunManager(agent)
    session = await store.create()
    await runs.start(session, "hi")
    async for batch in session.log.subscribe(0):  # wait until the turn's usage is logged
        if any(entry.event.type == "turn_completed" for entry in batch):
            break
    assert await runs.cancel(session.id)
    events = [entry.event for entry in await session.log.read(0)]
    assert [e.type for e in events[-3:]] == ["status_change", "status_change", "done"]
    assert events[-3].status == "cancelled"
    done = events[-1]
    assert done.cancelled and done.usage.total_tokens == 4 and done.turns == 1
    assert not await runs.cancel(session.id)


async def test_shutdown_ends_every_run_with_an_error() -> None:
    runs = RunManager(ScriptedAgent(asyncio.Event()))
    store = MemorySessionStore()
    sessions = [await store.create() for _ in range(3)]
    for session in sessions:
        await runs.start(session, "hi")
    await runs.shutdown()
    for session in sessions:
        last = (await session.log.read(0))[-1].event
        assert last.type == "error" and last.code == "shutdown" and last.recoverable


@pytest.mark.traceback_expected  # an agent's bug is the service's own fault, logged whole
async def test_an_agent_bug_becomes_an_error_event() -> None:
    runs = RunManager(ScriptedAgent(fail=True))
    session = await MemorySessionStore().create()
    await (await runs.start(session, "hi")).wait()
    last = (await session.log.read(0))[-1].event
    assert last.type == "error" and last.code == "internal_error"


async def test_concurrency_cap() -> None:
    runs = RunManager(ScriptedAgent(asyncio.Event()), max_concurrent=1)
    store = MemorySessionStore()
    await runs.start(await store.create(), "a")
    with pytest.raises(Overloaded):
        await runs.start(await store.create(), "b")
    await runs.shutdown()


async def test_a_start_whose_first_append_fails_leaves_the_session_idle() -> None:
    runs = RunManager(ScriptedAgent())
    store = MemorySessionStore()
    session = await store.create()
    await session.log.close()  # deleted under the request, say: nothing can be appended
    with pytest.raises(RuntimeError):
        await runs.start(session, "a")
    assert session.status == IDLE and session.run_id == "" and runs.active == 0
    await runs.wait_idle()


async def test_unknown_session() -> None:
    store = MemorySessionStore()
    with pytest.raises(SessionNotFound):
        await store.get("nope")
    with pytest.raises(SessionNotFound):
        await store.delete("nope")


class SinkAgent:
    """Offers its text deltas to the run's sink (when it is given one) and yields the rest."""

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts
        self.taken: list[bool] = []

    async def run(
        self,
        messages: list[dict[str, Any]],
        user_text: str,
        max_turns: int,
        options: Any = None,
        sink: Any = None,
        charge: Any = None,
    ) -> AsyncIterator[Event]:
        for text in self.texts:
            delta = TextDelta(text=text)
            took = sink is not None and sink(delta)
            self.taken.append(took)
            if not took:
                yield delta
            await asyncio.sleep(0)  # another task may run between two reads of the model
        yield TurnCompleted(
            turn=1, stop_reason="end_turn", usage=Usage(output_tokens=1), total_usage=Usage(output_tokens=1)
        )
        yield RunDone(turns=1, usage=Usage(output_tokens=1))


async def test_text_deltas_the_sink_takes_are_logged_in_order_with_the_rest() -> None:
    agent = SinkAgent(["a", "b", "c"])
    runs = RunManager(agent)
    store = MemorySessionStore()
    session = await store.create()
    await (await runs.start(session, "hi")).wait()
    entries = await session.log.read(0)
    assert agent.taken == [True, True, True]
    assert [e.event.type for e in entries] == [
        "run_started",
        "status_change",
        "text_delta",
        "text_delta",
        "text_delta",
        "turn_completed",
        "status_change",
        "done",
    ]
    assert [e.event.text for e in entries if isinstance(e.event, TextDelta)] == ["a", "b", "c"]
    assert [e.id for e in entries] == list(range(1, len(entries) + 1))


@pytest.mark.traceback_expected  # a log closed under its run, with no cancel first, is a bug
async def test_a_closed_log_is_declined_by_the_sink_and_the_run_ends_as_before() -> None:
    agent = SinkAgent(["a", "b"])
    runs = RunManager(agent)
    session = await MemorySessionStore().create()
    run = await runs.start(session, "hi")
    await session.log.close()  # as when the session goes while the run is on its way
    await run.wait()
    assert agent.taken == [False]  # declined: the run met the closed log itself, and stopped
    assert session.status == IDLE and runs.active == 0
