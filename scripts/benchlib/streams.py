"""The benchmark clients' reads, on the one client-side SSE reader (``service/loadtest/sse.py``).

A benchmark client reads hundreds of streams at once and must stay cheaper than the server it
measures: the replays count frame ends or ``id:`` lines in the raw bytes and parse nothing. One
count keeps the cost it always had (:func:`count_id_lines`), because figures were published with it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp

from service.loadtest.sse import MarkCounter, read_batches

FRAME_END = b"\r\n\r\n"  # aiohttp-sse's and sse-starlette's separator is CRLF


async def count_frames(content: aiohttp.StreamReader) -> int:
    """Read a stream to its end, counting SSE frame ends."""
    counter, count = MarkCounter(FRAME_END), 0
    while chunk := await content.readany():
        count += counter.feed(chunk)
    return count


async def count_id_lines(content: aiohttp.StreamReader) -> int:
    """Read a stream to its end line by line, counting ``id:`` lines.

    Some ten times the client CPU of a :class:`MarkCounter`: ``bench_ws.py`` and ``bench_fanout.py``
    replay with it, as they always have, since the figures they report (and the README quotes) are
    bound by this client; counting cheaper would make the same service look faster.
    """
    count = 0
    async for line in content:
        if line.startswith(b"id:"):
            count += 1
    return count


async def sse_replay(
    http: aiohttp.ClientSession,
    url: str,
    headers: dict[str, str],
    count: Callable[[aiohttp.StreamReader], Awaitable[int]] = count_frames,
) -> int:
    """One SSE replay to its end; the number of events (by ``count``)."""
    async with http.get(url, headers=headers) as response:
        if response.status != 200:
            raise RuntimeError(f"{url}: HTTP {response.status}")
        return await count(response.content)


async def ws_replay(http: aiohttp.ClientSession, url: str, session_id: str) -> int:
    """One WebSocket replay from the start until ``done``; the number of events (frames with an id)."""
    count = 0
    subscribe = json.dumps({"type": "subscribe", "session_id": session_id, "last_event_id": 0})
    async with http.ws_connect(url, heartbeat=None, compress=0) as ws:
        await ws.send_str(subscribe)
        async for message in ws:
            if message.type != aiohttp.WSMsgType.TEXT:
                break
            if '"id":' in message.data:
                count += 1
                if '"type":"done"' in message.data:
                    break
    return count


async def open_idle_sse(http: aiohttp.ClientSession, urls: list[str], n: int) -> list[aiohttp.ClientResponse]:
    """``n`` SSE streams over ``urls`` (round robin), each having sent its first line."""

    async def one(i: int) -> aiohttp.ClientResponse:
        response = await http.get(urls[i % len(urls)])
        await response.content.readline()  # the first line arrived: the stream is set up
        return response

    responses: list[aiohttp.ClientResponse] = []
    for start in range(0, n, 1000):
        responses += await asyncio.gather(*(one(i) for i in range(start, min(n, start + 1000))))
    return responses


async def open_idle_ws(
    http: aiohttp.ClientSession, url: str, session_id: str, n: int
) -> list[aiohttp.ClientWebSocketResponse]:
    """``n`` WebSockets, each subscribed to an idle session (two frames back: subscribed, status)."""
    subscribe = json.dumps({"type": "subscribe", "session_id": session_id})

    async def one() -> aiohttp.ClientWebSocketResponse:
        ws = await http.ws_connect(url, heartbeat=None, compress=0)
        await ws.send_str(subscribe)
        for _ in range(2):
            await ws.receive()
        return ws

    sockets: list[aiohttp.ClientWebSocketResponse] = []
    for start in range(0, n, 500):
        sockets += await asyncio.gather(*(one() for _ in range(min(500, n - start))))
    return sockets


@dataclass
class AgentRun:
    """One ``POST /agent/stream`` as the client saw it (``time.monotonic()`` throughout)."""

    message: str
    agent: str | None = None  # the named agent to run (``"agent"`` in the body); None: the default
    started: float = 0.0
    tokens: list[float] = field(default_factory=list)  # when each text token arrived
    first_event: float = 0.0
    finished: float = 0.0
    events: int = 0
    last_type: str | None = None

    @property
    def ok(self) -> bool:
        """It ended with ``done``."""
        return self.last_type == "done"


async def agent_stream(http: aiohttp.ClientSession, url: str, run: AgentRun) -> AgentRun:
    """``POST /agent/stream`` with ``run.message``; when each event and text token arrived."""
    run.started = time.monotonic()
    last = ""
    body = {"message": run.message} if run.agent is None else {"message": run.message, "agent": run.agent}
    async with http.post(url + "/agent/stream", json=body) as response:
        response.raise_for_status()
        async for batch in read_batches(response.content):
            if not batch:
                continue
            at = time.monotonic()
            if not run.first_event:
                run.first_event = at
            run.events += len(batch)
            for _, _, data in batch:
                if '"text_delta"' in data:
                    run.tokens.append(at)
            last = batch[-1][2]
    run.finished = time.monotonic()
    run.last_type = json.loads(last)["type"] if last else None
    return run
