"""Benchmark: many concurrent runs through ``POST /agent/stream`` against the paced emulator.

    python scripts/bench_concurrency.py                  # 200 runs, 50 tokens at 20 tokens/s
    python scripts/bench_concurrency.py --runs 400 --tokens 100 --json

Three processes, as in production: the emulator (``python -m service.emulator``, standing in
for Bedrock), the service (``python -m service`` with ``AGENT_PROVIDER=bedrock`` and boto3's
``AWS_ENDPOINT_URL_BEDROCK_RUNTIME`` pointing at the emulator), and this client.

It reports:
- the wall time of one run alone (median of a few) and of N concurrent runs, and their ratio;
- the service's event-loop lag (p50, p99, max) while the N runs were in flight, read from
  ``/healthz?lag_since=`` (time.monotonic() is one clock for every process on Linux);
- the time the service adds between the emulator writing a run's first token and this client
  reading the first event (p50, p99), from the emulator's own record of when it wrote it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib.api import client_session  # noqa: E402
from benchlib.procs import wait_until_up  # noqa: E402
from benchlib.stack import ServiceStack  # noqa: E402
from benchlib.stats import spread  # noqa: E402
from benchlib.streams import AgentRun, agent_stream  # noqa: E402


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


def main() -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--tokens", type=int, default=50)
    parser.add_argument("--tps", type=float, default=20.0, help="emulator tokens per second")
    parser.add_argument("--ttft-ms", type=float, default=200.0, help="emulator time to first token")
    parser.add_argument("--single-repeats", type=int, default=3)
    parser.add_argument(
        "--warm",
        type=int,
        default=200,
        help="concurrent short runs first, as a running service has warm pools",
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
    args = parser.parse_args()
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
