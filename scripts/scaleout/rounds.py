"""A run: the configurations in alternation, round after round; medians over the rounds; the cost of Redis."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchlib.api import client_session
from benchlib.procs import free_port, process, raise_open_file_limit
from benchlib.stack import git_version

from scaleout.cluster import CONFIGS, Cluster, Redis
from scaleout.scenarios import fanout, throughput


async def one_config(
    args: argparse.Namespace, name: str, round_no: int, redis: Redis | None, run_prefix: str, logs: Path
) -> dict[str, Any]:
    """Start a configuration's processes, run the scenarios on them, stop them."""
    _, instances, on_redis = CONFIGS[name]
    prefix = f"{run_prefix}:{name}-r{round_no}" if on_redis else ""
    cluster = Cluster(args, instances, args.redis_url if on_redis else "", prefix, logs)
    result: dict[str, Any] = {}
    dbsize_before = redis.client.dbsize() if on_redis and redis else 0
    try:
        async with cluster:
            async with client_session(read=args.timeout) as http:
                for scenario, run in (("throughput", throughput), ("fanout", fanout)):
                    if scenario not in args.scenarios:
                        continue
                    try:
                        result[scenario] = await asyncio.wait_for(
                            run(args, cluster, redis if on_redis else None, http), args.timeout
                        )
                    except Exception as exc:  # reported, and the run goes on
                        result[scenario] = {"error": f"{type(exc).__name__}: {exc}"}
                        print(
                            f"[{name} round {round_no}] {scenario} failed: {exc!r}\n{cluster.log_tail()}",
                            file=sys.stderr,
                        )
    except Exception as exc:  # reported, and the next configuration runs
        result["error"] = f"{type(exc).__name__}: {exc}"
        print(f"[{name} round {round_no}] failed: {exc!r}\n{cluster.log_tail()}", file=sys.stderr)
    if on_redis and redis:
        result["redis_keys_under_prefix"] = redis.count(prefix)
        result["redis_keys_outside_prefix"] = max(
            0, redis.client.dbsize() - dbsize_before - result["redis_keys_under_prefix"]
        )
        redis.delete(prefix)
    return result


def median_tree(runs: list[Any]) -> Any:
    """The median of each number across the rounds, keeping the shape; errors are kept."""
    values = [run for run in runs if run is not None]
    if not values:
        return None
    first = values[0]
    if isinstance(first, dict):
        keys = list(dict.fromkeys(key for run in values if isinstance(run, dict) for key in run))
        return {key: median_tree([run.get(key) for run in values if isinstance(run, dict)]) for key in keys}
    if isinstance(first, bool) or not isinstance(first, (int, float)):
        return first if all(v == first for v in values) else values
    median = statistics.median(v for v in values if isinstance(v, (int, float)))
    return round(median, 3) if isinstance(median, float) else median


def cost_of_redis(configs: dict[str, Any]) -> dict[str, Any] | None:
    """b against a: CPU per delivered event and latency, as ratios and differences."""
    a, b = configs.get("a"), configs.get("b")
    if not a or not b:
        return None
    out: dict[str, Any] = {}
    for scenario in ("throughput", "fanout"):
        sa, sb = a.get(scenario) or {}, b.get(scenario) or {}
        ca, cb = sa.get("service_cpu_us_per_event"), sb.get("service_cpu_us_per_event")
        if ca and cb:
            out[f"{scenario}_service_cpu_us_per_event"] = {
                "memory": ca,
                "redis": cb,
                "ratio": round(cb / ca, 2),
            }
            redis_us = sb.get("redis_cpu_us_per_event")
            if redis_us is not None:
                out[f"{scenario}_service_plus_redis_cpu_ratio"] = round((cb + redis_us) / ca, 2)
        if scenario == "throughput" and sa.get("events_per_s") and sb.get("events_per_s"):
            out["throughput_events_per_s_ratio"] = round(sb["events_per_s"] / sa["events_per_s"], 2)
    la, lb = (a.get("fanout") or {}).get("latency_ms"), (b.get("fanout") or {}).get("latency_ms")
    if isinstance(la, dict) and isinstance(lb, dict):
        out["fanout_latency_ms"] = {
            q: {"memory": la[q], "redis": lb[q], "difference": round(lb[q] - la[q], 2)}
            for q in ("p50", "p99", "max")
        }
    return out


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    """The whole run (with a redis-server of its own under ``--private-redis``): the result."""
    raise_open_file_limit(args.subscribers * 4 + args.sessions * 4 + 1024)
    needs_redis = any(CONFIGS[name][2] for name in args.configs)
    async with contextlib.AsyncExitStack() as stack:
        if needs_redis and args.private_redis:
            # A redis-server of our own, so its CPU figures count this benchmark only.
            port = free_port()
            stack.enter_context(
                process(
                    [
                        "redis-server",
                        "--port",
                        str(port),
                        "--bind",
                        "127.0.0.1",
                        "--save",
                        "",
                        "--appendonly",
                        "no",
                    ]
                )
            )
            args.redis_url = f"redis://127.0.0.1:{port}/0"
            for _ in range(100):
                try:
                    Redis(args.redis_url)
                    break
                except Exception:  # not up yet
                    await asyncio.sleep(0.05)
        return await run_rounds(args, needs_redis)


async def run_rounds(args: argparse.Namespace, needs_redis: bool) -> dict[str, Any]:
    """Every configuration in turn, ``args.rounds`` times; the medians, the cost of Redis, every round."""
    redis = Redis(args.redis_url) if needs_redis else None
    run_prefix = f"bench-scaleout:{secrets.token_hex(4)}"
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in args.configs}
    try:
        with tempfile.TemporaryDirectory(prefix="bench-scaleout-") as scratch:
            for round_no in range(1, args.rounds + 1):
                for name in args.configs:
                    print(
                        f"round {round_no}/{args.rounds}: {name} ({CONFIGS[name][0]})",
                        file=sys.stderr,
                        flush=True,
                    )
                    logs = Path(args.logs or scratch) / f"{name}-r{round_no}"
                    logs.mkdir(parents=True, exist_ok=True)
                    rounds[name].append(await one_config(args, name, round_no, redis, run_prefix, logs))
    finally:
        leftover = redis.delete(run_prefix) if redis else 0
    configs = {name: median_tree(runs) for name, runs in rounds.items()}
    for name in configs:
        configs[name]["label"] = CONFIGS[name][0]
    return {
        "cpus": os.cpu_count(),
        "service_version": git_version(),
        "parameters": {
            name: getattr(args, name)
            for name in (
                "scenarios",
                "configs",
                "sessions",
                "tokens",
                "ttft_ms",
                "subscribers",
                "parsed",
                "fanout_tokens",
                "tps",
                "fanout_ttft_ms",
                "connect_concurrency",
            )
        },
        "rounds": args.rounds,
        "redis_url": args.redis_url if needs_redis else None,
        "private_redis": bool(args.private_redis),
        "redis_prefix": run_prefix if needs_redis else None,
        "redis_keys_left_after_cleanup": leftover,
        "gc_tuning": args.gc_tuning,
        "configs": configs,
        "cost_of_redis_b_vs_a": cost_of_redis(configs),
        "per_round": rounds,
    }
