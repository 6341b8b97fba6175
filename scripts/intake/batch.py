"""One batch of ``bench_concurrency.py --paced``: ``n`` paced ``POST /agent/stream`` runs at once
against one target, and what the target added to the emulator's pacing."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from typing import Any

import aiohttp
from benchlib.procs import Meter, cpu_seconds, thread_count
from benchlib.stats import spread
from benchlib.streams import AgentRun, agent_stream
from peers.concurrency import PacedRun

from intake.targets import Config, Target


def pacing(cfg: Config, round_no: int, n: int) -> list[tuple[int, int]]:
    """Each run's (first token ms, tokens/s), drawn per run; the same for every target in a round."""
    rng = random.Random(f"{cfg.seed}:{round_no}:{n}")
    return [(rng.randint(*cfg.ttft_ms), rng.randint(*cfg.tps)) for _ in range(n)]


async def warm(http: aiohttp.ClientSession, target: Target, n: int) -> None:
    """``n`` short runs at once: the connection pools and code paths warm, as in a running server."""
    runs = await asyncio.gather(
        *(agent_stream(http, target.url, AgentRun(f"warm {i} [emu:tokens=5]")) for i in range(n))
    )
    if not all(run.ok for run in runs):
        raise RuntimeError(f"{target.name}: warm-up runs did not all end with done")


async def peak_threads(pids: list[int], peak: list[int], interval: float = 0.1) -> None:
    """Keep ``peak[0]`` at the most threads ``pids`` had together, sampled every ``interval`` s."""
    while True:
        peak[0] = max(peak[0], sum(thread_count(pid) for pid in pids))
        await asyncio.sleep(interval)


async def loop_lag(http: aiohttp.ClientSession, target: Target, since: float) -> dict[str, float]:
    """The target's event-loop lag since ``since`` (``/healthz?lag_since=``).

    With several workers behind one port each fresh connection reaches one of them as the kernel
    spreads it: a few asks each, and the worst answer for every figure.
    """
    url = target.url + f"/healthz?lag_since={since}"
    if target.workers == 1:
        async with http.get(url) as response:
            return (await response.json())["loop_lag_ms"]
    answers = []
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as fresh:
        for _ in range(4 * target.workers):
            async with fresh.get(url) as response:
                answers.append((await response.json())["loop_lag_ms"])
    return {q: max(answer[q] for answer in answers) for q in ("p50", "p99", "max")}


async def paced_batch(
    http: aiohttp.ClientSession, target: Target, cfg: Config, n: int, round_no: int
) -> dict[str, Any]:
    """``n`` runs at once against ``target``, each paced as :func:`pacing` draws; its figures."""
    tag = f"{target.name.replace(' ', '_')}_r{round_no}_n{n}"
    runs = [
        PacedRun(
            f"paced {tag}_{i} [emu:tokens={cfg.tokens}] [emu:ttft={ttft}] [emu:tps={tps}]",
            ttft_ms=ttft,
            tps=tps,
        )
        for i, (ttft, tps) in enumerate(pacing(cfg, round_no, n))
    ]
    pids = target.pids()
    peak = [0]
    sampler = asyncio.create_task(peak_threads(pids, peak))
    emulator_cpu = cpu_seconds(target.emulator_pid)
    try:
        with Meter(*pids) as meter:
            since = time.monotonic()
            await asyncio.gather(*(agent_stream(http, target.url, run) for run in runs))
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
    emulator_cpu = cpu_seconds(target.emulator_pid) - emulator_cpu
    lag = await loop_lag(http, target, since)
    async with http.get(target.emulator_url + "/_emulator/records") as response:
        records = {r["user_text"]: r for r in await response.json()}
    return figures(runs, records, cfg, meter, emulator_cpu, lag, peak[0])


def figures(
    runs: list[PacedRun],
    records: dict[str, dict[str, Any]],
    cfg: Config,
    meter: Meter,
    emulator_cpu: float,
    lag: dict[str, float],
    threads: int,
) -> dict[str, Any]:
    """A batch's figures from what the client saw and the emulator's records of what it wrote."""
    added, jitter, late, upstream = [], [], [], []
    for run in runs:
        record = records.get(run.message)
        if record:
            # The client sending the run's request to the emulator receiving the target's model
            # request: the target's request handling and admission, which the first token's
            # added time (counted from the emulator's first token on) leaves out.
            upstream.append((record["started_at"] - run.started) * 1000)
        if not run.tokens:
            continue
        interval = 1000 / run.tps
        if record and record.get("first_token_at"):
            # The client's first text event minus the emulator writing the first token.
            added.append((run.tokens[0] - record["first_token_at"]) * 1000)
        jitter += [(b - a) * 1000 - interval for a, b in zip(run.tokens, run.tokens[1:], strict=False)]
        # How late the last token came against the pace the first one set: a growing backlog shows here.
        late.append((run.tokens[-1] - run.tokens[0]) * 1000 - (len(run.tokens) - 1) * interval)
    tokens = sum(len(run.tokens) for run in runs)
    return {
        "runs": len(runs),
        "done": sum(run.ok for run in runs),
        "tokens_seen": tokens,
        "tokens_expected": len(runs) * cfg.tokens,
        "first_token_added_ms": spread(added),
        "upstream_request_ms": spread(upstream),
        "jitter_ms": spread(jitter),
        "last_token_late_ms": spread(late),
        "loop_lag_ms": {q: lag[q] for q in ("p50", "p99", "max")},
        "cpu_us_per_token": round(meter.server_cpu / max(1, tokens) * 1e6, 1),
        "threads_max": threads,
        "wall_s": round(meter.wall, 2),
        "server_busy": round(meter.server_cpu / meter.wall, 2),
        "emulator_busy": round(emulator_cpu / meter.wall, 2),
        "client_busy": round(meter.client_cpu / meter.wall, 2),
    }
