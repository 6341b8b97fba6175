"""Scenario 4: hundreds of paced ``POST /agent/stream`` runs at once, and what the service adds to
their pacing (no peer runs an agent: the service alone)."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
from benchlib.api import client_session
from benchlib.procs import Meter, cpu_seconds
from benchlib.stack import ServiceStack
from benchlib.stats import med, median, spread
from benchlib.streams import AgentRun, agent_stream

from peers.config import Config, service_stack


@dataclass
class PacedRun(AgentRun):
    """A run with the pacing its message asks of the emulator."""

    ttft_ms: int = 0
    tps: int = 1


async def concurrent_batch(
    http: aiohttp.ClientSession, stack: ServiceStack, n: int, cfg: Config, rng: random.Random, tag: str
) -> dict[str, Any]:
    """``n`` runs at once, each with its own pacing; what the service adds to it."""
    runs = [
        PacedRun(
            f"conc {tag}_{i} [emu:tokens={cfg.conc_tokens}] [emu:ttft={ttft}] [emu:tps={tps}]",
            ttft_ms=ttft,
            tps=tps,
        )
        for i, (ttft, tps) in enumerate((rng.randint(600, 1200), rng.randint(50, 150)) for _ in range(n))
    ]
    emulator_cpu = cpu_seconds(stack.emulator_pid)
    with Meter(stack.pid) as meter:
        since = time.monotonic()
        await asyncio.gather(*(agent_stream(http, stack.url, run) for run in runs))
    emulator_cpu = cpu_seconds(stack.emulator_pid) - emulator_cpu
    async with http.get(stack.url + f"/healthz?lag_since={since}") as response:
        lag = (await response.json())["loop_lag_ms"]
    async with http.get(stack.emulator_url + "/_emulator/records") as response:
        records = {r["user_text"]: r for r in await response.json()}
    gaps, late, ttft_added, first_added, to_upstream = [], [], [], [], []
    for run in runs:
        if not run.tokens:
            continue
        interval = 1000 / run.tps
        first = run.tokens[0]
        ttft_added.append((first - run.started) * 1000 - run.ttft_ms)
        record = records.get(run.message)
        if record and record.get("first_token_at"):
            first_added.append((first - record["first_token_at"]) * 1000)
            to_upstream.append((record["started_at"] - run.started) * 1000)
        for k in range(1, len(run.tokens)):
            gaps.append((run.tokens[k] - run.tokens[k - 1]) * 1000 - interval)
            late.append((run.tokens[k] - first) * 1000 - k * interval)
    paced_s = median([r.ttft_ms / 1000 + (cfg.conc_tokens - 1) / r.tps for r in runs])
    return {
        "runs": n,
        "done": sum(run.ok for run in runs),
        "tokens_seen": sum(len(run.tokens) for run in runs),
        "gap_minus_paced_ms": spread(gaps),
        "late_vs_schedule_ms": spread(late),
        "ttft_added_ms": spread(ttft_added),
        "emulator_first_token_to_client_ms": spread(first_added),
        "post_to_upstream_request_ms": spread(to_upstream),
        "loop_lag_ms": lag,
        "wall_s": round(meter.wall, 2),
        "paced_run_s_median": round(paced_s, 2),
        "service_busy": round(meter.server_cpu / meter.wall, 2),
        "emulator_busy": round(emulator_cpu / meter.wall, 2),
        "client_busy": round(meter.client_cpu / meter.wall, 2),
        "service_cpu_us_per_token": round(
            meter.server_cpu / max(1, sum(len(r.tokens) for r in runs)) * 1e6, 1
        ),
    }


async def scenario_concurrency(cfg: Config) -> dict[str, Any]:
    """200 and 500 runs at once on the paced emulator (no peer runs an agent)."""
    result: dict[str, Any] = {"tokens_per_run": cfg.conc_tokens, "rounds": cfg.rounds, "sizes": {}}
    rng = random.Random(cfg.seed)
    env = {"AGENT_MAX_CONCURRENT_RUNS": "1000"}
    async with service_stack(cfg, env) as stack, client_session() as http:
        # Warm boto3's connection pool and the code paths, as a running service has them.
        await asyncio.gather(
            *(
                agent_stream(http, stack.url, AgentRun(f"warm {i} [emu:tokens=5]"))
                for i in range(cfg.conc_warm)
            )
        )
        batches: dict[int, list[dict[str, Any]]] = {n: [] for n in cfg.conc_sizes}
        for round_no in range(cfg.rounds):
            for n in cfg.conc_sizes:
                batches[n].append(await concurrent_batch(http, stack, n, cfg, rng, f"r{round_no}_n{n}"))
                await asyncio.sleep(0.5)
    for n, rounds in batches.items():
        summary: dict[str, Any] = {
            "runs": n,
            "done": min(r["done"] for r in rounds),
            "wall_s": med(rounds, "wall_s"),
            "paced_run_s_median": med(rounds, "paced_run_s_median"),
        }
        for key in (
            "gap_minus_paced_ms",
            "late_vs_schedule_ms",
            "ttft_added_ms",
            "post_to_upstream_request_ms",
            "emulator_first_token_to_client_ms",
        ):
            summary[key] = {
                q: median([r[key][q] for r in rounds if r[key][q] is not None]) for q in ("p50", "p99", "max")
            }
        summary["loop_lag_ms"] = {
            q: median([r["loop_lag_ms"][q] for r in rounds]) for q in ("p50", "p99", "max")
        }
        for key in ("service_busy", "emulator_busy", "client_busy", "service_cpu_us_per_token"):
            summary[key] = med(rounds, key)
        summary["rounds"] = rounds
        result["sizes"][str(n)] = summary
    return result
