"""Bursts: what a subscriber is written for the tokens of one upstream read goes in one write.

The writes are seen on the wire: each write to a chunked response is one HTTP chunk, so the tests
read the responses over a plain socket and look at the chunks as they came.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer
from aiohttp_sse import sse_response

from service.core.burst import Burst, current_burst
from service.transports.stream.writes import BurstResponse, write_now
from tests.conftest import ClientFactory
from tests.transports.test_faults import bedrock_answer, deep_client, openai_answer

WORDS = [f"w{i} " for i in range(6)]


async def chunks_of(
    server: TestServer, method: str, path: str, body: dict[str, Any] | None = None
) -> list[bytes]:
    """Send a request over a plain socket; the response's HTTP chunks, one per write the server made."""
    reader, writer = await asyncio.open_connection(server.host, server.port)
    data = json.dumps(body).encode() if body is not None else b""
    writer.write(
        f"{method} {path} HTTP/1.1\r\nHost: {server.host}:{server.port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
        + data
    )
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    assert b"transfer-encoding: chunked" in head.lower(), head
    chunks = []
    while size := int((await reader.readuntil(b"\r\n"))[:-2], 16):
        chunks.append((await reader.readexactly(size + 2))[:-2])
    writer.close()
    await writer.wait_closed()
    return chunks


def texts_in(chunk: bytes) -> list[str]:
    """The text deltas of the agent dialect in one chunk, in order."""
    blocks = [line[6:] for line in chunk.split(b"\n") if line.startswith(b"data: ")]
    return [event["text"] for event in map(json.loads, blocks) if event["type"] == "text_delta"]


async def test_the_tokens_of_one_bedrock_read_reach_the_client_in_one_write(
    aiohttp_server: Any, make_client: ClientFactory, monkeypatch: Any
) -> None:
    # The whole answer is one small body: the provider reads its frames in one read.
    answer = bedrock_answer(
        *(("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": word}}) for word in WORDS)
    )
    client = await deep_client("bedrock", [answer], aiohttp_server, make_client, monkeypatch)
    chunks = await chunks_of(client.server, "POST", "/agent/stream", {"message": "hi"})
    with_text = [texts_in(chunk) for chunk in chunks if texts_in(chunk)]
    assert with_text == [WORDS]
    assert json.loads(chunks[-1].split(b"data: ")[-1])["type"] == "done"


async def test_the_tokens_of_one_openai_read_reach_the_client_in_one_write(
    aiohttp_server: Any, make_client: ClientFactory, monkeypatch: Any
) -> None:
    answer = openai_answer(*({"content": word} for word in WORDS))
    client = await deep_client("openai", [answer], aiohttp_server, make_client, monkeypatch)
    chunks = await chunks_of(client.server, "POST", "/agent/stream", {"message": "hi"})
    assert [texts_in(chunk) for chunk in chunks if texts_in(chunk)] == [WORDS]


# --- BurstResponse on its own: a handler that writes the way a log's deliver does ------------


async def burst_server(aiohttp_server: Any, write: Any) -> TestServer:
    """A server whose one stream runs ``write(request, response)`` and then ends."""

    async def handler(request: web.Request) -> web.StreamResponse:
        async with sse_response(request, response_cls=BurstResponse) as response:
            await write(request, response)
        return response

    app = web.Application()
    app.router.add_get("/s", handler)
    return await aiohttp_server(app)


async def test_what_a_burst_holds_goes_in_one_write_when_it_ends(aiohttp_server: Any) -> None:
    async def write(request: web.Request, response: BurstResponse) -> None:
        burst = Burst()
        assert current_burst() is burst
        assert write_now(request, response, b"data: a\n\n")
        assert write_now(request, response, b"data: b\n\n")
        burst.end()
        assert current_burst() is None
        assert write_now(request, response, b"data: c\n\n")  # no burst: written at once

    chunks = await chunks_of(await burst_server(aiohttp_server, write), "GET", "/s")
    assert chunks == [b"data: a\n\ndata: b\n\n", b"data: c\n\n"]


async def test_a_write_during_a_burst_sends_what_is_held_first(aiohttp_server: Any) -> None:
    # The handler's own write (a batch after a decline, a ping) comes before the burst ends: the
    # held bytes go first, in the same write, and the burst's end has nothing left to write.
    async def write(request: web.Request, response: BurstResponse) -> None:
        burst = Burst()
        assert write_now(request, response, b"data: a\n\n")
        await response.write(b"data: b\n\n")
        burst.end()
        await response.write(b"data: c\n\n")

    chunks = await chunks_of(await burst_server(aiohttp_server, write), "GET", "/s")
    assert chunks == [b"data: a\n\ndata: b\n\n", b"data: c\n\n"]


async def test_the_end_of_the_stream_sends_what_is_held(aiohttp_server: Any) -> None:
    async def write(request: web.Request, response: BurstResponse) -> None:
        Burst()  # never ended: the stream's end still writes what it held
        assert write_now(request, response, b"data: a\n\n")

    chunks = await chunks_of(await burst_server(aiohttp_server, write), "GET", "/s")
    assert chunks == [b"data: a\n\n"]


async def test_a_burst_is_its_own_tasks_alone(aiohttp_server: Any) -> None:
    # A task started inside the burst copies the context, burst included; its writes still go at once.
    async def write(request: web.Request, response: BurstResponse) -> None:
        burst = Burst()
        assert write_now(request, response, b"data: a\n\n")

        async def elsewhere() -> None:
            assert current_burst() is None
            assert write_now(request, response, b"data: b\n\n")

        await asyncio.create_task(elsewhere())
        assert response.held_size == 0  # its write went out, with what this task held before it
        burst.end()

    chunks = await chunks_of(await burst_server(aiohttp_server, write), "GET", "/s")
    assert chunks == [b"data: a\n\ndata: b\n\n"]


async def test_a_write_now_after_the_end_writes_nothing(aiohttp_server: Any) -> None:
    # The connection may carry the client's next request after the stream's end: a write handed
    # straight to the transport then would land in that response.
    async def write(request: web.Request, response: BurstResponse) -> None:
        assert write_now(request, response, b"data: a\n\n")
        await response.write_eof()
        assert not write_now(request, response, b"data: b\n\n")

    chunks = await chunks_of(await burst_server(aiohttp_server, write), "GET", "/s")
    assert chunks == [b"data: a\n\n"]


async def test_an_http_1_0_client_gets_the_events_unchunked(aiohttp_server: Any) -> None:
    # HTTP/1.0 has no chunked bodies: the stream is the bare events until the server closes it.
    async def write(request: web.Request, response: BurstResponse) -> None:
        Burst()
        assert write_now(request, response, b"data: a\n\n")  # held, then written at the end
        assert write_now(request, response, b"data: b\n\n")
        current_burst().end()  # type: ignore[union-attr]
        assert write_now(request, response, b"data: c\n\n")

    server = await burst_server(aiohttp_server, write)
    reader, writer = await asyncio.open_connection(server.host, server.port)
    writer.write(f"GET /s HTTP/1.0\r\nHost: {server.host}:{server.port}\r\n\r\n".encode())
    response = await reader.read()  # to the close
    writer.close()
    head, _, body = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200") and b"chunked" not in head.lower(), head
    assert body == b"data: a\n\ndata: b\n\ndata: c\n\n"


async def test_a_window_s_shared_write_keeps_the_order_of_what_is_held(aiohttp_server: Any) -> None:
    # write_shared writes a window's bytes framed once for every stream; with bytes held by a
    # burst it declines, and write_now sends the held bytes first.
    shared: dict[Any, Any] = {}

    async def write(request: web.Request, response: BurstResponse) -> None:
        transport = request.transport
        assert transport is not None
        burst = Burst()
        assert write_now(request, response, b"data: a\n\n")
        assert not response.write_shared(transport, b"data: b\n\n", shared)
        assert write_now(request, response, b"data: b\n\n")
        burst.end()
        window = b"data: c\n\n"
        assert response.write_shared(transport, window, shared)
        assert response.write_shared(transport, window, shared)
        assert list(shared.values()) == [b"9\r\ndata: c\n\n\r\n"]  # framed once
        await response.write_eof()
        assert not response.write_shared(transport, window, shared)

    chunks = await chunks_of(await burst_server(aiohttp_server, write), "GET", "/s")
    assert chunks == [b"data: a\n\ndata: b\n\n", b"data: c\n\n", b"data: c\n\n"]
