"""Responses kept in the session database, on SQLite and PostgreSQL: a service restarted on the
same database tells a response from the stored conversation once its log is gone, continues it,
deletes it for good, and forgets it past the sessions' retention. Driven by the unmodified
``openai`` client, its retries off."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import openai
import pytest
from aiohttp.test_utils import TestClient

from service.core.durable import DAY_S, DurableSessionStore
from tests.conftest import ClientFactory, services_of

WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
ASK_WEATHER = 'Weather in Lima? [emu:tool=get_weather] [emu:tool_input={"city": "Lima"}]'

Start = Callable[[], Awaitable[tuple[TestClient, openai.AsyncOpenAI]]]


@pytest.fixture
async def start(make_client: ClientFactory, database_url: str) -> AsyncIterator[Start]:
    """``await start()``: a service on the test's database and an ``openai`` client on it. Each
    call stops the service the one before started, as a restart does: its log is gone with it."""
    opened: list[tuple[TestClient, openai.AsyncOpenAI]] = []

    async def restart() -> tuple[TestClient, openai.AsyncOpenAI]:
        if opened:
            service, api = opened[-1]
            await api.close()
            await service.close()
        service = await make_client(database_url=database_url)
        api = openai.AsyncOpenAI(base_url=str(service.make_url("/v1")), api_key="unused", max_retries=0)
        opened.append((service, api))
        return service, api

    yield restart
    await opened[-1][1].close()


async def model_of(api: openai.AsyncOpenAI) -> str:
    return (await api.models.list()).data[0].id


def output_of(response: Any) -> list[dict[str, Any]]:
    """The response's items; a call's arguments parsed, since the stored conversation keeps the
    call's input and not the text the model streamed it as (its spacing may differ)."""
    items = [item.model_dump(exclude_none=True) for item in response.output]
    for item in items:
        if "arguments" in item:
            item["arguments"] = json.loads(item["arguments"])
    return items


async def test_a_response_is_told_from_the_database_after_a_restart_and_goes_on(start: Start) -> None:
    _, api = await start()
    model = await model_of(api)
    said = await api.responses.create(model=model, input="Greet me [emu:say=Good morning, Grace]")
    asked = await api.responses.create(
        model=model, input=ASK_WEATHER, tools=[WEATHER], previous_response_id=said.id
    )
    [call] = [item for item in asked.output if item.type == "function_call"]

    _, api = await start()
    again = await api.responses.retrieve(said.id)
    assert again.status == "completed" and again.output_text == "Good morning, Grace"
    assert output_of(again) == output_of(said)  # the same items, ids and all
    assert again.usage == said.usage
    handed = await api.responses.retrieve(asked.id)
    assert handed.status == "completed" and output_of(handed) == output_of(asked)
    assert json.loads(handed.output[-1].arguments) == {"city": "Lima"}  # type: ignore[union-attr]
    # The events went with the old service's log: a stream is refused by name, a poll is not.
    with pytest.raises(openai.BadRequestError) as caught:
        await api.responses.retrieve(asked.id, stream=True)
    assert (caught.value.code, caught.value.param) == ("events_purged", "stream")
    # The conversation went on past the first response: continuing it would fork, also now.
    with pytest.raises(openai.ConflictError):
        await api.responses.create(model=model, input="fork", previous_response_id=said.id)
    # The call handed back before the restart is answered after it.
    final = await api.responses.create(
        model=model,
        previous_response_id=asked.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "fog, 16 degrees"}],
        tools=[WEATHER],
    )
    assert final.status == "completed" and "fog, 16 degrees" in final.output_text
    assert final.session_id == said.session_id  # type: ignore[attr-defined]

    _, api = await start()
    assert (await api.responses.retrieve(final.id)).output_text == final.output_text


async def test_a_deleted_response_is_gone_from_the_database(start: Start) -> None:
    _, api = await start()
    model = await model_of(api)
    counted = await api.responses.create(model=model, input="What is 17 * 3?")
    [ran] = [item for item in counted.output if item.type == "mcp_call"]
    assert "51" in (ran.output or "")
    kept = await api.responses.create(model=model, input="Keep me [emu:say=Kept]")

    _, api = await start()
    told = await api.responses.retrieve(counted.id)  # the service's own tool call, from the database
    assert output_of(told) == output_of(counted) and "51" in told.output_text
    deleted = await api.responses.delete(counted.id)  # held by the database alone here
    assert deleted is None
    for attempt in (
        api.responses.retrieve(counted.id),
        api.responses.delete(counted.id),
        api.responses.create(model=model, input="more", previous_response_id=counted.id),
    ):
        with pytest.raises(openai.NotFoundError):
            await attempt

    _, api = await start()
    with pytest.raises(openai.NotFoundError):
        await api.responses.retrieve(counted.id)
    # Another conversation's response is untouched.
    assert (await api.responses.retrieve(kept.id)).output_text == "Kept"


async def test_a_response_past_the_retention_is_not_found(start: Start) -> None:
    service, api = await start()
    store = services_of(service).sessions
    assert isinstance(store, DurableSessionStore) and store.retention_s == 30 * DAY_S
    clock = store.clock
    old = await api.responses.create(model=await model_of(api), input="An old question [emu:tokens=4]")
    store.clock = lambda: clock() + 20 * DAY_S
    recent = await api.responses.create(model=await model_of(api), input="A recent one [emu:tokens=4]")
    store.clock = lambda: clock() + 31 * DAY_S
    assert await store.sweep() == [old.session_id]  # type: ignore[attr-defined]
    with pytest.raises(openai.NotFoundError):
        await api.responses.retrieve(old.id)
    assert (await api.responses.retrieve(recent.id)).status == "completed"

    _, api = await start()
    with pytest.raises(openai.NotFoundError):
        await api.responses.retrieve(old.id)
    assert len((await api.responses.retrieve(recent.id)).output_text.split()) == 4


async def test_a_cancelled_response_stays_cancelled_after_a_restart(start: Start) -> None:
    _, api = await start()
    model = await model_of(api)
    started = await api.responses.create(
        model=model, input="On and on [emu:tokens=4000] [emu:tps=100]", background=True
    )
    async with await api.responses.retrieve(started.id, stream=True) as stream:
        async for event in stream:
            if event.type == "response.output_text.delta":
                break
    cancelled = await api.responses.cancel(started.id)
    assert cancelled.status == "cancelled" and cancelled.output_text

    _, api = await start()
    told = await api.responses.retrieve(started.id)
    assert told.status == "cancelled" and told.output_text == cancelled.output_text
    # Cancelling what no longer runs changes nothing.
    assert (await api.responses.cancel(started.id)).status == "cancelled"
    followed = await api.responses.create(
        model=model, input="Briefly [emu:tokens=2]", previous_response_id=started.id
    )
    assert followed.status == "completed" and len(followed.output_text.split()) == 2
