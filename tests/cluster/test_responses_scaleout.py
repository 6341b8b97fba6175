"""The Responses face on two service processes sharing a Redis of the tests' own: a response made
on one instance is read, streamed, resumed, cancelled and continued on the other, with the
unmodified ``openai`` client (its retries off, so that an error is seen once)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import openai
import pytest

from tests.cluster.test_scaleout import instance_env
from tests.support.instances import ServiceProcess
from tests.support.redis_server import RedisServer, require_redis_server

WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
ASK_WEATHER = 'Weather in Oslo? [emu:tool=get_weather] [emu:tool_input={"city": "Oslo"}]'
RUNNING = {"queued", "in_progress"}


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[ServiceProcess, ServiceProcess]]:
    """Two instances on one private Redis, shared by the module's tests (each makes its own
    responses, so they do not meet)."""
    require_redis_server()
    with RedisServer() as server:
        env = instance_env(server.url, "responses")
        with ServiceProcess(env) as a, ServiceProcess(env) as b:
            yield a, b


@pytest.fixture
async def apis(pair: tuple[ServiceProcess, ServiceProcess]) -> AsyncIterator[tuple[openai.AsyncOpenAI, ...]]:
    """An ``openai`` client on each instance, closed on the test's own loop."""
    made = tuple(
        openai.AsyncOpenAI(base_url=f"{instance.base_url}/v1", api_key="unused", max_retries=0)
        for instance in pair
    )
    yield made
    for api in made:
        await api.close()


async def model_of(api: openai.AsyncOpenAI) -> str:
    return (await api.models.list()).data[0].id


async def test_a_background_stream_made_on_one_instance_is_resumed_across_both(
    apis: tuple[openai.AsyncOpenAI, openai.AsyncOpenAI],
) -> None:
    a, b = apis
    model = await model_of(a)
    started = await a.responses.create(
        model=model, input="Count slowly [emu:tokens=300] [emu:tps=200]", background=True
    )
    assert started.status in RUNNING and started.background
    # Read on B while A runs it: B folds the shared log into the same response.
    during = await b.responses.retrieve(started.id)
    assert during.id == started.id and during.status in RUNNING and during.background

    cut = []
    async with await b.responses.retrieve(started.id, stream=True) as stream:
        async for event in stream:
            cut.append(event)
            if len(cut) == 10:
                break
    resumed = [
        event
        async for event in await a.responses.retrieve(
            started.id, stream=True, starting_after=cut[-1].sequence_number
        )
    ]
    numbers = [event.sequence_number for event in cut + resumed]
    assert numbers == list(range(len(numbers)))  # nothing lost, nothing twice
    assert cut[0].type == "response.created" and resumed[-1].type == "response.completed"
    # A whole read from either instance numbers every event as the cut and resumed reads did.
    for api in (a, b):
        whole = [event async for event in await api.responses.retrieve(started.id, stream=True)]
        assert [(e.sequence_number, e.type) for e in whole] == [
            (e.sequence_number, e.type) for e in cut + resumed
        ]
    text = "".join(e.delta for e in cut + resumed if e.type == "response.output_text.delta")
    assert len(text.split()) == 300

    after = await b.responses.retrieve(started.id)
    assert after.status == "completed" and after.output_text == text
    assert after.model_dump() == (await a.responses.retrieve(started.id)).model_dump()


async def test_a_cancel_sent_to_the_other_instance_stops_the_query(
    apis: tuple[openai.AsyncOpenAI, openai.AsyncOpenAI],
) -> None:
    a, b = apis
    started = await a.responses.create(
        model=await model_of(a), input="Go on and on [emu:tokens=4000] [emu:tps=40]", background=True
    )
    # Cancelled once text flows, so that it is A's running query that B stops.
    async with await b.responses.retrieve(started.id, stream=True) as stream:
        async for event in stream:
            if event.type == "response.output_text.delta":
                break
    cancelled = await b.responses.cancel(started.id)
    assert cancelled.status == "cancelled"
    on_a = await a.responses.retrieve(started.id)
    assert on_a.status == "cancelled"
    assert 0 < len(on_a.output_text.split()) < 4000
    # The stream from A ends with the cancellation (the stream's events have no "cancelled" of
    # their own: an incomplete response whose status says so), and the session goes on.
    events = [event async for event in await a.responses.retrieve(started.id, stream=True)]
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.status == "cancelled"  # type: ignore[union-attr]
    followed = await a.responses.create(
        model=await model_of(a), input="Short now [emu:tokens=3]", previous_response_id=started.id
    )
    assert followed.status == "completed" and len(followed.output_text.split()) == 3


async def test_previous_response_id_made_on_one_instance_continues_on_the_other(
    apis: tuple[openai.AsyncOpenAI, openai.AsyncOpenAI],
) -> None:
    a, b = apis
    model = await model_of(a)
    first = await a.responses.create(model=model, input="My name is Ada. [emu:say=Hello Ada]")
    second = await b.responses.create(
        model=model, input="And mine? [emu:say=Still Ada]", previous_response_id=first.id
    )
    assert second.status == "completed" and second.output_text == "Still Ada"
    assert second.previous_response_id == first.id and second.session_id == first.session_id  # type: ignore[attr-defined]
    assert second.usage is not None and first.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens  # the first exchange went along
    # Only the latest response continues, whichever instance is asked.
    with pytest.raises(openai.ConflictError) as caught:
        await a.responses.create(model=model, input="fork", previous_response_id=first.id)
    assert caught.value.code == "conversation_forked"
    assert (await a.responses.retrieve(second.id)).model_dump() == second.model_dump()


async def test_a_function_call_handed_back_on_one_instance_is_answered_on_the_other(
    apis: tuple[openai.AsyncOpenAI, openai.AsyncOpenAI],
) -> None:
    a, b = apis
    model = await model_of(a)
    first = await a.responses.create(model=model, input=ASK_WEATHER, tools=[WEATHER])
    [call] = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Oslo"}
    assert (await b.responses.retrieve(first.id)).output == first.output
    final = await b.responses.create(
        model=model,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "snow, -4 degrees"}],
        tools=[WEATHER],
    )
    assert final.status == "completed" and "snow, -4 degrees" in final.output_text
    assert not [item for item in final.output if item.type == "function_call"]
    # A call id the previous response did not hand back is refused on either instance.
    with pytest.raises(openai.BadRequestError) as caught:
        await a.responses.create(
            model=model,
            previous_response_id=final.id,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "again"}],
            tools=[WEATHER],
        )
    assert caught.value.param == "input[0].call_id"


async def test_a_response_running_on_one_instance_is_deleted_from_the_other(
    apis: tuple[openai.AsyncOpenAI, openai.AsyncOpenAI],
) -> None:
    a, b = apis
    started = await a.responses.create(
        model=await model_of(a), input="Endless [emu:tokens=4000] [emu:tps=40]", background=True
    )
    stream = await a.responses.retrieve(started.id, stream=True)
    async for event in stream:
        if event.type == "response.output_text.delta":
            break
    await b.responses.delete(started.id)
    # A's reader sees the query end instead of waiting out its 4000 tokens.
    rest = [event async for event in stream]
    assert rest[-1].type == "response.incomplete"
    for api in (a, b):
        with pytest.raises(openai.NotFoundError):
            await api.responses.retrieve(started.id)
