"""Benchmark: what the Bedrock intake costs the service, per token and in threads, against a baseline.

    python scripts/bench_intake.py                          # this tree: 200 runs, 150 tokens at 75/s
    python scripts/bench_intake.py --baseline main --rounds 2
    python scripts/bench_intake.py --runs 500 --tokens 50
    python scripts/bench_intake.py --decode-only --rounds 5
    python scripts/bench_intake.py --agents 2 --rounds 2     # one agent against two on one upstream
    python scripts/bench_intake.py --traces both --aa --baseline 97288e2 --rounds 3

The emulator and the service run as in scripts/bench_concurrency.py (``AGENT_PROVIDER=bedrock``,
botocore's ``AWS_ENDPOINT_URL_BEDROCK_RUNTIME`` pointing at the emulator). N runs go through
``POST /agent/stream`` at once; meanwhile the service's thread count is read from
``/proc/<pid>/status`` every 50 ms. Reported per tree: the most threads seen under load, and the
service's CPU time (user + system, every thread) over the load divided by the text tokens the
clients received. With ``--baseline REF`` (repeatable) the same scenario runs against REF checked
out in a temporary worktree, the trees alternating for ``--rounds`` rounds (the order rotated each
round), and the ratio of the medians is given: a CPU-per-token ratio measured in one run, on the
same machine.

``--decode-only`` measures the intake alone, in this process against the emulator in another:
the same N concurrent ConverseStreams read by aiobotocore's own EventStream and by the provider's
batched decoder (``service/providers/bedrock_events.py``), alternating, and this process's CPU per
token for each. No service, no transports: the difference is the reader.

``--agents N`` runs this tree twice each round: as one agent (the environment's), and with an
``AGENT_AGENTS_FILE`` of N agents on the same upstream (the emulator, as Bedrock; each its own
model name and prompt), the runs spread over them in turn. Named agents share one provider per
upstream, so the two should hold as many upstream connections and threads; both are reported: the
most threads seen, and the most established TCP connections from the service to the emulator's
port seen, each sampled every 50 ms under the load; and the connections kept once every agent
was warmed in turn with the whole concurrency (a pool per agent would keep N times as many).

``--traces on`` runs this tree with OpenTelemetry on: an OTLP/HTTP receiver in a process of its
own (``benchlib/otlp.py``: it decodes each export with opentelemetry-proto and counts the spans,
its CPU not the service's), the service's ``OTEL_EXPORTER_OTLP_ENDPOINT`` pointing at it and
``OTEL_TRACES_SAMPLER=always_on``, the batch processor as configured by default. Before the CPU
is read at either end of the load, the receiver is waited on until it holds the server and
``invoke_agent`` spans of every query so far, so the load's CPU holds the export of its own
spans and none of the warm-up's; the service's idle CPU rate (measured over 2 s before the load)
times the wait after it is taken off. The spans received per query are reported. ``--traces both``
runs this tree with traces off and on; the baselines always run with traces off. ``--aa`` runs
this tree (traces off) a second time each round: the ratio of the two is the A/A noise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import ROOT  # noqa: E402
from benchlib.api import client_session  # noqa: E402
from benchlib.procs import connections_to, cpu_seconds, free_port, process, wait_until_up  # noqa: E402
from benchlib.receiver import SpanReceiver  # noqa: E402
from benchlib.stack import ServiceStack, baseline_tree  # noqa: E402
from benchlib.streams import AgentRun, agent_stream  # noqa: E402

from service.providers.base import ModelRequest  # noqa: E402
from service.providers.bedrock import BedrockProvider  # noqa: E402


def threads_of(pid: int) -> int:
    """The number of threads of a process, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise RuntimeError("no Threads line")


async def sample_threads(pid: int, seen: list[int], upstream: tuple[int, list[int]]) -> None:
    """Append the thread count of ``pid``, and its connections to the upstream port, every 50 ms
    until cancelled."""
    port, connections = upstream
    while True:
        seen.append(threads_of(pid))
        connections.append(connections_to(pid, port))
        await asyncio.sleep(0.05)


async def idle_cpu_rate(pid: int, seconds: float = 2.0) -> float:
    """The CPU seconds per second a process spends with nothing to do (timers, the batch
    processor's thread), over ``seconds``."""
    before = cpu_seconds(pid)
    await asyncio.sleep(seconds)
    return (cpu_seconds(pid) - before) / seconds


def agents_file(logs: Path, count: int) -> Path:
    """An agents file of ``count`` agents on one upstream: the environment's Bedrock endpoint,
    each with a model name and a prompt of its own."""
    path = logs / f"agents-{count}.toml"
    tables = [
        f'[agents.agent{n}]\nprovider = "bedrock"\nmodel = "bench-model-{n}"\n'
        f'system_prompt = "You are agent {n}."\n'
        for n in range(1, count + 1)
    ]
    path.write_text("\n".join(tables), encoding="utf-8")
    return path


async def one_tree(
    args: argparse.Namespace, source: Path, logs: Path, agents: int = 0, traces: bool = False
) -> dict[str, object]:
    """The scenario against the service from ``source``; its output goes under ``logs``. With
    ``agents``, an agents file of that many agents on the one upstream, the runs spread over them.
    With ``traces``, the service exports its spans to a receiver in a process of its own."""
    if not traces:
        return await _one_tree(args, source, logs, agents, None)
    async with SpanReceiver(log=logs / f"otlp-{time.monotonic_ns()}.log") as receiver:
        result = await _one_tree(args, source, logs, agents, receiver)
        # The service has stopped, flushing what it still held: every span it exported is in.
        counts = await receiver.counts()
    queries = int(result.pop("queries"))  # type: ignore[call-overload]
    result["spans_per_query"] = round(sum(counts.values()) / queries, 2)
    result["spans_by_name"] = counts
    return result


async def _one_tree(
    args: argparse.Namespace, source: Path, logs: Path, agents: int, receiver: SpanReceiver | None
) -> dict[str, object]:
    env = {"AGENT_PROVIDER": "bedrock", "AGENT_MAX_CONCURRENT_RUNS": str(max(256, args.runs))}
    if receiver is not None:
        env |= {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_TRACES_SAMPLER": "always_on"}
    names: list[str | None] = [None]
    if agents:
        env["AGENT_AGENTS_FILE"] = str(agents_file(logs, agents))
        names = [f"agent{n}" for n in range(1, agents + 1)]
    emulator_args = ["--ttft-ms", str(args.ttft_ms), "--tokens-per-second", str(args.tps)]
    queries = 0
    exported = True
    idle_rate = 0.0
    async with ServiceStack(env, source=source, emulator_args=emulator_args, logs=logs) as stack:
        async with client_session(total=600) as http:

            async def run(message: str, n: int) -> AgentRun:
                return await agent_stream(http, stack.url, AgentRun(message, agent=names[n % len(names)]))

            # Warm the connection pool and the code paths, as a running service has them; one
            # agent after the other, each with the whole concurrency, so that a pool per agent
            # (rather than per upstream) would show as that many more connections kept.
            for agent in range(len(names)):
                warm = min(args.runs, 200)
                await asyncio.gather(*(run(f"warm {n} [emu:tokens=5]", agent) for n in range(warm)))
                queries += warm
            if receiver is not None:
                exported = await receiver.wait_for_queries(queries)
                idle_rate = await idle_cpu_rate(stack.pid)
            idle_threads = threads_of(stack.pid)
            idle_connections = connections_to(stack.pid, stack.emulator_port)
            seen: list[int] = []
            connections: list[int] = []
            sampler = asyncio.create_task(sample_threads(stack.pid, seen, (stack.emulator_port, connections)))
            cpu_before = cpu_seconds(stack.pid)
            started = time.monotonic()
            runs = await asyncio.gather(
                *(run(f"load {n} [emu:tokens={args.tokens}]", n) for n in range(args.runs))
            )
            loaded = time.monotonic()
            queries += args.runs
            if receiver is not None:
                exported = await receiver.wait_for_queries(queries) and exported
            measured = time.monotonic()
            # Waiting for the export is not load: the service's idle CPU over the wait is taken off.
            idle_cpu = idle_rate * (measured - loaded)
            cpu = cpu_seconds(stack.pid) - cpu_before - idle_cpu
            sampler.cancel()
            await asyncio.gather(sampler, return_exceptions=True)
    tokens = sum(len(r.tokens) for r in runs)
    traced = {}
    if receiver is not None:
        traced = {
            "queries": queries,
            "spans_all_exported": exported,
            "idle_cpu_ms_per_s": round(idle_rate * 1e3, 1),
            "idle_cpu_taken_off_s": round(idle_cpu, 3),
        }
    return {
        "all_done": all(r.ok for r in runs),
        "load_s": round(loaded - started, 2),
        "export_wait_s": round(measured - loaded, 2),
        **traced,
        "threads_idle": idle_threads,
        "threads_max_under_load": max(seen),
        "upstream_connections_idle": idle_connections,
        "upstream_connections_max": max(connections),
        "service_cpu_s": round(cpu, 3),
        "tokens": tokens,
        "cpu_us_per_token": round(cpu / max(tokens, 1) * 1e6, 1),
    }


async def compare(args: argparse.Namespace) -> dict[str, object]:
    """Every round: each baseline (when given) and this tree, in turn, the order rotated."""
    with ExitStack() as trees:
        logs = Path(trees.enter_context(tempfile.TemporaryDirectory(prefix="bench-intake-")))
        # (tree, agents, traces): the baselines and this tree as they always ran (traces off);
        # with --aa this tree once more; with --agents this tree with the agents file; with
        # --traces on, this tree traced instead of plain, with both, traced as well.
        scenarios = {ref: (trees.enter_context(baseline_tree(ref)), 0, False) for ref in args.baseline}
        if args.traces != "on":
            scenarios["current"] = (ROOT, 0, False)
        if args.aa:
            scenarios[AGAIN] = (ROOT, 0, False)
        if args.agents:
            scenarios[f"current, {args.agents} agents"] = (ROOT, args.agents, False)
        if args.traces != "off":
            scenarios[TRACED] = (ROOT, 0, True)
        results: dict[str, list[dict[str, object]]] = {name: [] for name in scenarios}
        names = list(scenarios)
        for round_no in range(args.rounds):
            # Each round starts one scenario further on: none is always first, or always last,
            # when the machine's other load rises or falls over the run.
            turn = round_no % len(names)
            for name in names[turn:] + names[:turn]:
                source, agents, traces = scenarios[name]
                results[name].append(await one_tree(args, source, logs, agents, traces))
    medians = {
        name: statistics.median(float(r["cpu_us_per_token"]) for r in rounds)  # type: ignore[arg-type]
        for name, rounds in results.items()
    }
    return {
        "runs": args.runs,
        "tokens_per_run": args.tokens,
        "tokens_per_second": args.tps,
        "ttft_ms": args.ttft_ms,
        "results": results,
        "median_cpu_us_per_token": medians,
        "cpu_per_token_current_over": {
            ref: round(medians["current"] / medians[ref], 3) for ref in args.baseline if "current" in medians
        },
        "comparisons": comparisons(medians, args.baseline),
        "rounds_spread": {
            name: rounds_spread([float(r["cpu_us_per_token"]) for r in rounds])
            for name, rounds in results.items()
        },  # type: ignore[arg-type]
    }


def rounds_spread(values: list[float]) -> dict[str, float]:
    """The lowest and highest round of a scenario, each over the median of its rounds."""
    middle = statistics.median(values)
    return {"low": round(min(values) / middle, 3), "high": round(max(values) / middle, 3)}


def comparisons(medians: dict[str, float], baselines: list[str]) -> dict[str, dict[str, float]]:
    """Each scenario of this tree against each baseline and against this tree as it runs plain:
    the ratio of the medians and the microseconds per token between them."""
    pairs = [(name, ref) for name in medians if name not in baselines for ref in baselines]
    pairs += [
        (name, "current") for name in medians if name not in (*baselines, "current") and "current" in medians
    ]
    return {
        f"{name} / {ref}": {
            "ratio": round(medians[name] / medians[ref], 3),
            "us_per_token_added": round(medians[name] - medians[ref], 1),
        }
        for name, ref in pairs
    }


AGAIN = "current, again (A/A)"
TRACED = "current, traces on"


async def decode_only(args: argparse.Namespace) -> dict[str, object]:
    """aiobotocore's EventStream and the provider's reader over the same streams, alternating."""
    from aiobotocore.config import AioConfig
    from aiobotocore.session import AioSession

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    emulator = [sys.executable, "-m", "service.emulator", "--port", str(port)]
    emulator += ["--ttft-ms", str(args.ttft_ms), "--tokens-per-second", str(args.tps)]
    where = {"endpoint_url": url, "region_name": "us-east-1"}
    keys = {"aws_access_key_id": "bench", "aws_secret_access_key": "bench"}
    provider = BedrockProvider(model_id="m", max_concurrent_runs=args.runs, credentials=keys, **where)
    config = AioConfig(max_pool_connections=args.runs)
    with process(emulator, cwd=ROOT):
        await wait_until_up(url + "/_emulator/records")
        async with AioSession().create_client("bedrock-runtime", config=config, **where, **keys) as client:

            def request(text: str) -> ModelRequest:
                return ModelRequest([{"role": "user", "content": [{"text": text}]}])

            async def aiobotocore_reader(text: str) -> int:
                response = await client.converse_stream(**provider.request_kwargs(request(text)))
                return sum(["contentBlockDelta" in event async for event in response["stream"]])

            async def provider_reader(text: str) -> int:
                return sum(
                    ["contentBlockDelta" in event async for event in provider.raw_stream(request(text))]
                )

            readers = {"aiobotocore EventStream": aiobotocore_reader, "provider": provider_reader}
            results: dict[str, list[float]] = {name: [] for name in readers}
            for name, read in readers.items():  # warm both pools and code paths
                await asyncio.gather(*(read(f"warm {name} {n} [emu:tokens=5]") for n in range(args.runs)))
            for round_no in range(args.rounds):
                for name, read in readers.items():
                    started = time.process_time()
                    tokens = await asyncio.gather(
                        *(read(f"{name} {round_no} {n} [emu:tokens={args.tokens}]") for n in range(args.runs))
                    )
                    cpu = time.process_time() - started
                    results[name].append(round(cpu / max(sum(tokens), 1) * 1e6, 1))
        await provider.close()
    medians = {name: statistics.median(values) for name, values in results.items()}
    return {
        "runs": args.runs,
        "tokens_per_run": args.tokens,
        "cpu_us_per_token": results,
        "median_cpu_us_per_token": medians,
        "provider_over_aiobotocore": round(medians["provider"] / medians["aiobotocore EventStream"], 3),
    }


def report(summary: dict[str, object]) -> None:
    """Print the figures for people."""
    print(
        f"{summary['runs']} concurrent runs, {summary['tokens_per_run']} tokens each at "
        f"{summary['tokens_per_second']} tokens/s (TTFT {summary['ttft_ms']} ms)"
    )
    for name, rounds in summary["results"].items():  # type: ignore[attr-defined]
        for r in rounds:
            traced = ""
            if "spans_per_query" in r:
                traced = (
                    f"; {r['spans_per_query']} spans received per query {r['spans_by_name']}"
                    f"{'' if r['spans_all_exported'] else ' (NOT every query exported in time)'}"
                    f", {r['export_wait_s']} s waited for the load's spans "
                    f"(idle {r['idle_cpu_ms_per_s']} ms CPU/s: {r['idle_cpu_taken_off_s']} s taken off)"
                )
            print(
                f"  {name:10} threads {r['threads_idle']} idle, {r['threads_max_under_load']} max under load, "
                f"upstream connections {r['upstream_connections_idle']} kept after warming, "
                f"{r['upstream_connections_max']} max under load; "
                f"CPU {r['service_cpu_s']} s for {r['tokens']} tokens = {r['cpu_us_per_token']} us/token"
                f"{traced}{'' if r['all_done'] else '  (NOT every run ended with done)'}"
            )
    for name, median in summary["median_cpu_us_per_token"].items():  # type: ignore[attr-defined]
        spread = summary["rounds_spread"][name]  # type: ignore[index]
        print(f"  {name}: median {median} us/token, rounds {spread['low']}x to {spread['high']}x the median")
    for pair, figures in summary["comparisons"].items():  # type: ignore[attr-defined]
        print(
            f"  CPU per token (medians of rounds), {pair}: {figures['ratio']} "
            f"({figures['us_per_token_added']:+} us/token)"
        )


def main() -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--tokens", type=int, default=150)
    parser.add_argument("--tps", type=float, default=75.0, help="emulator tokens per second")
    parser.add_argument("--ttft-ms", type=float, default=900.0, help="emulator time to first token")
    parser.add_argument(
        "--baseline",
        action="append",
        default=[],
        metavar="REF",
        help="also run the service as of this git ref (repeatable)",
    )
    parser.add_argument("--rounds", type=int, default=1, help="alternating rounds per tree")
    parser.add_argument(
        "--agents",
        type=int,
        default=0,
        metavar="N",
        help="also run this tree with N named agents on the same upstream, the runs spread over them",
    )
    parser.add_argument(
        "--traces",
        choices=("off", "on", "both"),
        default="off",
        help="this tree with OpenTelemetry traces off, on (to a receiver of its own), or both",
    )
    parser.add_argument("--aa", action="store_true", help="run this tree twice each round: the A/A noise")
    parser.add_argument(
        "--decode-only", action="store_true", help="the intake alone: aiobotocore's reader against ours"
    )
    parser.add_argument("--json", action="store_true", help="print JSON only")
    args = parser.parse_args()
    # Traces are on exactly where this benchmark puts them, not wherever the caller's shell did.
    for name in [name for name in os.environ if name.startswith("OTEL_")]:
        del os.environ[name]
    if args.decode_only:
        result = asyncio.run(decode_only(args))
        if args.json:
            print(json.dumps(result))
            return
        print(
            f"{args.runs} concurrent ConverseStreams of {args.tokens} tokens, this process's CPU per token (us):"
        )
        for name, values in result["cpu_us_per_token"].items():  # type: ignore[attr-defined]
            print(f"  {name:24} {values}")
        print(f"  provider / aiobotocore EventStream (medians): {result['provider_over_aiobotocore']}")
        return
    summary = asyncio.run(compare(args))
    if args.json:
        print(json.dumps(summary))
    else:
        report(summary)


if __name__ == "__main__":
    main()
