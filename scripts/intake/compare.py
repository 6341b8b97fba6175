"""The rounds of ``bench_concurrency.py --paced``: every target in turn (A B C A B C ...) at every
size, then the medians over rounds and the ratios between targets."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from benchlib.api import client_session
from benchlib.stats import median, ratio

from intake.batch import paced_batch, warm
from intake.targets import BASELINE, CURRENT, RELAY, Config, open_targets

SPREADS = ("first_token_added_ms", "upstream_request_ms", "jitter_ms", "last_token_late_ms", "loop_lag_ms")
SCALARS = ("cpu_us_per_token", "wall_s", "server_busy", "emulator_busy", "client_busy")
# The figures the ratios compare: (key, quantile or None for a scalar).
COMPARED = (
    ("first_token_added_ms", "p50"),
    ("first_token_added_ms", "p99"),
    ("upstream_request_ms", "p99"),
    ("jitter_ms", "p99"),
    ("loop_lag_ms", "p99"),
    ("cpu_us_per_token", None),
    ("threads_max", None),
)


def plan(cfg: Config) -> list[tuple[int, list[str]]]:
    """Each size and the targets that run it, in turn order."""
    single = [CURRENT] + [BASELINE] * (cfg.baseline is not None) + [RELAY] * cfg.relay
    steps = [(n, single) for n in cfg.sizes]
    if cfg.workers:
        steps.append((cfg.workers_runs, [cfg.workers_name]))
    return steps


async def run_rounds(cfg: Config) -> dict[tuple[int, str], list[dict[str, Any]]]:
    """Start the targets, warm them, and run every round; each (size, target)'s batches."""
    steps = plan(cfg)
    batches: dict[tuple[int, str], list[dict[str, Any]]] = {
        (n, name): [] for n, names in steps for name in names
    }
    async with contextlib.AsyncExitStack() as stack:
        targets = await open_targets(cfg, stack)
        # A paced run lasts seconds; the total bounds a stuck one.
        http = await stack.enter_async_context(client_session(total=900))
        for name, target in targets.items():
            await warm(http, target, cfg.warm or max(n for n, names in steps if name in names))
        for round_no in range(cfg.rounds):
            for n, names in steps:
                for name in names:
                    batches[(n, name)].append(await paced_batch(http, targets[name], cfg, n, round_no))
                    await asyncio.sleep(0.5)  # let the closed connections settle
    return batches


def summarise(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One target at one size: the median of every figure over rounds (the worst for done/threads)."""
    summary: dict[str, Any] = {
        "runs": rounds[0]["runs"],
        "done": min(r["done"] for r in rounds),
        "tokens_short": max(r["tokens_expected"] - r["tokens_seen"] for r in rounds),
        "threads_max": max(r["threads_max"] for r in rounds),
    }
    for key in SPREADS:
        summary[key] = {
            q: median([r[key][q] for r in rounds if r[key][q] is not None]) for q in ("p50", "p99", "max")
        }
    for key in SCALARS:
        summary[key] = median([r[key] for r in rounds])
    summary["rounds_cpu_us_per_token"] = [r["cpu_us_per_token"] for r in rounds]
    summary["rounds_first_token_added_p99_ms"] = [r["first_token_added_ms"]["p99"] for r in rounds]
    return summary


def figure(summary: dict[str, Any], key: str, q: str | None) -> float:
    """One compared figure of a summary."""
    return summary[key] if q is None else summary[key][q]


def ratios(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float | None]:
    """``a`` over ``b`` for every compared figure."""
    return {f"{key} {q}" if q else key: ratio(figure(a, key, q), figure(b, key, q)) for key, q in COMPARED}


async def compare(cfg: Config) -> dict[str, Any]:
    """The whole comparison: per size, every target's medians and the ratios."""
    batches = await run_rounds(cfg)
    result: dict[str, Any] = {"sizes": {}}
    for (n, name), rounds in batches.items():
        result["sizes"].setdefault(str(n), {})[name] = summarise(rounds) | {"rounds": rounds}
    for n, row in result["sizes"].items():
        row_ratios: dict[str, Any] = {}
        if CURRENT in row:
            for other in (BASELINE, RELAY):
                if other in row:
                    row_ratios[f"{CURRENT}/{other}"] = ratios(row[CURRENT], row[other])
        if cfg.workers_name in row and cfg.sizes:
            # The workers' per-run figures against one worker's at the largest single-core size.
            single = str(max(cfg.sizes))
            key = f"{cfg.workers_name} @{n} / {CURRENT} @{single}"
            row_ratios[key] = ratios(row[cfg.workers_name], result["sizes"][single][CURRENT])
        row["ratios"] = row_ratios
    result["config"] = {
        "sizes": cfg.sizes,
        "tokens_per_run": cfg.tokens,
        "ttft_ms": list(cfg.ttft_ms),
        "tokens_per_second": list(cfg.tps),
        "rounds": cfg.rounds,
        "provider": cfg.provider,
        "baseline": cfg.baseline_ref or None,
        "relay": cfg.relay,
        "workers": cfg.workers or None,
        "workers_runs": cfg.workers_runs if cfg.workers else None,
    }
    result["notes"] = cfg.notes
    return result
