"""``/v1/responses`` driven by the unmodified ``openai`` client (PyPI), on a real port with the
embedded emulator; its retries are off so that an error is seen once."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from aiohttp.test_utils import TestClient

from tests.conftest import ClientFactory, sse_blocks
from tests.transports.test_openai_chat import (  # noqa: F401 - the fixture closes the clients
    PROVIDERS,
    _close_openai_clients,
    model_of,
    openai_client,
)

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
ASK_WEATHER = 'What is the weather in Paris? [emu:tool=get_weather] [emu:tool_input={"city": "Paris"}]'


async def test_a_response_runs_the_agent_with_its_own_tools(client: TestClient) -> None:
    api = openai_client(client)
    response = await api.responses.create(model=await model_of(api), input="What is 17 * 3?")
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.status == "completed"
    assert "51" in response.output_text  # the calculator ran inside the service
    kinds = [item.type for item in response.output]
    assert "mcp_call" in kinds and "function_call" not in kinds  # shown, not the client's to run
    [call] = [item for item in response.output if item.type == "mcp_call"]
    assert call.name == "calculator" and "51" in (call.output or "")
    assert response.usage is not None and response.usage.input_tokens > 0
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens
    again = await api.responses.retrieve(response.id)
    assert again.model_dump() == response.model_dump()


async def test_a_streamed_response_is_numbered_and_ends_completed(client: TestClient) -> None:
    api = openai_client(client)
    model = await model_of(api)
    stream = await api.responses.create(model=model, input="Tell me something [emu:tokens=6]", stream=True)
    events = [event async for event in stream]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    kinds = [event.type for event in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    text = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert len(text.split()) == 6
    final = events[-1].response  # type: ignore[union-attr]
    assert final.output_text == text and final.status == "completed"
    assert (await api.responses.retrieve(final.id)).output_text == text


async def test_the_stream_helper_accumulates_the_same_response(client: TestClient) -> None:
    api = openai_client(client)
    async with api.responses.stream(model=await model_of(api), input="Hi [emu:tokens=5]") as stream:
        async for _ in stream:
            pass
        final = await stream.get_final_response()
    assert final.status == "completed" and len(final.output_text.split()) == 5


@pytest.mark.parametrize("provider", sorted(PROVIDERS))
async def test_a_function_tool_is_handed_back_then_answered(
    make_client: ClientFactory, provider: str
) -> None:
    client = await make_client(**PROVIDERS[provider])
    api = openai_client(client)
    model = await model_of(api)
    first = await api.responses.create(model=model, input=ASK_WEATHER, tools=[WEATHER])  # type: ignore[list-item]
    assert first.status == "completed"
    [call] = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    final = await api.responses.create(
        model=model,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 degrees"}],
        tools=[WEATHER],  # type: ignore[list-item]
    )
    assert final.status == "completed"
    assert "sunny, 21 degrees" in final.output_text
    assert final.previous_response_id == first.id
    assert not [item for item in final.output if item.type == "function_call"]


async def test_the_whole_history_can_come_instead_of_previous_response_id(client: TestClient) -> None:
    api = openai_client(client)
    model = await model_of(api)
    first = await api.responses.create(model=model, input=ASK_WEATHER, tools=[WEATHER], store=False)  # type: ignore[list-item]
    [call] = [item for item in first.output if item.type == "function_call"]
    history: Any = [
        {"role": "user", "content": ASK_WEATHER},
        call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": "rainy"},
    ]
    final = await api.responses.create(model=model, input=history, tools=[WEATHER], store=False)  # type: ignore[list-item]
    assert "rainy" in final.output_text
    with pytest.raises(openai.NotFoundError):  # not stored
        await api.responses.retrieve(final.id)


async def test_a_conversation_goes_on_with_previous_response_id(client: TestClient) -> None:
    api = openai_client(client)
    model = await model_of(api)
    first = await api.responses.create(model=model, input="My name is Ada. [emu:say=Hello Ada]")
    second = await api.responses.create(model=model, input="What is my name?", previous_response_id=first.id)
    assert second.status == "completed"
    assert second.usage is not None and first.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens  # the first exchange went to the model too
    # Continuing the first again would fork the conversation: refused, by name.
    with pytest.raises(openai.ConflictError) as caught:
        await api.responses.create(model=model, input="again", previous_response_id=first.id)
    assert caught.value.code == "conversation_forked"
    assert (await api.responses.retrieve(first.id)).output_text == "Hello Ada"


async def test_a_background_response_resumes_from_any_sequence_number(client: TestClient) -> None:
    api = openai_client(client)
    model = await model_of(api)
    started = await api.responses.create(
        model=model, input="Count for me [emu:tokens=40] [emu:tps=400]", background=True
    )
    assert started.status in {"queued", "in_progress"} and started.background
    stream = await api.responses.create(
        model=model, input="Count again [emu:tokens=30] [emu:tps=300]", background=True, stream=True
    )
    cut = []
    async for event in stream:
        cut.append(event)
        if len(cut) == 10:
            break
    await stream.close()
    response_id = cut[0].response.id  # type: ignore[union-attr]
    rest = await api.responses.retrieve(response_id, stream=True, starting_after=cut[-1].sequence_number)
    resumed = [event async for event in rest]
    numbers = [event.sequence_number for event in cut + resumed]
    assert numbers == list(range(len(numbers)))  # nothing lost, nothing twice
    assert resumed[-1].type == "response.completed"
    text = "".join(e.delta for e in cut + resumed if e.type == "response.output_text.delta")
    assert len(text.split()) == 30
    # Every reader numbers the events as the first did.
    whole = [event async for event in await api.responses.retrieve(response_id, stream=True)]
    assert [(e.sequence_number, e.type) for e in whole] == [
        (e.sequence_number, e.type) for e in cut + resumed
    ]
    polled = await api.responses.retrieve(started.id)
    while polled.status in {"queued", "in_progress"}:  # runs on without its client
        polled = await api.responses.retrieve(started.id)
    assert polled.status == "completed" and len(polled.output_text.split()) == 40


async def test_a_background_response_can_be_cancelled_and_deleted(client: TestClient) -> None:
    api = openai_client(client)
    model = await model_of(api)
    started = await api.responses.create(
        model=model, input="Go on [emu:tokens=400] [emu:tps=20]", background=True
    )
    cancelled = await api.responses.cancel(started.id)
    assert cancelled.status == "cancelled"
    assert (await api.responses.retrieve(started.id)).status == "cancelled"
    await api.responses.delete(started.id)
    with pytest.raises(openai.NotFoundError):
        await api.responses.retrieve(started.id)


async def test_another_callers_response_is_not_found(make_client: ClientFactory) -> None:
    client = await make_client(api_keys="alice-key,bob-key")
    alice, bob = openai_client(client, "alice-key"), openai_client(client, "bob-key")
    mine = await alice.responses.create(model=await model_of(alice), input="Hi")
    for attempt in (
        bob.responses.retrieve(mine.id),
        bob.responses.cancel(mine.id),
        bob.responses.delete(mine.id),
        bob.responses.create(model=await model_of(bob), input="Hi", previous_response_id=mine.id),
    ):
        with pytest.raises(openai.NotFoundError):
            await attempt
    assert (await alice.responses.retrieve(mine.id)).status == "completed"


BAD: list[tuple[str, dict[str, Any], str, str]] = [
    ("unknown parameter", {"input": "hi", "frobnicate": 1}, "frobnicate", "unknown_parameter"),
    ("unknown odd name", {"input": "hi", "Max-Tokens": 1}, "Max-Tokens", "unknown_parameter"),
    ("conversation", {"input": "hi", "conversation": "conv_1"}, "conversation", "unsupported_parameter"),
    ("hosted tool", {"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type", "invalid_value"),
    (
        "image input",
        {"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
        "input[0].content[0].type",
        "invalid_value",
    ),
    (
        "unanswered call",
        {
            "input": [
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                {"role": "user", "content": "hi"},
            ]
        },
        "input",
        "invalid_value",
    ),
    (
        "stray output",
        {"input": [{"type": "function_call_output", "call_id": "c9", "output": "x"}]},
        "input[0].call_id",
        "invalid_value",
    ),
    (
        "bad item field",
        {"input": [{"type": "function_call", "call_id": "c1", "name": "a b", "arguments": "{}"}]},
        "input[0].name",
        "invalid_value",
    ),
    ("assistant last", {"input": [{"role": "assistant", "content": "hi"}]}, "input[0]", "invalid_value"),
    (
        "background unstored",
        {"input": "hi", "background": True, "store": False},
        "background",
        "invalid_value",
    ),
    ("bad stream", {"input": "hi", "stream": "yes"}, "stream", "invalid_value"),
]


@pytest.mark.parametrize(("name", "body", "param", "code"), BAD, ids=[case[0] for case in BAD])
async def test_bad_requests_name_their_parameter(
    client: TestClient, name: str, body: dict[str, Any], param: str, code: str
) -> None:
    api = openai_client(client)
    response = await client.post("/v1/responses", json={"model": await model_of(api), **body})
    assert response.status == 400, await response.text()
    error = (await response.json())["error"]
    assert (error["param"], error["code"], error["type"]) == (param, code, "invalid_request_error")


async def test_unknown_ids_and_models_are_not_found(client: TestClient) -> None:
    api = openai_client(client)
    for response_id in ("resp_nope", "resp_0123456789abcdefNoSuchSession", "x" * 300):
        with pytest.raises(openai.NotFoundError):
            await api.responses.retrieve(response_id)
    with pytest.raises(openai.NotFoundError) as caught:
        await api.responses.create(model="gpt-9", input="hi")
    assert caught.value.code == "model_not_found"


async def test_the_raw_stream_names_each_event(client: TestClient) -> None:
    api = openai_client(client)
    body = {"model": await model_of(api), "input": "Hi [emu:tokens=3]", "stream": True}
    async with client.post("/v1/responses", json=body) as response:
        assert response.content_type == "text/event-stream"
        blocks = [block async for block in sse_blocks(response)]
    assert all(json.loads(block["data"])["type"] == block["event"] for block in blocks)


async def test_every_reader_of_a_response_reads_the_same_events(client: TestClient) -> None:
    # The first reader's blocks of each entry are kept on the entry for the others: a reader that
    # resumes between two events of one entry (response.created and response.in_progress come
    # of one, the closing events of the message and response.completed of another) must get the
    # later ones alone, and every reader the same bytes.
    api = openai_client(client)
    started = await api.responses.create(model=await model_of(api), input="What is 17 * 3?", background=True)

    async def read(starting_after: int | None = None) -> list[dict[str, str]]:
        url = f"/v1/responses/{started.id}?stream=true"
        if starting_after is not None:
            url += f"&starting_after={starting_after}"
        async with client.get(url) as response:
            assert response.status == 200
            return [block async for block in sse_blocks(response)]

    first = await read()  # live, to the response's end
    numbers = [json.loads(block["data"])["sequence_number"] for block in first]
    assert numbers == list(range(len(first)))
    kinds = [block["event"] for block in first]
    assert "response.mcp_call.completed" in kinds and kinds[-1] == "response.completed"
    assert await read() == first
    for after in range(len(first)):
        assert await read(after) == first[after + 1 :], after


async def test_an_answer_can_be_sent_back_by_reference(make_client: ClientFactory) -> None:
    client = await make_client(api_keys="alice-key,bob-key")
    alice, bob = openai_client(client, "alice-key"), openai_client(client, "bob-key")
    model = await model_of(alice)
    first = await alice.responses.create(model=model, input="My name is Ada. [emu:say=Hello Ada]")
    [answer] = [item for item in first.output if item.type == "message"]
    history: Any = [
        {"role": "user", "content": "My name is Ada."},
        {"type": "item_reference", "id": answer.id},
        {"role": "user", "content": "What is my name?"},
    ]
    second = await alice.responses.create(model=model, input=history)
    session = await (
        await client.get(f"/sessions/{second.session_id}", headers={"Authorization": "Bearer alice-key"})  # type: ignore[attr-defined]
    ).json()
    # The referenced answer is read from the first response's conversation into the second's.
    assert [(m["role"], m["content"][0].get("text")) for m in session["messages"][:2]] == [
        ("user", "My name is Ada."),
        ("assistant", "Hello Ada"),
    ]
    # Another key's answer is not found; a function call must come in full.
    with pytest.raises(openai.NotFoundError) as caught:
        await bob.responses.create(model=model, input=history)
    assert caught.value.body["param"] == "input[1].id"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as refused:
        await alice.responses.create(
            model=model, input=[{"type": "item_reference", "id": "fc_tooluse_1"}, history[-1]]
        )
    assert refused.value.body["param"] == "input[0].id"  # type: ignore[index]


async def test_starting_after_is_ascii_digits(client: TestClient) -> None:
    api = openai_client(client)
    done = await api.responses.create(model=await model_of(api), input="Hi [emu:tokens=3]")
    # "²" and "٣" are digits to str.isdigit(); only the first is refused by int() as well.
    for raw in ("²", "٣", "-1", " 2"):
        params = {"stream": "true", "starting_after": raw}
        async with client.get(f"/v1/responses/{done.id}", params=params) as response:
            assert response.status == 400, (raw, await response.text())
            assert (await response.json())["error"]["param"] == "starting_after"


async def test_each_event_carries_its_number_as_the_sse_id_for_an_eventsource_to_resume(
    client: TestClient,
) -> None:
    api = openai_client(client)
    done = await api.responses.create(model=await model_of(api), input="Hi [emu:tokens=8]")
    async with client.get(f"/v1/responses/{done.id}", params={"stream": "true"}) as response:
        blocks = [block async for block in sse_blocks(response)]
    assert [int(block["id"]) for block in blocks] == [
        json.loads(b["data"])["sequence_number"] for b in blocks
    ]
    # A reconnecting EventSource sends the last id it saw: the stream goes on after it.
    async with client.get(
        f"/v1/responses/{done.id}", params={"stream": "true"}, headers={"Last-Event-ID": blocks[4]["id"]}
    ) as response:
        rest = [block async for block in sse_blocks(response)]
    assert rest == blocks[5:]
