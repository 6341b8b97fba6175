"""``POST /v1/chat/completions`` and ``GET /v1/models`` driven by the unmodified ``openai`` client.

The service runs on a real port with the embedded emulator (Bedrock's wire by default; the
OpenAI-compatible provider where a test says so); the client is PyPI's ``openai``, with its
retries off so that an error is seen once.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
from aiohttp.test_utils import TestClient

from tests.conftest import ClientFactory, sse_blocks

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
ASK_WEATHER = 'What is the weather in Paris? [emu:tool=get_weather] [emu:tool_input={"city": "Paris"}]'
PROVIDERS = {
    "bedrock": {},
    "openai": {"provider": "openai", "openai_base_url": "emulator", "openai_api_key": "emulator"},
}


_OPENED: list[openai.AsyncOpenAI] = []


@pytest.fixture(autouse=True)
async def _close_openai_clients() -> AsyncIterator[None]:
    """Close the test's clients on its own loop: one left to the garbage collector closes itself
    later, on a loop that is gone, and the error it logs lands in another test."""
    yield
    while _OPENED:
        await _OPENED.pop().close()


def openai_client(client: TestClient, key: str = "unused") -> openai.AsyncOpenAI:
    """PyPI's client pointed at the service under test (closed when the test ends)."""
    api = openai.AsyncOpenAI(base_url=str(client.make_url("/v1")), api_key=key, max_retries=0)
    _OPENED.append(api)
    return api


async def model_of(api: openai.AsyncOpenAI) -> str:
    models = await api.models.list()
    assert len(models.data) == 1
    return models.data[0].id


async def test_models_lists_the_configured_model(make_client: ClientFactory) -> None:
    client = await make_client(model_id="my-model")
    api = openai_client(client)
    models = await api.models.list()
    assert [(m.id, m.object, m.owned_by) for m in models.data] == [("my-model", "model", "agentstream")]
    assert (await api.models.retrieve("my-model")).id == "my-model"
    with pytest.raises(openai.NotFoundError) as caught:
        await api.models.retrieve("gpt-4o")
    assert caught.value.code == "model_not_found"


async def test_a_completion_runs_the_agent_with_its_own_tools(client: TestClient) -> None:
    api = openai_client(client)
    reply = await api.chat.completions.create(
        model=await model_of(api), messages=[{"role": "user", "content": "What is 17 * 3?"}]
    )
    assert reply.object == "chat.completion"
    assert reply.id.startswith("chatcmpl-")
    [choice] = reply.choices
    assert choice.finish_reason == "stop"
    assert choice.message.role == "assistant"
    assert "51" in (choice.message.content or "")  # the calculator ran inside the service
    assert not choice.message.tool_calls  # and is not the client's to see
    assert reply.usage is not None and reply.usage.prompt_tokens > 0 and reply.usage.completion_tokens > 0
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


async def test_streaming_ends_with_usage_and_done(client: TestClient) -> None:
    api = openai_client(client)
    model = await model_of(api)
    messages: Any = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Tell me something [emu:tokens=6]"},
    ]
    whole = await api.chat.completions.create(model=model, messages=messages)
    stream = await api.chat.completions.create(
        model=model, messages=messages, stream=True, stream_options={"include_usage": True}
    )
    chunks = [chunk async for chunk in stream]
    assert {chunk.object for chunk in chunks} == {"chat.completion.chunk"}
    assert len({chunk.id for chunk in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == whole.choices[0].message.content
    assert len(text.split()) == 6
    finishes = [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices]
    assert finishes[-1] == "stop" and set(finishes[:-1]) == {None}
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None and chunks[-1].usage == whole.usage


async def test_the_stream_carries_log_ids_and_no_usage_unless_asked(client: TestClient) -> None:
    api = openai_client(client)
    body = {"model": await model_of(api), "messages": [{"role": "user", "content": "Hi"}], "stream": True}
    async with client.post("/v1/chat/completions", json=body) as response:
        assert response.status == 200
        assert response.content_type == "text/event-stream"
        blocks = [block async for block in sse_blocks(response)]
    assert blocks[-1]["data"] == "[DONE]"
    chunks = [json.loads(block["data"]) for block in blocks[:-1]]
    assert all(chunk["choices"] for chunk in chunks)  # no usage chunk
    ids = [int(block["id"]) for block in blocks[1:-1]]  # the role chunk comes from no event
    assert ids == sorted(ids) and len(set(ids)) == len(ids) and ids[0] > 0


@pytest.mark.parametrize("provider", sorted(PROVIDERS))
async def test_the_clients_own_tool_is_handed_back_then_answered(
    make_client: ClientFactory, provider: str
) -> None:
    client = await make_client(**PROVIDERS[provider])
    api = openai_client(client)
    model = await model_of(api)
    question: Any = {"role": "user", "content": ASK_WEATHER}
    reply = await api.chat.completions.create(model=model, messages=[question], tools=[WEATHER])
    [choice] = reply.choices
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls or []
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    follow_up: Any = [
        question,
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 degrees"},
    ]
    final = await api.chat.completions.create(model=model, messages=follow_up, tools=[WEATHER])
    assert final.choices[0].finish_reason == "stop"
    assert "sunny, 21 degrees" in (final.choices[0].message.content or "")
    assert not final.choices[0].message.tool_calls


async def test_a_streamed_tool_call_arrives_in_pieces(client: TestClient) -> None:
    api = openai_client(client)
    stream = await api.chat.completions.create(
        model=await model_of(api),
        messages=[{"role": "user", "content": ASK_WEATHER}],
        tools=[WEATHER],  # type: ignore[list-item]
        stream=True,
        stream_options={"include_usage": True},
    )
    calls: dict[int, dict[str, str]] = {}
    finish = None
    async for chunk in stream:
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for piece in choice.delta.tool_calls or []:
                call = calls.setdefault(piece.index, {"id": "", "name": "", "arguments": ""})
                call["id"] += piece.id or ""
                assert piece.function is not None
                call["name"] += piece.function.name or ""
                call["arguments"] += piece.function.arguments or ""
    assert finish == "tool_calls"
    assert list(calls) == [0]
    assert calls[0]["id"] and calls[0]["name"] == "get_weather"
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris"}


async def test_a_client_tool_hides_the_services_tool_of_that_name(client: TestClient) -> None:
    api = openai_client(client)
    calculator = {"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}
    reply = await api.chat.completions.create(
        model=await model_of(api),
        messages=[{"role": "user", "content": "What is 2 + 3?"}],
        tools=[calculator],  # type: ignore[list-item]
    )
    [call] = reply.choices[0].message.tool_calls or []
    assert call.function.name == "calculator"  # handed back, not run here
    assert json.loads(call.function.arguments) == {"expression": "2 + 3"}
    # tool_choice "none": the client's tools are not offered; the service's calculator answers.
    reply = await api.chat.completions.create(
        model=await model_of(api),
        messages=[{"role": "user", "content": "What is 2 + 3?"}],
        tools=[calculator],  # type: ignore[list-item]
        tool_choice="none",
    )
    assert reply.choices[0].finish_reason == "stop" and "5" in (reply.choices[0].message.content or "")


BAD_REQUESTS: list[tuple[str, dict[str, Any], str | None]] = [
    ("no messages", {"messages": []}, "messages"),
    ("an unknown role", {"messages": [{"role": "robot", "content": "hi"}]}, "messages.[0]"),
    ("blank user text", {"messages": [{"role": "user", "content": "  "}]}, "messages.[0].content"),
    (
        "an image part",
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        "messages.[0].content.[0]",
    ),
    (
        "the assistant last",
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]},
        "messages.[1]",
    ),
    (
        "a tool result answering nothing",
        {
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "tool", "tool_call_id": "c1", "content": "x"},
            ]
        },
        "messages.[1].tool_call_id",
    ),
    (
        "a call left unanswered",
        {
            "messages": [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                    ],
                },
                {"role": "user", "content": "and?"},
            ]
        },
        "messages.[2]",
    ),
    ("n above 1", {"messages": [{"role": "user", "content": "hi"}], "n": 2}, "n"),
    ("stream as text", {"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}, "stream"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("case", "extra", "param"), BAD_REQUESTS, ids=[case for case, _, _ in BAD_REQUESTS])
async def test_bad_requests_are_typed_errors(
    client: TestClient, caplog: pytest.LogCaptureFixture, case: str, extra: dict[str, Any], param: str | None
) -> None:
    caplog.set_level(logging.WARNING)
    api = openai_client(client)
    with pytest.raises(openai.BadRequestError) as caught:
        await api.chat.completions.create(model=await model_of(api), **extra)
    error = caught.value
    assert error.status_code == 400
    assert error.type == "invalid_request_error"
    assert error.param == param
    assert isinstance(error.body, dict) and error.body["message"]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_an_unknown_model_is_not_found(client: TestClient) -> None:
    api = openai_client(client)
    with pytest.raises(openai.NotFoundError) as caught:
        await api.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.code == "model_not_found" and caught.value.param == "model"


async def test_keys_and_quotas_apply(make_client: ClientFactory) -> None:
    client = await make_client(api_keys=["secret"], quota_requests_per_minute=2)
    with pytest.raises(openai.AuthenticationError) as caught:
        await openai_client(client, "wrong").models.list()
    assert caught.value.code == "invalid_api_key"
    assert caught.value.type == "authentication_error"
    api = openai_client(client, "secret")
    model = await model_of(api)
    await api.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.RateLimitError) as limited:
        await api.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
    assert limited.value.code == "quota_exceeded" and limited.value.type == "rate_limit_error"
    assert limited.value.response.headers["Retry-After"]


async def test_plain_http_errors_on_v1_are_in_openais_shape(client: TestClient) -> None:
    for method, path, body, status in [
        ("POST", "/v1/chat/completions", b"{not json", 400),
        ("POST", "/v1/chat/completions", b"[1, 2]", 400),
        ("POST", "/v1/chat/completions", b"", 400),
        ("GET", "/v1/chat/completions", b"", 405),
        ("GET", "/v1/nothing", b"", 404),
    ]:
        async with client.request(method, path, data=body) as response:
            assert response.status == status, path
            payload = await response.json()
            assert set(payload["error"]) >= {"message", "type", "code", "param"}
            assert payload["error"]["type"] == "invalid_request_error"


@pytest.mark.slow
async def test_a_model_failure_is_an_error_in_the_clients_terms(client: TestClient) -> None:
    api = openai_client(client)
    model = await model_of(api)
    with pytest.raises(openai.BadRequestError):  # the model refused the request as invalid
        await api.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "[emu:http=400]"}]
        )
    with pytest.raises(openai.InternalServerError):
        await api.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "[emu:http=500]"}]
        )
    stream = await api.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Say a lot [emu:fail=validationException]"}],
        stream=True,
    )
    with pytest.raises(openai.APIError) as caught:
        async for _ in stream:
            pass
    assert isinstance(caught.value.body, dict) and caught.value.body["code"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_tool_that_needs_approval_is_declined_at_once(
    make_client: ClientFactory, caplog: pytest.LogCaptureFixture, stream: bool
) -> None:
    """Nothing on this face can answer an approval: the call is declined at once, the model told
    why, and the answer comes as usual (rather than after AGENT_APPROVAL_TIMEOUT_S)."""
    caplog.set_level(logging.WARNING)
    client = await make_client(tools_require_approval="calculator", approval_timeout_s=600)
    api = openai_client(client)
    model = await model_of(api)
    messages: Any = [{"role": "user", "content": "What is 6*7?"}]
    # The client's own timeout only keeps a failure of this test from waiting the 600 s out.
    if stream:
        chunks = [
            chunk
            async for chunk in await api.chat.completions.create(
                model=model, messages=messages, stream=True, timeout=30
            )
        ]
        text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
        finish = [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices][-1]
    else:
        reply = await api.chat.completions.create(model=model, messages=messages, timeout=30)
        text, finish = reply.choices[0].message.content or "", reply.choices[0].finish_reason
    assert finish == "stop"
    assert "approval" in text and "42" not in text  # the calculator did not run
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
