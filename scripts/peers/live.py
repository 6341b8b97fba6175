"""Scenario 3: one paced answer to 100, 1,000 and 5,000 SSE subscribers (the service, its baseline,
bare aiohttp-sse and FastAPI broadcasting the same events): latency, CPU per delivery, keeping up."""

from __future__ import annotations

import asyncio
import contextlib
import re
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from benchlib.api import client_session, fill_session, new_session, poll_all
from benchlib.procs import Meter, wait_until_up
from benchlib.stack import ServiceStack
from benchlib.stats import med, percentile, ratio
from benchlib.streams import FRAME_END, count_frames

from peers.config import (
    BARE,
    BASELINE,
    FASTAPI,
    NO_MERGE,
    SERVICE,
    Config,
    installed,
    peer_process,
    service_stack,
    write_json,
)
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
    """Read every stream to its end: every k-th parses and times text events, the rest count frames.

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


def live_figures(
    counts: list[int],
    latencies: list[float],
    texts: list[int],
    tokens: int,
    meter: Meter,
    stream_started: float,
    ended: float,
    paced: float,
) -> dict[str, Any]:
    """One live round's figures; ``tokens``: the text events each parsing subscriber must see."""
    delivered = sum(counts)
    stream_s = ended - stream_started
    return {
        "p50_ms": percentile(latencies, 0.5) if latencies else None,
        "p99_ms": percentile(latencies, 0.99) if latencies else None,
        "max_ms": max(latencies) if latencies else None,
        "deliveries": delivered,
        # Streams with fewer frames than the longest, or parsers that missed text events.
        "short_subscribers": max(
            sum(1 for c in counts if c < max(counts)), sum(1 for t in texts if t != tokens)
        ),
        "cpu_us_per_delivery": meter.server_cpu / delivered * 1e6 if delivered else None,
        "stream_s": stream_s,
        "server_busy": meter.server_cpu / max(stream_s, 1e-9),
        "client_busy": meter.client_cpu / max(stream_s, 1e-9),
        "paced_s": paced,
    }


async def live_service_round(
    http: aiohttp.ClientSession, stack: ServiceStack, n: int, cfg: Config, tag: str
) -> dict[str, Any]:
    """One paced answer to ``n`` subscribers of the service."""
    paced = cfg.live_tokens / cfg.live_tps
    # The subscribers must be in before the first token: a fresh connection sees only what follows.
    ttft_ms = 3000 + 2 * n
    message = f"live {tag} [emu:tokens={cfg.live_tokens}] [emu:tps={cfg.live_tps:g}] [emu:ttft={ttft_ms}]"
    posted = time.monotonic()
    session_id = await new_session(http, stack.url, message)
    responses = await connect_many(http, stack.url + f"/sessions/{session_id}/events", n)
    connected = time.monotonic()
    with Meter(stack.pid) as meter:
        counts, latencies, texts = await read_live(responses, cfg.live_parsed)
    ended = time.monotonic()
    async with http.get(stack.emulator_url + "/_emulator/records") as response:
        record = next(r for r in await response.json() if r["user_text"] == message)
    started = record["first_token_at"] or posted + ttft_ms / 1000
    figures = live_figures(counts, latencies, texts, cfg.live_tokens, meter, started, ended, paced)
    figures["connected_before_first_token"] = connected < started
    return figures


async def live_peer_round(
    http: aiohttp.ClientSession, url: str, pid: int, n: int, cfg: Config
) -> dict[str, Any]:
    """One paced broadcast to ``n`` subscribers of a peer."""
    paced = cfg.live_tokens / cfg.live_tps
    responses = await connect_many(http, url + "/live", n)
    while True:  # the handlers register their queue before the headers go out; be sure anyway
        async with http.get(url + "/count") as response:
            if (await response.json())["subscribers"] >= n:
                break
        await asyncio.sleep(0.05)
    with Meter(pid) as meter:
        started = time.monotonic()
        query = f"events={cfg.live_tokens}&interval_ms={1000 / cfg.live_tps}"
        async with http.post(url + f"/start?{query}") as response:
            response.raise_for_status()
        counts, latencies, texts = await read_live(responses, cfg.live_parsed)
    ended = time.monotonic()
    figures = live_figures(counts, latencies, texts, cfg.live_tokens, meter, started, ended, paced)
    figures["connected_before_first_token"] = True
    return figures


async def scenario_live(cfg: Config) -> dict[str, Any]:
    """A paced answer to 100, 1,000, 5,000 SSE subscribers: service, baseline, peers."""
    result: dict[str, Any] = {
        "tokens": cfg.live_tokens,
        "tokens_per_second": cfg.live_tps,
        "parsed_subscribers": cfg.live_parsed,
        "rounds": cfg.rounds,
        "sizes": {},
        "not_installed": [],
    }
    async with contextlib.AsyncExitStack() as stack:
        service = await stack.enter_async_context(service_stack(cfg, NO_MERGE))
        http = await stack.enter_async_context(client_session())
        directory = stack.enter_context(tempfile.TemporaryDirectory())
        # A real text event of the service, as the peers' template (same fields, same size).
        session_id, _ = await fill_session(http, service.url, 3)
        template = next(
            e for e in await poll_all(http, service.url, session_id) if e["type"] == "assistant_text"
        )
        peer_file = write_json(directory, "peer.json", {"template": template})
        runners: dict[str, Callable[[int, str], Awaitable[dict[str, Any]]]] = {
            SERVICE: lambda n, tag: live_service_round(http, service, n, cfg, tag)
        }
        if cfg.baseline is not None:
            base = await stack.enter_async_context(service_stack(cfg, NO_MERGE, source=cfg.baseline))
            runners[BASELINE] = lambda n, tag: live_service_round(http, base, n, cfg, tag)
        peers = [(BARE, "aiohttp")] + [(FASTAPI, "fastapi")] * installed("fastapi")
        if not installed("fastapi"):
            result["not_installed"].append(FASTAPI)
        for name, kind in peers:
            url, pid = stack.enter_context(peer_process(cfg, kind, peer_file))
            await wait_until_up(url + "/healthz")
            runners[name] = lambda n, tag, url=url, pid=pid: live_peer_round(http, url, pid, n, cfg)
        for n in cfg.live_sizes:
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name in runners}
            for round_no in range(cfg.rounds):
                for name, run in runners.items():
                    runs[name].append(await run(n, f"n{n}_r{round_no}"))
                    await asyncio.sleep(0.5)  # let the closed connections settle
            summary: dict[str, Any] = {}
            for name, r in runs.items():
                summary[name] = {
                    key: round(med(r, key), 3)
                    for key in (
                        "p50_ms",
                        "p99_ms",
                        "max_ms",
                        "cpu_us_per_delivery",
                        "stream_s",
                        "server_busy",
                        "client_busy",
                    )
                }
                summary[name]["deliveries"] = round(med(r, "deliveries"))
                summary[name]["paced_s"] = r[0]["paced_s"]
                summary[name]["short_subscribers"] = max(x["short_subscribers"] for x in r)
                summary[name]["connected_before_first_token"] = all(
                    x["connected_before_first_token"] for x in r
                )
                summary[name]["rounds_p99_ms"] = [round(x["p99_ms"] or 0, 1) for x in r]
                # Kept up: the answer took at most 20% longer than its pacing, and p99 < 1 s.
                summary[name]["kept_up"] = (
                    summary[name]["stream_s"] <= 1.2 * summary[name]["paced_s"] + 0.5
                    and (summary[name]["p99_ms"] or 0) < 1000
                )
            s = summary[SERVICE]
            summary["ratios"] = {
                f"service/{peer} cpu_us_per_delivery": ratio(
                    s["cpu_us_per_delivery"], summary[peer]["cpu_us_per_delivery"]
                )
                for peer in (BARE, FASTAPI)
                if peer in summary
            } | {
                f"service/{peer} p99": ratio(s["p99_ms"], summary[peer]["p99_ms"])
                for peer in (BARE, FASTAPI)
                if peer in summary
            }
            if BASELINE in summary:
                b = summary[BASELINE]
                summary["ratios"]["current/baseline p99"] = ratio(s["p99_ms"], b["p99_ms"])
                summary["ratios"]["current/baseline cpu_us_per_delivery"] = ratio(
                    s["cpu_us_per_delivery"], b["cpu_us_per_delivery"]
                )
            result["sizes"][str(n)] = summary
    return result
