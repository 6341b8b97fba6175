"""OpenAIProvider: the SSE reader, the request conversion, the provider over real HTTP, and the
service running on it (``AGENT_PROVIDER=openai`` with ``AGENT_OPENAI_BASE_URL=emulator``)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.core.events import Event, TextDelta
from service.emulator.answers import answer_words
from service.emulator.server import RECORDS_KEY
from service.errors import ProviderError
from service.providers.base import POOL_IDLE_S, ModelRequest, TurnResult
from service.providers.openai import OpenAIProvider, to_openai_messages, to_openai_tools
from service.providers.openai_stream import DONE, OpenAIStreamParser, SSELineReader, decode_data
from tests.conftest import ClientFactory, services_of, sse_events, stream_agent
from tests.support._pipes import free_port

# -- the SSE reader -----------------------------------------------------------------------------


def read_all(pieces: list[bytes]) -> list[str]:
    """Every data payload of a stream that arrives in ``pieces``."""
    reader = SSELineReader()
    payloads: list[str] = []
    for piece in pieces:
        payloads.extend(reader.feed(piece))
    return payloads + reader.close()


def test_data_lines_with_and_without_the_space() -> None:
    assert read_all([b'data: {"a":1}\n\ndata:{"b":2}\n\ndata:  padded\n\n']) == [
        '{"a":1}',
        '{"b":2}',
        " padded",
    ]


def test_comments_blank_lines_and_other_fields_are_ignored() -> None:
    raw = b": keep-alive\n\nevent: message\nid: 42\nretry: 1000\ndata: x\n\n:\n\nnonsense\n\ndata: y\n\n"
    assert read_all([raw]) == ["x", "y"]


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"])
def test_every_line_end(eol: bytes) -> None:
    raw = eol.join([b"data: one", b"", b": c", b"data: two", b"", b""])
    assert read_all([raw]) == ["one", "two"]


def test_a_split_between_cr_and_lf_is_one_line_end() -> None:
    # Were the "\n" taken for a second line end, the blank line would be harmless; but the next
    # line must not lose its first byte or gain an empty line's meaning.
    assert read_all([b"data: one\r", b"\ndata: two\r", b"\n\r\n"]) == ["one", "two"]


def test_a_split_inside_a_multibyte_character() -> None:
    raw = 'data: {"t": "π ≈ 3.14 🙂"}\n\n'.encode()
    for cut in range(1, len(raw)):
        assert read_all([raw[:cut], raw[cut:]]) == ['{"t": "π ≈ 3.14 🙂"}'], cut


def test_a_line_is_handed_over_as_soon_as_it_ends() -> None:
    reader = SSELineReader()
    assert reader.feed(b"data: fir") == []
    assert reader.feed(b"st\n") == ["first"]  # no waiting for the blank line
    assert reader.feed(b"\n") == []


def test_a_last_line_without_a_line_end_and_a_bom() -> None:
    assert read_all([b"\xef\xbb\xbfdata: a\n\ndata: [DONE]"]) == ["a", "[DONE]"]


def test_invalid_utf8_and_endless_lines_are_malformed() -> None:
    with pytest.raises(ProviderError) as caught:
        read_all([b"data: \xff\xfe\n"])
    assert caught.value.code == "malformed_chunk"
    reader = SSELineReader(max_line_bytes=100)
    with pytest.raises(ProviderError, match="longer than 100 bytes"):
        reader.feed(b"data: " + b"x" * 200)


def test_decode_data() -> None:
    assert decode_data('{"a": 1}') == {"a": 1}
    assert decode_data(" [DONE] ") == DONE
    assert decode_data("") is None
    for bad in ('{"a": ', "[1, 2]", "nope"):
        with pytest.raises(ProviderError) as caught:
            decode_data(bad)
        assert caught.value.code == "malformed_chunk"


def test_a_chunk_nested_too_deep_is_malformed() -> None:
    # 150 levels parse with json.loads but could not be stored as an event; 5000 overflow the parser.
    for depth in (150, 5000):
        with pytest.raises(ProviderError) as caught:
            decode_data('{"choices":' + "[" * depth + "]" * depth + "}")
        assert caught.value.code == "malformed_chunk" and "nested" in str(caught.value)


# -- property: any split of a valid stream reads the same ----------------------------------------

_token = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=6)


def _chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    return {
        "id": "c",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }


@st.composite
def sse_streams(draw: st.DrawFn) -> tuple[bytes, list[Any]]:
    """A valid raw SSE stream of an OpenAI answer, with the chunks it carries."""
    items: list[Any] = [_chunk({"role": "assistant", "content": ""})]
    items += [_chunk({"content": token}) for token in draw(st.lists(_token, max_size=8))]
    arguments = draw(st.lists(_token, max_size=3))
    if arguments:
        items.append(
            _chunk(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "f", "arguments": ""},
                        }
                    ]
                }
            )
        )
        items += [
            _chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}) for piece in arguments
        ]
    items.append(_chunk({}, "tool_calls" if arguments else "stop"))
    items.append(
        {"id": "c", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}}
    )
    items.append(DONE)
    eol = draw(st.sampled_from([b"\n", b"\r\n", b"\r"]))
    extras = st.lists(
        st.sampled_from([b": keep-alive", b":", b"event: message", b"id: 9", b"retry: 500"]), max_size=2
    )
    raw = bytearray()
    for item in items:
        for extra in draw(extras):
            raw += extra + eol
        raw += draw(st.sampled_from([b"data: ", b"data:"]))
        raw += item.encode() if isinstance(item, str) else json.dumps(item, ensure_ascii=False).encode()
        raw += eol + eol
    return bytes(raw), items


def parse_pieces(pieces: list[bytes]) -> tuple[list[Any], list[Event]]:
    """The decoded chunks and the parser's events for a stream read in ``pieces``."""
    chunks = [decode_data(payload) for payload in read_all(pieces)]
    parser = OpenAIStreamParser()
    events: list[Event] = []
    for chunk in chunks:
        assert chunk is not None
        events.extend(parser.feed(chunk))
    return chunks, events


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=sse_streams(), data=st.data())
def test_any_split_into_network_reads_gives_the_same_events(
    stream: tuple[bytes, list[Any]], data: st.DataObject
) -> None:
    raw, items = stream
    cuts = sorted(set(data.draw(st.lists(st.integers(0, len(raw)), max_size=24))))
    pieces = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    whole_chunks, whole_events = parse_pieces([raw])
    assert whole_chunks == items
    split_chunks, split_events = parse_pieces(pieces)
    assert split_chunks == whole_chunks
    assert split_events == whole_events


def test_byte_by_byte_reads_give_the_same_events() -> None:
    raw = (
        'data: {"choices":[{"index":0,"delta":{"content":"naïve 🙂"}}]}\r\n\r\ndata: [DONE]\r\n\r\n'.encode()
    )
    assert parse_pieces([raw[i : i + 1] for i in range(len(raw))]) == parse_pieces([raw])


# -- property: whatever JSON a data line carries, a bad one is a ProviderError -------------------

_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=12,
)
_keys = st.sampled_from(
    ["choices", "delta", "tool_calls", "function", "arguments", "content", "error", "usage"]
)


@st.composite
def data_lines(draw: st.DrawFn) -> str:
    """A data line: chunk-shaped JSON, a value nested to any depth inside one, or broken JSON."""
    depth = draw(st.integers(0, 3000))
    key = draw(_keys)
    deep = draw(st.sampled_from(["[" * depth + "]" * depth, '{"a":' * depth + "1" + "}" * depth]))
    return draw(
        st.sampled_from(
            [
                json.dumps({key: draw(_values)}),
                json.dumps({"choices": [{"index": 0, "delta": {key: draw(_values)}}]}),
                '{"choices":[{"index":0,"delta":{"' + key + '":' + deep + "}}]}",
                '{"' + key + '":' + deep[: len(deep) // 2],
            ]
        )
    )


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=st.lists(data_lines(), max_size=4))
def test_any_data_line_is_read_or_refused_as_a_provider_error(lines: list[str]) -> None:
    parser = OpenAIStreamParser()
    try:
        for line in [*lines, DONE]:
            chunk = decode_data(line)
            if chunk is not None:
                parser.feed(chunk)
        parser.result()
    except ProviderError:
        pass  # refused the way any bad stream is: no other exception may come out


# -- the request -------------------------------------------------------------------------------


CONVERSATION: list[dict[str, Any]] = [
    {"role": "user", "content": [{"text": "What is the square root of 144?"}]},
    {
        "role": "assistant",
        "content": [
            {"reasoningContent": {"reasoningText": {"text": "Use the tool.", "signature": "sig"}}},
            {"text": "Let me check."},
            {"toolUse": {"toolUseId": "t1", "name": "calculator", "input": {"expression": "sqrt(144)"}}},
            {"toolUse": {"toolUseId": "t2", "name": "explode", "input": {}}},
        ],
    },
    {
        "role": "user",
        "content": [
            {"toolResult": {"toolUseId": "t1", "content": [{"text": "12"}]}},
            {"toolResult": {"toolUseId": "t2", "content": [{"text": "it blew up"}], "status": "error"}},
        ],
    },
    {"role": "assistant", "content": [{"text": "It is 12."}]},
    {"role": "user", "content": [{"text": "Thanks."}, {"text": "And 2+2?"}]},
]


def test_the_conversation_in_openai_messages() -> None:
    assert to_openai_messages(CONVERSATION, "Be brief.") == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is the square root of 144?"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {
                    "id": "t1",
                    "type": "function",
                    "function": {"name": "calculator", "arguments": '{"expression": "sqrt(144)"}'},
                },
                {"id": "t2", "type": "function", "function": {"name": "explode", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "12"},
        {"role": "tool", "tool_call_id": "t2", "content": "Error: it blew up"},
        {"role": "assistant", "content": "It is 12."},
        {"role": "user", "content": "Thanks.\nAnd 2+2?"},
    ]


def test_tool_only_and_reasoning_only_assistant_messages() -> None:
    messages = [
        {"role": "assistant", "content": [{"toolUse": {"toolUseId": "a", "name": "f", "input": {"x": 1}}}]},
        {"role": "assistant", "content": [{"reasoningContent": {"reasoningText": {"text": "hm"}}}]},
        {"role": "user", "content": [{"toolResult": {"toolUseId": "a", "content": [{"json": {"v": 2}}]}}]},
    ]
    assert to_openai_messages(messages) == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "a", "content": '{"v": 2}'},
    ]


def test_the_request_body() -> None:
    provider = OpenAIProvider(
        base_url="http://gateway/api/v1/", model_id="anthropic.claude-3-haiku", api_key="k"
    )
    assert provider.url == "http://gateway/api/v1/chat/completions"
    spec = {"name": "calculator", "description": "Math.", "input_schema": {"type": "object"}}
    body = provider.request_body(
        ModelRequest(CONVERSATION[:1], system="S", tool_specs=(spec,), max_tokens=99)
    )
    assert body == {
        "model": "anthropic.claude-3-haiku",
        "messages": [
            {"role": "system", "content": "S"},
            {"role": "user", "content": "What is the square root of 144?"},
        ],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 99,
        "tools": to_openai_tools([spec]),
    }
    assert body["tools"] == [
        {
            "type": "function",
            "function": {"name": "calculator", "description": "Math.", "parameters": {"type": "object"}},
        }
    ]
    assert "tools" not in provider.request_body(ModelRequest(CONVERSATION[:1]))


# -- the provider over real HTTP -----------------------------------------------------------------


def _request(text: str) -> ModelRequest:
    return ModelRequest([{"role": "user", "content": [{"text": text}]}], max_tokens=500)


async def collect(provider: OpenAIProvider, text: str) -> tuple[list[Any], OpenAIStreamParser]:
    """Every chunk the provider yields for ``text``, fed through a parser."""
    parser = OpenAIStreamParser(turn=1)
    chunks: list[Any] = []
    async for chunk in provider.raw_stream(_request(text)):
        chunks.append(chunk)
        parser.feed(chunk)
    return chunks, parser


@pytest.fixture
async def provider(emulator_server: TestServer) -> AsyncIterator[OpenAIProvider]:
    """An OpenAIProvider pointed at the standalone emulator, with a short backoff."""
    made = OpenAIProvider(
        base_url=str(emulator_server.make_url("/v1")),
        model_id="emu-model",
        backoff_s=0.01,
        max_concurrent_runs=7,
    )
    yield made
    await made.close()


def emulator_records(server: TestServer, text: str) -> list[Any]:
    """The emulator's records of requests whose prompt is ``text``."""
    return [r for r in server.app[RECORDS_KEY].snapshot() if r.user_text == text]


async def test_provider_streams_from_the_emulator(
    provider: OpenAIProvider, emulator_server: TestServer
) -> None:
    chunks, parser = await collect(provider, "Tell me [emu:tokens=5]")
    assert chunks[-1] == DONE and isinstance(chunks[0], dict)
    result = parser.result()
    assert result.text == "Here is an answer to:"
    assert result.stop_reason == "end_turn" and result.usage.output_tokens == 5
    [record] = emulator_records(emulator_server, "Tell me [emu:tokens=5]")
    assert record.model_id == "emu-model" and record.outcome == "completed"
    assert provider.active_streams == 0


async def test_one_shared_session_sized_for_the_runs(provider: OpenAIProvider) -> None:
    await collect(provider, "one [emu:tokens=1]")
    session = provider._client()
    await asyncio.gather(collect(provider, "two [emu:tokens=1]"), collect(provider, "three [emu:tokens=1]"))
    assert provider._client() is session
    assert session.connector is not None and session.connector.limit == 7
    # Idle connections stay a minute, not aiohttp's 15 s: bursts of queries apart reuse them.
    assert session.connector._keepalive_timeout == POOL_IDLE_S >= 60


async def test_http_errors_are_retried_before_the_first_token(
    provider: OpenAIProvider, emulator_server: TestServer
) -> None:
    for status, attempts in ((503, 3), (429, 3), (500, 3), (400, 1), (404, 1)):
        text = f"x [emu:http={status}]"
        with pytest.raises(ProviderError) as caught:
            await collect(provider, text)
        assert caught.value.code == f"http_{status}"
        assert caught.value.retryable is (status in (429, 500, 503))
        assert f"HTTP {status}" in str(caught.value)
        assert len(emulator_records(emulator_server, text)) == attempts, status


async def test_a_drop_after_a_token_is_never_retried(
    provider: OpenAIProvider, emulator_server: TestServer
) -> None:
    text = "x [emu:disconnect] [emu:fail_after=2]"
    parser = OpenAIStreamParser(turn=1)
    with pytest.raises(ProviderError) as caught:
        async for chunk in provider.raw_stream(_request(text)):
            parser.feed(chunk)
    assert caught.value.code == "connection_error" and "lost mid-stream" in str(caught.value)
    assert parser.text_so_far() == "Here is"
    assert len(emulator_records(emulator_server, text)) == 1


async def test_a_drop_before_any_byte_of_the_body_is_retried(
    provider: OpenAIProvider, emulator_server: TestServer
) -> None:
    text = "x [emu:disconnect] [emu:fail_after=0]"
    with pytest.raises(ProviderError) as caught:
        await collect(provider, text)
    assert caught.value.code == "connection_error" and "before answering" in str(caught.value)
    assert len(emulator_records(emulator_server, text)) == 3


async def test_connection_refused() -> None:
    provider = OpenAIProvider(base_url=f"http://127.0.0.1:{free_port()}/v1", model_id="m", backoff_s=0.01)
    try:
        with pytest.raises(ProviderError) as caught:
            await collect(provider, "hello")
    finally:
        await provider.close()
    assert caught.value.code == "connection_error" and caught.value.retryable
    assert "Could not connect to the model endpoint" in str(caught.value)


async def test_read_timeout(emulator_server: TestServer) -> None:
    provider = OpenAIProvider(base_url=str(emulator_server.make_url("/v1")), model_id="m", read_timeout=0.2)
    text = "slow [emu:ttft=5000]"
    try:
        with pytest.raises(ProviderError) as caught:
            await collect(provider, text)
    finally:
        await provider.close()
    assert caught.value.code == "read_timeout"
    assert len(emulator_records(emulator_server, text)) == 1  # a slow model is not asked again


async def test_malformed_json_is_reported(provider: OpenAIProvider) -> None:
    with pytest.raises(ProviderError) as caught:
        await collect(provider, "x [emu:bad_json]")
    assert caught.value.code == "malformed_chunk" and "malformed JSON" in str(caught.value)


def _is_text(item: Any) -> bool:
    """True for the first sign of answer text: a chunk with content, or a TextDelta."""
    if isinstance(item, dict):
        return bool(item["choices"] and item["choices"][0]["delta"].get("content"))
    return isinstance(item, TextDelta)


@pytest.mark.parametrize("method", ["raw_stream", "stream"])
async def test_closing_the_iterator_closes_the_response_at_once(
    provider: OpenAIProvider, emulator_server: TestServer, method: str
) -> None:
    text = f"A long story via {method} [emu:tokens=2000] [emu:tps=50]"
    stream = getattr(provider, method)(_request(text))
    async for item in stream:
        if _is_text(item):
            break
    await stream.aclose()
    assert provider.active_streams == 0
    store = emulator_server.app[RECORDS_KEY]
    record = await asyncio.to_thread(
        store.wait_for, lambda r: r.user_text == text and r.outcome == "client_closed", 1.0
    )
    assert record.deltas_sent < 2000


async def test_stream_yields_the_turns_events_then_its_result(provider: OpenAIProvider) -> None:
    items = [item async for item in provider.stream(_request("Tell me [emu:tokens=5]"), turn=2)]
    *events, result = items
    assert isinstance(result, TurnResult) and not any(isinstance(e, TurnResult) for e in events)
    assert [type(e) for e in events] == [TextDelta] * 5 and {e.turn for e in events} == {2}
    assert result.text == "".join(e.text for e in events) == "Here is an answer to:"
    assert result.stop_reason == "end_turn" and result.usage.output_tokens == 5
    assert provider.active_streams == 0


# A fake upstream for what the emulator never does: odd framing, other error bodies, headers.


class FakeUpstream:
    """A small OpenAI-compatible server whose answers a test sets, recording what it was sent."""

    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, str], dict[str, Any]]] = []
        self.answers: list[tuple[int, str, list[bytes]]] = []  # status, content type, body pieces

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """Record the request; answer with the next queued answer (the last one repeats)."""
        self.requests.append((dict(request.headers), await request.json()))
        status, content_type, pieces = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        response = web.StreamResponse(status=status, headers={"Content-Type": content_type})
        await response.prepare(request)
        for piece in pieces:
            await response.write(piece)
        await response.write_eof()
        return response


@pytest.fixture
async def fake(aiohttp_server: Any) -> AsyncIterator[tuple[FakeUpstream, OpenAIProvider]]:
    """A fake upstream and a provider with an API key pointed at it."""
    upstream = FakeUpstream()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", upstream.handle)
    server = await aiohttp_server(app)
    made = OpenAIProvider(
        base_url=str(server.make_url("/v1")), model_id="m", api_key="sk-test", backoff_s=0.01
    )
    yield upstream, made
    await made.close()


ODD_STREAM = [
    b": ping\r\n\r\nevent: completion\r\nid: 1\r\ndata:",
    b'{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\r',
    b'\n\r\ndata: {"choices":[{"index":0,"delta":{"content":"caf\xc3',
    b'\xa9"}}]}\r\n\r\ndata: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\r\n\r\n',
    b"data: [DONE]\r\n\r\n",
]


async def test_odd_but_valid_framing_over_http(fake: tuple[FakeUpstream, OpenAIProvider]) -> None:
    upstream, provider = fake
    upstream.answers = [(200, "text/event-stream", ODD_STREAM)]
    chunks, parser = await collect(provider, "hi")
    assert parser.result().text == "café" and chunks[-1] == DONE
    headers, body = upstream.requests[0]
    assert headers["Authorization"] == "Bearer sk-test"
    assert (
        body["stream"] is True and body["stream_options"] == {"include_usage": True} and body["model"] == "m"
    )


async def test_a_retry_that_cures_the_error(fake: tuple[FakeUpstream, OpenAIProvider]) -> None:
    upstream, provider = fake
    busy = (503, "application/json", [b'{"error": {"message": "busy", "type": "server_error"}}'])
    upstream.answers = [busy, busy, (200, "text/event-stream", ODD_STREAM)]
    _, parser = await collect(provider, "hi")
    assert parser.result().text == "café" and len(upstream.requests) == 3


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            b'{"error": {"message": "Rate limited", "type": "rate_limit_error"}}',
            "HTTP 429 (rate_limit_error): Rate limited",
        ),
        (
            b'{"error": {"message": "Slow down", "code": "rate_limit_exceeded"}}',
            "HTTP 429 (rate_limit_exceeded): Slow down",
        ),
        (b'{"message": "Too many tokens"}', "HTTP 429: Too many tokens"),
        (
            b'{"detail": "An error occurred (ThrottlingException)"}',
            "HTTP 429: An error occurred (ThrottlingException)",
        ),
        (b"<html>busy</html>", "HTTP 429: <html>busy</html>"),
    ],
)
async def test_error_bodies_of_every_usual_shape(
    fake: tuple[FakeUpstream, OpenAIProvider], body: bytes, expected: str
) -> None:
    upstream, provider = fake
    upstream.answers = [(429, "application/json", [body])]
    with pytest.raises(ProviderError) as caught:
        await collect(provider, "hi")
    assert expected in str(caught.value) and caught.value.code == "http_429" and caught.value.retryable
    assert len(upstream.requests) == 3


NESTED_LINE = b'data: {"choices":' + b'[{"a":' * 5000 + b"\n\n"


async def test_a_data_line_nested_too_deep_is_a_malformed_chunk(
    fake: tuple[FakeUpstream, OpenAIProvider],
) -> None:
    upstream, provider = fake
    upstream.answers = [(200, "text/event-stream", [ODD_STREAM[0], ODD_STREAM[1], NESTED_LINE])]
    with pytest.raises(ProviderError) as caught:
        await collect(provider, "hi")
    assert caught.value.code == "malformed_chunk" and "nested" in str(caught.value)
    assert len(upstream.requests) == 1


async def test_an_error_body_nested_too_deep_is_read_as_text(
    fake: tuple[FakeUpstream, OpenAIProvider],
) -> None:
    upstream, provider = fake
    upstream.answers = [(429, "application/json", [b'{"error":' + b"[" * 5000])]
    with pytest.raises(ProviderError) as caught:
        await collect(provider, "hi")
    assert caught.value.code == "http_429" and 'HTTP 429: {"error":[[[' in str(caught.value)


async def test_unauthorised_names_the_key_setting(fake: tuple[FakeUpstream, OpenAIProvider]) -> None:
    upstream, provider = fake
    upstream.answers = [
        (401, "application/json", [b'{"error": {"message": "bad key", "type": "authentication_error"}}'])
    ]
    with pytest.raises(ProviderError) as caught:
        await collect(provider, "hi")
    assert "AGENT_OPENAI_API_KEY" in str(caught.value) and not caught.value.retryable
    assert len(upstream.requests) == 1


# -- the service on the openai provider ----------------------------------------------------------


@pytest.fixture
async def openai_client(make_client: ClientFactory) -> TestClient:
    """The service with AGENT_PROVIDER=openai on the embedded emulator's OpenAI route."""
    return await make_client(provider="openai", openai_base_url="emulator")


def _types(events: list[dict[str, Any]]) -> list[str]:
    return [event["type"] for event in events]


def _text(events: list[dict[str, Any]]) -> str:
    return "".join(event["text"] for event in events if event["type"] == "text_delta")


def _records(client: TestClient, text: str) -> list[Any]:
    return [r for r in services_of(client).emulator.records() if r.user_text == text]


async def test_square_root_gives_the_same_events_as_the_bedrock_wire(
    make_client: ClientFactory, openai_client: TestClient
) -> None:
    bedrock_client = await make_client()
    question = "What is the square root of 144?"
    over_openai = await stream_agent(openai_client, question)
    over_bedrock = await stream_agent(bedrock_client, question)
    assert services_of(openai_client).provider.name == "openai"
    assert _types(over_openai) == _types(over_bedrock)
    assert _text(over_openai) == _text(over_bedrock) == "The square root of 144 is 12."
    done = over_openai[-1]
    assert done["turns"] == 2 and done["stop_reason"] == "end_turn"
    assert [(c["tool"], c["input"]) for c in done["tool_calls"]] == [
        ("calculator", {"expression": "sqrt(144)"})
    ]
    assert done["usage"]["input_tokens"] > 0 and done["usage"]["output_tokens"] > 0
    result = next(e for e in over_openai if e["type"] == "tool_result")
    assert result["result"] == "12" and result["id"] == over_openai[0]["id"]


async def test_text_only_answer(openai_client: TestClient) -> None:
    events = await stream_agent(openai_client, "Tell me about streams [emu:tokens=7]")
    assert _types(events) == ["text_delta"] * 7 + ["done"]
    assert events[-1]["turns"] == 1 and events[-1]["usage"]["output_tokens"] == 7


async def test_max_tokens_marks_done_truncated(openai_client: TestClient) -> None:
    events = await stream_agent(openai_client, "Talk a lot [emu:max_tokens]")
    assert events[-1]["type"] == "done" and events[-1]["truncated"] is True
    assert events[-1]["stop_reason"] == "max_tokens"


async def test_two_tool_calls(openai_client: TestClient) -> None:
    events = await stream_agent(openai_client, "Two sums please [emu:tools=2]")
    starts = [e["id"] for e in events if e["type"] == "tool_use_start"]
    results = {e["id"]: e["result"] for e in events if e["type"] == "tool_result"}
    assert len(starts) == 2 and set(results) == set(starts) and sorted(results.values()) == ["2", "4"]
    assert events[-1]["type"] == "done" and events[-1]["turns"] == 2
    assert _text(events) == "The results are 2 and 4."


async def test_a_failed_tool_reaches_the_model_as_an_error(openai_client: TestClient) -> None:
    events = await stream_agent(openai_client, "Use a tool [emu:tool=explode]")
    assert next(e for e in events if e["type"] == "tool_result")["is_error"] is True
    assert "The tool failed" in _text(events) and events[-1]["type"] == "done"


async def test_reasoning_is_streamed(openai_client: TestClient) -> None:
    events = await stream_agent(openai_client, "What is the square root of 144? [emu:reasoning]")
    types = _types(events)
    assert "reasoning_delta" in types and types.index("reasoning_delta") < types.index("tool_use_start")
    assert events[-1]["type"] == "done" and events[-1]["turns"] == 2


@pytest.mark.slow
@pytest.mark.parametrize(
    ("directive", "code", "words", "attempts"),
    [
        ("[emu:http=503]", "http_503", "HTTP 503", 3),
        ("[emu:http=429]", "http_429", "HTTP 429 (rate_limit_error): Too many requests", 3),
        ("[emu:http=400]", "http_400", "HTTP 400", 1),
        ("[emu:throttle]", "throttlingException", "error mid-stream (throttlingException)", 1),
        ("[emu:fail=modelStreamErrorException]", "modelStreamErrorException", "The model stream failed", 1),
        ("[emu:throttle] [emu:fail_after=0]", "throttlingException", "Too many requests", 3),
        ("[emu:disconnect]", "connection_error", "lost mid-stream", 1),
        (
            "[emu:disconnect] [emu:fail_after=0]",
            "connection_error",
            "closed the connection before answering",
            3,
        ),
        ("[emu:bad_json]", "malformed_chunk", "malformed JSON", 1),
        ("[emu:no_done]", "incomplete_stream", "without a finish_reason or [DONE]", 1),
    ],
)
async def test_each_failure_is_a_clear_error_event_and_the_next_request_works(
    openai_client: TestClient, directive: str, code: str, words: str, attempts: int
) -> None:
    message = f"Say something {directive}"
    events = await stream_agent(openai_client, message)
    error = events[-1]
    assert error["type"] == "error" and error["code"] == code and error["turns"] == 1
    assert words in error["error"]
    assert _types(events).count("error") == 1
    # Retries happen only before the first token: the emulator saw exactly this many attempts.
    assert len(_records(openai_client, message)) == attempts
    again = await stream_agent(openai_client, "Say something else [emu:tokens=3]")
    assert _types(again) == ["text_delta"] * 3 + ["done"]


async def test_read_timeout_is_an_error_event(make_client: ClientFactory) -> None:
    client = await make_client(provider="openai", openai_base_url="emulator", bedrock_read_timeout_s=0.3)
    events = await stream_agent(client, "Too slow [emu:ttft=5000]")
    assert _types(events) == ["error"] and events[0]["code"] == "read_timeout"
    assert "no data within the read timeout" in events[0]["error"]
    assert (await stream_agent(client, "Quick [emu:tokens=2]"))[-1]["type"] == "done"


@pytest.mark.slow
async def test_an_unreachable_endpoint_is_an_error_event(make_client: ClientFactory) -> None:
    client = await make_client(provider="openai", openai_base_url=f"http://127.0.0.1:{free_port()}/v1")
    events = await stream_agent(client, "Anyone there?")
    assert _types(events) == ["error"] and events[0]["code"] == "connection_error"
    assert (
        "Could not connect to the model endpoint" in events[0]["error"] and events[0]["recoverable"] is True
    )
    async with client.post("/agent/run", json={"message": "Still nobody?"}) as response:
        assert response.status == 503 and (await response.json())["code"] == "connection_error"


async def test_fr002_tokens_arrive_one_by_one(openai_client: TestClient) -> None:
    message = "Tell a story [emu:tokens=20] [emu:tps=40]"
    words = answer_words("Tell a story", 20)
    expected = [word if i == 0 else f" {word}" for i, word in enumerate(words)]
    emulator = services_of(openai_client).emulator
    texts: list[str] = []
    async with openai_client.post("/agent/stream", json={"message": message}) as response:
        async for event in sse_events(response):
            data = event["data"]
            if data["type"] != "text_delta":
                continue
            if not texts:
                received_at = time.monotonic()
                record = await asyncio.to_thread(
                    emulator.wait_for, lambda r: r.user_text == message and r.first_token_at is not None, 1.0
                )
                # The first token reached the client while the emulator was still writing the answer,
                assert record.deltas_sent < 20
                # and within SC-001's 100 ms of the emulator writing it.
                assert received_at - record.first_token_at < 0.1
            texts.append(data["text"])
    # Each text_delta is exactly one emulator token: nothing merged, nothing split.
    assert texts == expected


async def test_run_and_sessions_work_on_the_openai_provider(openai_client: TestClient) -> None:
    async with openai_client.post(
        "/agent/run", json={"message": "What is the square root of 144?"}
    ) as response:
        assert response.status == 200
        body = await response.json()
    assert body["response"] == "The square root of 144 is 12." and body["turns"] == 2
    async with openai_client.post("/sessions") as response:
        session_id = (await response.json())["id"]
    async with openai_client.post(
        f"/sessions/{session_id}/messages", json={"content": "What is 2 + 3 * 4?"}
    ) as response:
        assert response.status == 202
    async with openai_client.get(f"/sessions/{session_id}/events?last_event_id=0") as response:
        events = [event["data"] async for event in sse_events(response)]
    assert events[-1]["type"] == "done" and events[-1]["output"] == "The result is 14."
    async with openai_client.get(f"/sessions/{session_id}") as response:
        messages = (await response.json())["messages"]
    # The conversation stays in Bedrock's format whatever the provider.
    assert [list(block) for block in messages[1]["content"]] == [["toolUse"]]
    assert "toolResult" in messages[2]["content"][0]
