"""Benchmark: many concurrent runs through ``POST /agent/stream`` against the paced emulator.

    python scripts/bench_concurrency.py                  # 200 runs, 50 tokens at 20 tokens/s
    python scripts/bench_concurrency.py --runs 400 --tokens 100 --json
    python scripts/bench_concurrency.py --paced --baseline main     # current, baseline, relay side by side
    python scripts/bench_concurrency.py --paced --workers 2         # ... and 1,000 runs on two workers

Three processes, as in production: the emulator (``python -m service.emulator``, standing in
for Bedrock), the service (``python -m service`` with ``AGENT_PROVIDER=bedrock`` and boto3's
``AWS_ENDPOINT_URL_BEDROCK_RUNTIME`` pointing at the emulator), and this client.

It reports:
- the wall time of one run alone (median of a few) and of N concurrent runs, and their ratio;
- the service's event-loop lag (p50, p99, max) while the N runs were in flight, read from
  ``/healthz?lag_since=`` (time.monotonic() is one clock for every process on Linux);
- the time the service adds between the emulator writing a run's first token and this client
  reading the first event (p50, p99), from the emulator's own record of when it wrote it.

``--paced`` (implied by any of its options: ``--baseline``, ``--workers``, ``--rounds`` ...) measures
instead, in one invocation, 200 and 500 runs (``--runs``) paced like a real model (first token
600-1,200 ms, 50-100 tokens/s, drawn per run; 150 tokens), one SSE subscriber per run (the response
itself), each server pinned alone to CPU 1 and the client and the emulators on CPU 0, against:

- ``current``: the service of this tree;
- ``baseline``: the service as of ``--baseline GIT_REF`` (a temporary git worktree, the same venv);
- ``relay``: a bare aiohttp relay, the floor (``scripts/intake/relay.py``: frames in, SSE out);
- with ``--workers N``: ``python -m service --workers N`` on a private redis-server, unpinned,
  at ``--workers-runs`` (1,000) runs.

The targets take turns round by round (A B C A B C ...), medians of ``--rounds``. Per target: the
first-token time added (the client's first text event minus the emulator's record of writing the
first token), inter-token jitter (the gap between text events minus the run's pacing interval),
the last token's lateness against the pace (a growing backlog), the loop lag
(``/healthz?lag_since=``, the relay with the same monitor), the server's CPU per token delivered
(``/proc/<pid>/stat``, its workers included), its most threads, every run ending with ``done``; and
current / baseline, current / relay ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import ROOT  # noqa: E402
from benchlib.api import client_session  # noqa: E402
from benchlib.procs import CLIENT_CPU, can_pin, raise_open_file_limit, wait_until_up  # noqa: E402
from benchlib.stack import ServiceStack, baseline_tree  # noqa: E402
from benchlib.stats import spread  # noqa: E402
from benchlib.streams import AgentRun, agent_stream  # noqa: E402
from intake.compare import compare  # noqa: E402
from intake.report import report as report_paced  # noqa: E402
from intake.targets import Config, supports_workers  # noqa: E402


async def bench(args: argparse.Namespace, extra_env: dict[str, str] | None = None) -> dict[str, object]:
    """Run the scenario (service settings ``extra_env`` added) and return the figures."""
    emulator_args = ["--ttft-ms", str(args.ttft_ms), "--tokens-per-second", str(args.tps)]
    # With --provider openai the same emulator answers over its OpenAI-compatible route, as Bedrock
    # Access Gateway would.
    env = {
        "AGENT_PROVIDER": args.provider,
        "AGENT_MAX_CONCURRENT_RUNS": str(max(256, args.runs)),
        **(extra_env or {}),
    }
    async with AsyncExitStack() as processes:
        if args.attach:
            # Use a service and emulator already running (to profile them, say).
            service_url, emulator_url = args.attach.split(",")
            await wait_until_up(emulator_url + "/_emulator/records")
            await wait_until_up(service_url + "/healthz")
        else:
            stack = await processes.enter_async_context(ServiceStack(env, emulator_args=emulator_args))
            service_url, emulator_url = stack.url, stack.emulator_url
        async with client_session(total=600) as session:

            async def one_run(message: str) -> AgentRun:
                return await agent_stream(session, service_url, AgentRun(message))

            # warm up boto3's connection pool and the code paths
            await asyncio.gather(*(one_run(f"warm {n} [emu:tokens=5]") for n in range(args.warm)))
            singles = [
                await one_run(f"single {n} [emu:tokens={args.tokens}]") for n in range(args.single_repeats)
            ]
            load_start = time.monotonic()
            many = await asyncio.gather(
                *(one_run(f"load {n} [emu:tokens={args.tokens}]") for n in range(args.runs))
            )
            load_end = time.monotonic()
            async with session.get(service_url + f"/healthz?lag_since={load_start}") as response:
                lag = (await response.json())["loop_lag_ms"]
            async with session.get(emulator_url + "/_emulator/records") as response:
                records = {record["user_text"]: record for record in await response.json()}

    single = statistics.median(run.finished - run.started for run in singles)
    concurrent = load_end - load_start
    added = []
    for run in many:
        record = records.get(run.message)
        if record and record.get("first_token_at") and run.first_event:
            added.append((run.first_event - record["first_token_at"]) * 1000)
    return {
        "provider": args.provider,
        "runs": args.runs,
        "tokens_per_run": args.tokens,
        "tokens_per_second": args.tps,
        "ttft_ms": args.ttft_ms,
        "all_done": all(run.ok for run in many),
        "events_per_run": statistics.median(run.events for run in many),
        "single_run_s": round(single, 3),
        "concurrent_wall_s": round(concurrent, 3),
        "ratio": round(concurrent / single, 3),
        "loop_lag_ms": lag,
        "first_token_added_ms": {**spread(added), "samples": len(added)} if added else None,
    }


def report(result: dict[str, object], title: str = "") -> None:
    """Print one scenario's figures for people."""
    print(
        f"{title}{result['provider']} wire: {result['runs']} concurrent runs, {result['tokens_per_run']} tokens each at "
        f"{result['tokens_per_second']} tokens/s (TTFT {result['ttft_ms']} ms)"
    )
    print(f"  every run ended with done:  {result['all_done']}")
    print(f"  one run alone:              {result['single_run_s']} s")
    print(
        f"  {result['runs']} at once:                {result['concurrent_wall_s']} s  (ratio {result['ratio']}, goal < 2)"
    )
    lag = result["loop_lag_ms"]
    print(
        f"  event-loop lag under load:  p50 {lag['p50']} ms, p99 {lag['p99']} ms, max {lag['max']} ms  (goal p99 < 20 ms)"
    )
    added = result["first_token_added_ms"]
    if added:
        print(
            f"  first token, emulator to client: p50 {added['p50']} ms, p99 {added['p99']} ms ({added['samples']} runs)"
        )


async def compare_gc(args: argparse.Namespace, rounds: int) -> dict[str, object]:
    """The same scenario with the service's GC tuning off and on, alternating, in one run."""
    off, on = [], []
    for _ in range(rounds):
        off.append(await bench(args, {"AGENT_GC_TUNING": "false"}))
        on.append(await bench(args, {"AGENT_GC_TUNING": "true"}))

    def p99s(results: list[dict[str, object]]) -> list[float]:
        return [result["loop_lag_ms"]["p99"] for result in results]  # type: ignore[index]

    return {
        "gc_tuning_off_p99_ms": p99s(off),
        "gc_tuning_on_p99_ms": p99s(on),
        "median_ratio_off_to_on": round(
            statistics.median(p99s(off)) / max(statistics.median(p99s(on)), 1e-9), 2
        ),
        "runs": [*off, *on],
    }


def paced(args: argparse.Namespace) -> None:
    """``--paced``: current, baseline and relay side by side (and the workers), printed."""
    if args.workers and not supports_workers(ROOT):
        sys.exit(
            f"bench_concurrency: --workers {args.workers}: the service in {ROOT} does not take "
            "--workers yet (`python -m service --help` does not list it)"
        )
    cfg = Config(
        sizes=[n for n in (args.runs or [200, 500]) if n > 0],
        tokens=args.tokens or 150,
        ttft_ms=tuple(args.paced_ttft_ms or (600, 1200)),
        tps=tuple(args.paced_tps or (50, 100)),
        rounds=args.rounds or 3,
        warm=args.warm or 0,
        provider=args.provider,
        relay=not args.no_relay,
        workers=args.workers,
        workers_runs=args.workers_runs or 1000,
        logs=Path(tempfile.mkdtemp(prefix="bench_concurrency-logs-")),
    )
    if not cfg.sizes and not cfg.workers:
        sys.exit("bench_concurrency: --runs 0 and no --workers: nothing to measure")
    raise_open_file_limit()
    if can_pin():
        os.sched_setaffinity(0, {CLIENT_CPU})
    else:
        cfg.notes.append("fewer than 2 CPUs available: nothing is pinned")
    if args.provider != "bedrock" and cfg.relay:
        cfg.notes.append("the relay reads the emulator's Bedrock route whatever --provider says")
    if cfg.workers:
        cfg.notes.append(
            f"{cfg.workers_name}: unpinned on every core with the client and its emulator, Redis private"
        )
    try:
        with contextlib.ExitStack() as trees:
            if args.baseline:
                cfg.baseline = trees.enter_context(baseline_tree(args.baseline))
                cfg.baseline_ref = args.baseline
                cfg.notes.append(f"baseline: the service as of {args.baseline} (a temporary worktree)")
            result = asyncio.run(compare(cfg))
    except (Exception, KeyboardInterrupt):
        print(f"bench_concurrency: failed; the servers' output is in {cfg.logs}", file=sys.stderr)
        raise
    shutil.rmtree(cfg.logs, ignore_errors=True)
    if args.json:
        print(json.dumps(result))
    else:
        report_paced(result)


def main() -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--runs",
        type=int,
        nargs="+",
        help="concurrent runs (default 200; --paced: the sizes on one core, default 200 500, 0 for none)",
    )
    parser.add_argument("--tokens", type=int, help="tokens per run (default 50; --paced: 150)")
    parser.add_argument("--tps", type=float, default=20.0, help="emulator tokens per second")
    parser.add_argument("--ttft-ms", type=float, default=200.0, help="emulator time to first token")
    parser.add_argument("--single-repeats", type=int, default=3)
    parser.add_argument(
        "--warm",
        type=int,
        help="concurrent short runs first, as a running service has warm pools "
        "(default 200; --paced: each target's largest size)",
    )
    parser.add_argument(
        "--compare-gc",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="run ROUNDS times with the service's GC tuning off and on, and compare loop lag",
    )
    parser.add_argument(
        "--provider",
        choices=["bedrock", "openai"],
        default="bedrock",
        help="the wire the service reads the emulator over",
    )
    parser.add_argument("--json", action="store_true", help="print JSON only")
    parser.add_argument(
        "--attach",
        default="",
        metavar="SERVICE_URL,EMULATOR_URL",
        help="use running processes instead of starting them",
    )
    paced_options = parser.add_argument_group("--paced: current, baseline and relay side by side")
    paced_options.add_argument("--paced", action="store_true", help="the side-by-side comparison")
    paced_options.add_argument("--baseline", metavar="GIT_REF", help="also the service as of this ref")
    paced_options.add_argument("--no-relay", action="store_true", help="leave the bare relay out")
    paced_options.add_argument("--rounds", type=int, help="alternating rounds (default 3)")
    paced_options.add_argument(
        "--paced-ttft-ms", type=int, nargs=2, metavar=("LO", "HI"), help="first token (600 1200)"
    )
    paced_options.add_argument(
        "--paced-tps", type=int, nargs=2, metavar=("LO", "HI"), help="tokens per second (50 100)"
    )
    paced_options.add_argument(
        "--workers", type=int, default=0, metavar="N", help="also `python -m service --workers N` on Redis"
    )
    paced_options.add_argument("--workers-runs", type=int, help="runs for --workers (1000)")
    args = parser.parse_args()
    # Any option of the comparison asks for it: ``--runs 500 --rounds 2`` is not the old scenario.
    paced_only = (
        "paced",
        "baseline",
        "workers",
        "rounds",
        "no_relay",
        "paced_ttft_ms",
        "paced_tps",
        "workers_runs",
    )
    if any(getattr(args, name) for name in paced_only):
        paced(args)
        return
    if args.runs and len(args.runs) > 1:
        parser.error("several --runs sizes need --paced")
    args.runs = args.runs[0] if args.runs else 200
    args.tokens = args.tokens or 50
    args.warm = 200 if args.warm is None else args.warm
    if args.compare_gc:
        comparison = asyncio.run(compare_gc(args, args.compare_gc))
        if args.json:
            print(json.dumps(comparison))
            return
        print(f"event-loop lag p99 (ms), GC tuning off: {comparison['gc_tuning_off_p99_ms']}")
        print(f"event-loop lag p99 (ms), GC tuning on:  {comparison['gc_tuning_on_p99_ms']}")
        print(f"median off / on: {comparison['median_ratio_off_to_on']}x")
        return
    result = asyncio.run(bench(args))
    if args.json:
        print(json.dumps(result))
    else:
        report(result)


if __name__ == "__main__":
    main()
