"""The one SSE writer (``stream.sse.serve``) with a projector of the test's own, on a real server:
what it writes first, how each entry reaches the client once and in order (written through as it
is appended, or as a batch when the socket cannot take it at once), and every ending."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiohttp import web

from service.app import create_app
from service.config import Settings
from service.core.direct import NO_COALESCING, Coalescing
from service.core.events import TextDelta
from service.core.log import LogEntry, MemoryEventLog
from service.transports.stream.follow import Ending, Stop
from service.transports.stream.frames import sse_block
from service.transports.stream.sse import Projector, serve
from service.transports.stream.writes import PINGS
from tests.conftest import TEST_SETTINGS

LOGS = web.AppKey("test_logs", dict)
PROJECTORS = web.AppKey("test_projectors", list)


class Recording(Projector):
    """Each entry's text as one block; ``pad`` makes every block that many bytes longer."""

    def __init__(self, pad: int = 0) -> None:
        self.pad = pad
        self.seen: list[int] = []

    def head(self) -> str:
        return sse_block('"head"')

    def frames(self, entry: LogEntry) -> bytes:
        self.seen.append(entry.id)
        text = entry.event.text  # type: ignore[attr-defined]
        return sse_block(json.dumps({"text": text, "pad": "x" * self.pad}), id=entry.id).encode()

    def holds(self, entry: LogEntry) -> bool:
        return entry.event.text == "pause"  # type: ignore[attr-defined]

    def stops(self, batch: list[LogEntry]) -> bytes | None:
        if batch[-1].event.text != "pause":  # type: ignore[attr-defined]
            return None
        return sse_block('"paused"').encode()

    def end(self, ending: Ending | None) -> str:
        return sse_block(json.dumps({"ending": None if ending is None else ending.reason}))


async def _stream(request: web.Request) -> web.StreamResponse:
    log = request.app[LOGS][request.match_info["name"]]
    projector = Recording(int(request.query.get("pad", "0")))
    request.app[PROJECTORS].append(projector)
    return await serve(
        request, projector, log, transport="test", stop=Stop.NEVER, retry="retry" in request.query
    )


async def _client(aiohttp_client: Any, **logs: MemoryEventLog) -> Any:
    app = create_app(Settings(**{**TEST_SETTINGS, "sse_retry_ms": 1234}))
    app[LOGS] = logs
    app[PROJECTORS] = []
    app.router.add_get("/test/{name}", _stream)
    return await aiohttp_client(app)


def _blocks(raw: bytes) -> list[list[str]]:
    return [block.split("\r\n") for block in raw.decode().split("\r\n\r\n") if block]


async def _read_blocks(response: Any, count: int) -> list[list[str]]:
    """Read until ``count`` blocks came (pings aside)."""
    raw = b""
    while len([b for b in _blocks(raw) if not b[0].startswith(":")]) < count:
        raw += await response.content.readany()
    return [b for b in _blocks(raw) if not b[0].startswith(":")]


# Entries written through one at a time, or held for a window and written together.
WINDOWS = pytest.mark.parametrize(
    "coalescing", [NO_COALESCING, Coalescing(max_window_s=0.02, per_subscriber_s=1.0)], ids=["each", "window"]
)


@WINDOWS
async def test_the_head_comes_first_with_the_retry_hint_then_each_entry_once_in_order(
    aiohttp_client: Any, coalescing: Coalescing
) -> None:
    log = MemoryEventLog(coalescing=coalescing)
    client = await _client(aiohttp_client, a=log)
    async with client.get("/test/a?retry") as response:
        head = await _read_blocks(response, 1)
        assert head == [['data: "head"', "retry: 1234"]]
        for n in range(1, 51):
            await log.append(TextDelta(text=f"t{n}"))
        await log.append(TextDelta(text="pause"))
        blocks = (await response.read()).decode()
    datas = [line for line in blocks.split("\r\n") if line.startswith("data: ")]
    texts = [json.loads(line[6:]).get("text") for line in datas[:-2]]
    assert texts == [f"t{n}" for n in range(1, 51)] + ["pause"]
    assert datas[-2:] == ['data: "paused"', 'data: {"ending": null}']
    assert blocks.count("retry:") == 0  # it went with the first frame only
    assert client.server.app[PROJECTORS][0].seen == list(range(1, 52))


@WINDOWS
async def test_an_entry_the_socket_cannot_take_at_once_is_projected_once_and_still_written(
    aiohttp_client: Any, coalescing: Coalescing
) -> None:
    # Each block is over the bytes a write-through may hand the socket: the first live entry (or
    # window) is refused there, and comes again, with those appended meanwhile, as the handler's
    # batch.
    log = MemoryEventLog(coalescing=coalescing)
    client = await _client(aiohttp_client, a=log)
    async with client.get("/test/a?pad=40000") as response:
        await _read_blocks(response, 1)
        for n in range(1, 6):
            await log.append(TextDelta(text=f"t{n}"))
        await log.append(TextDelta(text="pause"))
        body = (await response.read()).decode()
    texts = [
        json.loads(line[6:]).get("text") for line in body.split("\r\n") if line.startswith('data: {"text')
    ]
    assert texts == ["t1", "t2", "t3", "t4", "t5", "pause"]
    assert client.server.app[PROJECTORS][0].seen == [1, 2, 3, 4, 5, 6]


async def test_a_log_closed_under_the_stream_is_its_ending(aiohttp_client: Any) -> None:
    log = MemoryEventLog()
    client = await _client(aiohttp_client, a=log)
    async with client.get("/test/a") as response:
        await _read_blocks(response, 1)
        await log.append(TextDelta(text="t1"))
        await log.close()
        body = (await response.read()).decode()
    assert body.rstrip().endswith('data: {"ending": "closed"}')
    assert '"text": "t1"' in body


async def test_a_window_of_entries_is_written_through_in_one_write_each_projected_once(
    aiohttp_client: Any,
) -> None:
    log = MemoryEventLog(coalescing=Coalescing(max_window_s=0.02, per_subscriber_s=1.0))
    client = await _client(aiohttp_client, a=log)
    async with client.get("/test/a") as response:
        await _read_blocks(response, 1)
        await log.wait_subscribers(1)
        for n in range(1, 6):
            await log.append(TextDelta(text=f"t{n}"))
        # The five come from the window, each projected once (see the end).
        raw = b""
        while raw.count(b"\r\n\r\n") < 5:
            raw += await response.content.readany()
        datas = [line[6:] for block in _blocks(raw) for line in block if line.startswith("data: ")]
        assert [json.loads(data)["text"] for data in datas] == [f"t{n}" for n in range(1, 6)]
        for n in range(6, 8):
            await log.append(TextDelta(text=f"t{n}"))
        await log.append(TextDelta(text="pause"))
        rest = (await response.read()).decode()
    texts = [
        json.loads(line[6:]).get("text") for line in rest.split("\r\n") if line.startswith('data: {"text')
    ]
    assert texts == ["t6", "t7", "pause"]
    assert client.server.app[PROJECTORS][0].seen == list(range(1, 9))


async def test_idle_streams_are_pinged_from_one_timer_and_let_go_when_they_close(
    aiohttp_client: Any,
) -> None:
    app = create_app(Settings(**{**TEST_SETTINGS, "sse_ping_interval_s": 0.05}))
    app[LOGS] = {"a": MemoryEventLog(), "b": MemoryEventLog()}
    app[PROJECTORS] = []
    app.router.add_get("/test/{name}", _stream)
    client = await aiohttp_client(app)
    first = await client.get("/test/a")
    second = await client.get("/test/b")
    for response in (first, second):
        raw = b""
        while b": ping\r\n\r\n" not in raw:  # nothing was appended: only the pings come
            raw += await response.content.readany()
    (pings,) = app[PINGS].values()  # one pinger for the interval, with both streams
    assert len(pings._streams) == 2 and pings._handle is not None
    for response in (first, second):
        response.close()
    async with asyncio.timeout(5):  # the handlers end once they see the clients gone
        while pings._streams:
            await asyncio.sleep(0)
    assert pings._handle is None  # no timer left for no one
