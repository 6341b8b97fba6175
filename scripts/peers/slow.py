"""Scenario 6: a subscriber that never reads, among normal ones, on a long unpaced answer: what it
costs the service (memory, the others' latency) and whether the service lets it go."""

from __future__ import annotations

import asyncio
import re
import socket
import time
from typing import Any

import aiohttp
from benchlib.api import client_session, new_session
from benchlib.procs import Meter, rss_bytes
from benchlib.stats import med, percentile, ratio
from benchlib.streams import FRAME_END, count_frames

from peers.config import NO_MERGE, Config, service_stack
from service.loadtest.sse import FrameSplitter


async def connect_many(
    http: aiohttp.ClientSession, url: str, n: int, batch: int = 250
) -> list[aiohttp.ClientResponse]:
    """Open ``n`` SSE streams (in batches: the listen backlogs are small); each has its headers."""
    responses: list[aiohttp.ClientResponse] = []
    for start in range(0, n, batch):
        responses += await asyncio.gather(*(http.get(url) for _ in range(min(batch, n - start))))
    bad = [r.status for r in responses if r.status != 200]
    if bad:
        for response in responses:
            response.close()
        raise RuntimeError(f"{url}: {len(bad)} streams refused (HTTP {bad[0]})")
    return responses


# A text event's ``ts`` in a data line (JSON strings escape their quotes, so text cannot fake it).
TEXT_TS = re.compile(rb'"type":"assistant_text"[^\n]*?"ts":([0-9.]+)')


async def parse_frames(content: aiohttp.StreamReader, latencies: list[float]) -> tuple[int, int]:
    """Read a stream to its end; the latency of every text event (the client's clock when the read
    that completed its frame returned, minus its ``ts``); its frames and its text events."""
    frames = texts = 0
    splitter = FrameSplitter(FRAME_END)
    while chunk := await content.readany():
        now = time.time()
        complete = splitter.feed(chunk)
        if not complete:
            continue
        frames += complete.count(FRAME_END)
        for match in TEXT_TS.finditer(complete):
            latencies.append((now - float(match.group(1))) * 1000)
            texts += 1
    return frames, texts


async def read_live(
    responses: list[aiohttp.ClientResponse], parsed: int
) -> tuple[list[int], list[float], list[int]]:
    """Read every stream to its end: every k-th parses and times text events (latency from the
    event's ``ts``), the rest count frames.

    The frames of every stream, the latencies of the parsed text events, and how many text events
    each parsing stream had.
    """
    latencies: list[float] = []
    texts: list[int] = []
    step = max(1, len(responses) // parsed)

    async def parse(response: aiohttp.ClientResponse) -> int:
        frames, text = await parse_frames(response.content, latencies)
        texts.append(text)
        return frames

    async def one(index: int, response: aiohttp.ClientResponse) -> int:
        try:
            return await (parse(response) if index % step == 0 else count_frames(response.content))
        finally:
            response.release()

    counts = await asyncio.gather(*(one(i, r) for i, r in enumerate(responses)))
    return list(counts), latencies, texts


def stalled_reader(port: int, path: str) -> socket.socket:
    """A client that sends its request and then never reads (a tiny receive buffer)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)  # before connect: sets the window
    sock.connect(("127.0.0.1", port))
    sock.sendall(
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: text/event-stream\r\n\r\n".encode()
    )
    return sock


async def slow_round(cfg: Config, with_slow: bool, tag: str) -> dict[str, Any]:
    """A fresh service, one unpaced long answer to the normal subscribers (and the stalled one)."""
    # The answer is longer than a model turn's default token cap (4096). Delta merging is off: a
    # stalled reader's merged backlog is small enough to sit in the kernel's socket buffers, and
    # the point is a backlog that reaches the service.
    env = {"AGENT_MAX_TOKENS": str(max(4096, cfg.slow_tokens + 100)), **NO_MERGE}
    async with service_stack(cfg, env) as stack, client_session() as http:
        message = f"slow {tag} [emu:tokens={cfg.slow_tokens}] [emu:ttft=2000]"  # unpaced after 2 s
        session_id = await new_session(http, stack.url, message)
        path = f"/sessions/{session_id}/events"
        responses = await connect_many(http, stack.url + path, cfg.slow_subscribers)
        slow = stalled_reader(stack.port, path) if with_slow else None
        await asyncio.sleep(0.2)
        before = rss_bytes(stack.pid)
        peak = before
        sampling = True

        async def sample() -> None:
            nonlocal peak
            while sampling:
                peak = max(peak, rss_bytes(stack.pid))
                await asyncio.sleep(0.05)

        sampler = asyncio.create_task(sample())
        with Meter(stack.pid) as meter:
            counts, latencies, _ = await read_live(responses, cfg.slow_parsed)
        sampling = False
        await sampler
        await asyncio.sleep(0.5)  # what the service still holds once the others are done
        after = rss_bytes(stack.pid)
        ended = time.monotonic()
        async with http.get(stack.url + f"/sessions/{session_id}") as response:
            last_id = (await response.json())["last_event_id"]
        async with http.get(stack.emulator_url + "/_emulator/records") as response:
            record = next(r for r in await response.json() if r["user_text"] == message)
        # Streams the service still holds once the normal readers are done: the stalled one, if
        # its writes are still blocked (rather than all of it sitting in socket buffers).
        async with http.get(stack.url + "/metrics") as response:
            metrics = await response.text()
        still_open = sum(
            float(line.rsplit(" ", 1)[1])
            for line in metrics.splitlines()
            if line.startswith('agentstream_connections{transport="sse"}')
        )
        if slow is not None:
            slow.close()
    delivered = sum(counts)
    return {
        "with_slow_reader": with_slow,
        "events_in_log": last_id,
        "p50_ms": percentile(latencies, 0.5),
        "p99_ms": percentile(latencies, 0.99),
        "max_ms": max(latencies),
        "answer_s": ended - (record["first_token_at"] or ended),
        "streams_open_after": still_open,
        "rss_growth_bytes": after - before,
        "rss_peak_growth_bytes": max(peak, after) - before,
        "cpu_us_per_delivery": meter.server_cpu / delivered * 1e6,
        "server_busy": meter.server_cpu / meter.wall,
        "client_busy": meter.client_cpu / meter.wall,
    }


async def scenario_slow(cfg: Config) -> dict[str, Any]:
    """Normal subscribers with and without a stalled one, alternating, a fresh service each."""
    runs: dict[str, list[dict[str, Any]]] = {"without": [], "with": []}
    for round_no in range(cfg.rounds):
        runs["without"].append(await slow_round(cfg, False, f"r{round_no}_without"))
        runs["with"].append(await slow_round(cfg, True, f"r{round_no}_with"))
    result: dict[str, Any] = {
        "subscribers": cfg.slow_subscribers,
        "parsed_subscribers": cfg.slow_parsed,
        "tokens": cfg.slow_tokens,
        "rounds": cfg.rounds,
        "merge_deltas_after": "off",
    }
    for name, r in runs.items():
        result[name] = {
            key: round(med(r, key), 2)
            for key in (
                "events_in_log",
                "p50_ms",
                "p99_ms",
                "max_ms",
                "answer_s",
                "rss_growth_bytes",
                "rss_peak_growth_bytes",
                "cpu_us_per_delivery",
                "server_busy",
                "client_busy",
                "streams_open_after",
            )
        }
        result[name]["rounds_p99_ms"] = [round(x["p99_ms"], 1) for x in r]
    result["ratios"] = {
        "with/without p99": ratio(result["with"]["p99_ms"], result["without"]["p99_ms"]),
        "with/without rss_peak_growth": ratio(
            result["with"]["rss_peak_growth_bytes"], result["without"]["rss_peak_growth_bytes"]
        ),
    }
    return result
