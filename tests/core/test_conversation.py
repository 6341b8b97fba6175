"""The conversation's message ids and rewinds (service/core/conversation.py), and the queue of
messages sent while a query runs (service/core/multitask.py), on scripted agents."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from service.core import conversation
from service.core.events import Usage
from service.core.multitask import ENQUEUE, Multitask
from service.core.options import RunOptions
from service.core.runs import RunManager
from service.core.sessions import MemorySessionStore
from service.errors import MessageNotFound, QuotaExceeded
from tests.core.test_runs import ScriptedAgent

pytestmark = pytest.mark.fast


def chat() -> list[dict[str, Any]]:
    usage = {"input_tokens": 5, "output_tokens": 2, "total_tokens": 7}
    return [
        {"role": "user", "content": [{"text": "Q1"}], "id": "u1"},
        {
            "role": "assistant",
            "content": [{"toolUse": {"toolUseId": "t", "name": "x", "input": {}}}],
            "id": "r1",
            "usage": usage,
        },
        {
            "role": "user",
            "content": [{"toolResult": {"toolUseId": "t", "content": [{"text": "1"}]}}],
            "id": "r1-1-results",
        },
        {"role": "assistant", "content": [{"text": "A1"}], "id": "r1-2", "usage": usage},
        {"role": "user", "content": [{"text": "Q2"}]},
        {"role": "assistant", "content": [{"text": "A2"}], "interrupted": True},
    ]


def test_ids_answers_and_what_the_model_is_sent() -> None:
    messages = chat()
    assert [held for _, held in conversation.ids(messages)] == [
        "u1",
        "r1",
        "r1-1-results",
        "r1-2",
        "m4",
        "m5",
    ]
    assert [conversation.answer_starts(messages, i) for i in range(6)] == [
        False,
        True,
        False,
        False,
        False,
        True,
    ]
    assert not conversation.is_user_text(messages[2]) and conversation.is_user_text(messages[4])
    sent = conversation.for_model(messages)
    assert all(set(message) == {"role", "content"} for message in sent)
    assert messages[0]["id"] == "u1"  # the conversation itself keeps its ids
    plain = [{"role": "user", "content": [{"text": "hi"}]}]
    assert conversation.for_model(plain) is plain
    assert conversation.turn_message_id("r", 1) == "r" and conversation.turn_message_id("r", 3) == "r-3"


def test_a_rewind_cuts_in_place_and_takes_the_removed_answers_usage_off() -> None:
    messages = chat()
    rewound = conversation.rewind(messages, 1, Usage(input_tokens=20, output_tokens=6, total_tokens=26))
    assert (rewound.message_id, rewound.kept, rewound.removed) == ("r1", 1, 5)
    assert rewound.usage == Usage(input_tokens=10, output_tokens=2, total_tokens=12)
    assert [m["id"] for m in messages] == ["u1"]


async def test_regenerate_and_edit_through_the_run_manager() -> None:
    store = MemorySessionStore()
    runs = RunManager(ScriptedAgent())
    session = await store.create()
    session.messages.extend(chat()[:4])
    with pytest.raises(MessageNotFound):
        await runs.start(
            session, "", options=RunOptions(rewind_to="r1-2", resume=True)
        )  # not an answer's start
    assert session.status == "idle" and len(session.messages) == 4
    with pytest.raises(MessageNotFound):
        await runs.start(session, "x", options=RunOptions(rewind_to="r1"))  # not a user's message
    run = await runs.start(session, "Q1 again", options=RunOptions(rewind_to="u1", message_id="u1"))
    await run.wait()
    entries = await session.log.read(0)
    kinds = [entry.event.type for entry in entries]
    assert kinds[:2] == ["conversation_rewound", "run_started"] and run.first_id == entries[0].id
    assert entries[1].event.message_id == "u1" and session.messages[0]["content"] == [{"text": "Q1 again"}]
    assert session.cut == 0


async def test_the_queue_is_bounded_and_dropped_with_its_session() -> None:
    gate = asyncio.Event()
    store = MemorySessionStore()
    runs = RunManager(ScriptedAgent(gate=gate))
    multitask = Multitask(runs, max_queued=1)
    session = await store.create()
    first = await multitask.send(session, "one", strategy=ENQUEUE)
    assert first.run is not None
    queued = await multitask.send(session, "two", strategy=ENQUEUE)
    assert queued.run is None and queued.queued == 1 and multitask.queued(session.id) == 1
    with pytest.raises(QuotaExceeded):
        await multitask.send(session, "three", strategy=ENQUEUE)
    await store.delete(session.id)  # the queued message goes with its session, never started
    await runs.cancel(session.id)  # as DELETE /sessions/{id} does
    with pytest.raises(asyncio.CancelledError):
        await queued.started
    assert multitask.queued(session.id) == 0
