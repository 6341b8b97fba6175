"""The client side of the scale-out scenarios: SSE subscribers that count or time what they read,
and the service calls that check it."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

import aiohttp

from scaleout.cluster import ClusterMeter
from service.loadtest.sse import MarkCounter, read_batches

T = TypeVar("T")


async def ending(http: aiohttp.ClientSession, url: str, session_id: str, last: int) -> str:
    """How the session's query ended: ``done``, or ``error:<code>``, from its last event."""
    async with http.get(
        url + f"/sessions/{session_id}/events/poll?since_index={last - 1}&limit=1"
    ) as response:
        events = (await response.json())["events"]
    if not events:
        return "none"
    event = events[-1]
    return event["type"] if event["type"] != "error" else f"error:{event.get('code')}"


async def text_events(http: aiohttp.ClientSession, url: str, session_id: str, after: int) -> int:
    """How many ``assistant_text`` events the session logged after ``after``."""
    async with http.get(
        url + f"/sessions/{session_id}/events/poll?since_index={after}&limit=100000"
    ) as response:
        body = await response.json()
    return sum(1 for event in body["events"] if event["type"] == "assistant_text")


class Reading:
    """What one subscriber read."""

    __slots__ = ("status", "body", "events", "first_text", "last_read", "connected", "latencies", "texts")

    def __init__(self) -> None:
        self.status = 0
        self.body = ""
        self.events = 0
        self.first_text: float | None = None
        self.last_read: float | None = None
        self.connected: float | None = None
        self.latencies: list[float] = []
        self.texts = 0


async def count_stream(response: aiohttp.ClientResponse, reading: Reading) -> None:
    """Count the events of an SSE stream from raw chunks (``id:`` lines), parsing nothing."""
    ids = MarkCounter(b"\nid:", start=b"\n")  # the first line is read already: a line starts here
    while chunk := await response.content.readany():
        now = time.time()
        reading.events += ids.feed(chunk)
        if reading.first_text is None and b"assistant_text" in chunk:
            reading.first_text = now
        reading.last_read = now


async def parse_stream(response: aiohttp.ClientResponse, reading: Reading) -> None:
    """Read an SSE stream event by event: latency of every ``assistant_text`` event."""
    async for batch in read_batches(response.content):
        now = time.time()
        for name, event_id, data in batch:
            if event_id is not None:
                reading.events += 1
            if name == "assistant_text":
                reading.latencies.append((now - json.loads(data)["ts"]) * 1000)
                reading.texts += 1
                if reading.first_text is None:
                    reading.first_text = now
                reading.last_read = now


async def subscribe(
    http: aiohttp.ClientSession,
    url: str,
    session_id: str,
    after: int | None,
    parse: bool,
    gate: asyncio.Semaphore,
) -> Reading:
    """One SSE subscriber, to the end of the stream.

    ``gate`` bounds how many subscribers are setting up at once (request sent, first line not yet
    read); past that a subscriber costs the service no Redis call of its own.
    """
    reading = Reading()
    headers = {"Last-Event-ID": str(after)} if after is not None else {}
    async with gate:
        response = await http.get(url + f"/sessions/{session_id}/events", headers=headers)
        reading.status = response.status
        if response.status == 200:
            reading.connected = time.time()
            if (await response.content.readline()).startswith(b"id:"):  # a frame starts with id: or event:
                reading.events += 1
    async with response:
        if response.status != 200:
            reading.body = (await response.text())[:300]
            return reading
        await (parse_stream if parse else count_stream)(response, reading)
    return reading


def setup_gate(args: argparse.Namespace) -> asyncio.Semaphore:
    """How many subscribers may be setting up at once (``--connect-concurrency``; 0: no bound)."""
    return asyncio.Semaphore(args.connect_concurrency if args.connect_concurrency > 0 else 1_000_000)


async def gated(gate: asyncio.Semaphore, awaitable: Awaitable[T]) -> T:
    """``awaitable``, once ``gate`` lets it through."""
    async with gate:
        return await awaitable


def refusals(readings: list[Reading]) -> dict[str, Any]:
    """Subscribers that got no stream: how many per status, and one answer of each."""
    counts: dict[str, int] = {}
    samples: dict[str, str] = {}
    for r in readings:
        if r.status != 200:
            counts[str(r.status)] = counts.get(str(r.status), 0) + 1
            samples.setdefault(str(r.status), r.body)
    return {
        "non_200_subscribers": sum(counts.values()),
        "non_200_by_status": counts,
        "non_200_sample": samples,
    }


def costs(meter: ClusterMeter, delivered: int) -> dict[str, Any]:
    """What the measurement cost the service and Redis, per delivered event, and the client's load."""
    per = 1e6 / delivered if delivered else 0.0
    return {
        "service_cpu_s": round(meter.server_cpu, 3),
        "service_cpu_us_per_event": round(meter.server_cpu * per, 2),
        "redis_cpu_s": None if meter.redis_cpu is None else round(meter.redis_cpu, 3),
        "redis_cpu_us_per_event": None if meter.redis_cpu is None else round(meter.redis_cpu * per, 2),
        "client_cpu": round(meter.client_cpu / meter.wall, 2),
    }
