"""Benchmark: the per-token budget, in CPU microseconds per text token at each stage of the path.

    python scripts/bench_tokens.py                         # every stage; Redis on 127.0.0.1:6379
    python scripts/bench_tokens.py --baseline main         # beside main, rounds alternating
    python scripts/bench_tokens.py --no-e2e --rounds 5     # the in-process stages only
    python scripts/bench_tokens.py --no-redis --json       # memory only, machine-readable

The path of one token: the model's stream is read and decoded, parsed into a canonical event,
appended to the session's log by the run, read by the subscriber's follower, projected into its
dialect and written. The in-process stages (see ``scripts/tokens/stages.py``) time each piece on
its own on the event-loop thread's CPU clock, over one recorded answer of ``--tokens`` tokens
(recorded from the emulator on both wires at the start of the invocation); ``e2e.<store>`` is the
whole path through a real service process (``scripts/tokens/e2e.py``): its CPU time over the
tokens it delivered, with the emulator pacing ``--e2e-sessions`` answers in a process of its own
and one SSE subscriber per session.

``path.<store>`` adds up the stages one token goes through (read.bedrock + run.<store> +
project.session + write.sse); what it leaves out of ``e2e`` is the rest: HTTP requests, the
intake's threads or tasks, the scheduling of the event loop.

Each round runs the in-process stages in a child process (``--source`` says which tree's
``service`` it imports) and then the end-to-end runs; with ``--baseline REF`` the baseline (a
temporary worktree of REF) takes its turn after this tree in every round, so the ratios are
same-run. Figures are medians over rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
if "--source" in sys.argv:  # a child measuring another tree: its ``service`` package comes first
    sys.path.insert(0, sys.argv[sys.argv.index("--source") + 1])

from benchlib import ROOT  # noqa: E402
from benchlib.stack import baseline_tree  # noqa: E402
from benchlib.stats import median, ratio  # noqa: E402

STAGES = [
    "decode.bedrock",
    "parse.bedrock",
    "read.bedrock",
    "parse.openai",
    "event",
    "log.memory",
    "log.redis",
    "run.memory",
    "run.redis",
    "project.session",
    "project.agent",
    "project.ws",
    "write.sse",
]
PATH_PARTS = ["read.bedrock", "run.{store}", "project.session", "write.sse"]


def child(args: argparse.Namespace) -> None:
    """Measure the in-process stages with this process's ``service`` package; print JSON."""
    from tokens.stages import measure

    streams = {name: (Path(args.streams) / f"{name}.bin").read_bytes() for name in ("bedrock", "openai")}
    print(json.dumps(asyncio.run(measure(streams, args.redis_url or None, args.repeats))))


def run_child(args: argparse.Namespace, source: Path, streams: Path) -> dict[str, float]:
    """One child's in-process figures."""
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        "--streams",
        str(streams),
        "--repeats",
        str(args.repeats),
        "--redis-url",
        "" if args.no_redis else args.redis_url,
        "--source",
        str(source),
    ]
    done = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(source)}
    )
    if done.returncode != 0:
        raise RuntimeError(f"the stages of {source} failed:\n{done.stderr}")
    return json.loads(done.stdout)


async def e2e_round(args: argparse.Namespace, source: Path) -> dict[str, float]:
    """The end-to-end figures of one tree for one round."""
    from tokens.e2e import end_to_end

    figures: dict[str, float] = {}
    for store in args.e2e_stores:
        result = await end_to_end(
            source,
            store=store,
            provider=args.provider,
            sessions=args.e2e_sessions,
            tokens=args.e2e_tokens,
            tps=args.tps,
            ttft_ms=args.ttft_ms,
            redis_url=args.redis_url,
        )
        figures[f"e2e.{store}"] = result["us_per_token"]
    return figures


def bench(args: argparse.Namespace) -> dict[str, Any]:
    """Record the streams, run the rounds, and sum up."""
    from tokens.record import record_streams

    with tempfile.TemporaryDirectory(prefix="bench-tokens-") as scratch:
        streams = Path(scratch)
        for name, raw in record_streams(args.tokens).items():
            (streams / f"{name}.bin").write_bytes(raw)
        with baseline_tree(args.baseline) if args.baseline else _no_tree() as baseline:
            targets = {"branch": ROOT, **({"baseline": baseline} if baseline else {})}
            rounds: dict[str, list[dict[str, float]]] = {name: [] for name in targets}
            for number in range(1, args.rounds + 1):
                for name, source in targets.items():
                    print(f"round {number}/{args.rounds}: {name}", file=sys.stderr)
                    figures = run_child(args, source, streams)
                    if args.e2e_stores:
                        figures |= asyncio.run(e2e_round(args, source))
                    rounds[name].append(figures)
    summary = {name: _medians(per_round) for name, per_round in rounds.items()}
    result: dict[str, Any] = {
        "tokens": args.tokens,
        "repeats": args.repeats,
        "rounds": args.rounds,
        "baseline": args.baseline,
        "e2e": {
            "provider": args.provider,
            "sessions": args.e2e_sessions,
            "tokens": args.e2e_tokens,
            "tps": args.tps,
            "ttft_ms": args.ttft_ms,
        },
        "us_per_token": summary,
        "per_round": rounds,
    }
    if "baseline" in summary:
        result["ratio_branch_to_baseline"] = {
            stage: ratio(value, summary["baseline"].get(stage, 0.0))
            for stage, value in summary["branch"].items()
        }
    return result


class _no_tree:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        pass


def _medians(per_round: list[dict[str, float]]) -> dict[str, float]:
    names = [stage for stage in [*STAGES, "e2e.memory", "e2e.redis"] if any(stage in r for r in per_round)]
    figures = {stage: round(median([r[stage] for r in per_round if stage in r]), 2) for stage in names}
    if "read.bedrock" not in figures and "decode.bedrock" in figures and "parse.bedrock" in figures:
        # a tree without the provider's own read loop: botocore's decoding, then the parser
        figures["read.bedrock"] = round(figures["decode.bedrock"] + figures["parse.bedrock"], 2)
    for store in ("memory", "redis"):
        parts = [part.format(store=store) for part in PATH_PARTS]
        if all(part in figures for part in parts):
            figures[f"path.{store}"] = round(sum(figures[part] for part in parts), 2)
    return figures


def print_table(result: dict[str, Any]) -> None:
    """The figures for people."""
    summary = result["us_per_token"]
    names = list(summary["branch"])
    with_baseline = "baseline" in summary
    head = "| stage | µs/token |" + (f" baseline ({result['baseline']}) | ratio |" if with_baseline else "")
    print(head)
    print("|---|---|" + ("---|---|" if with_baseline else ""))
    for stage in names:
        row = f"| {stage} | {summary['branch'][stage]:.2f} |"
        if with_baseline:
            base = summary["baseline"].get(stage)
            row += f" {base:.2f} | {result['ratio_branch_to_baseline'].get(stage)} |" if base else " | |"
        print(row)
    e2e = result["e2e"]
    print(
        f"\n{result['tokens']} tokens per in-process stage, median of {result['repeats']} repeats, "
        f"median of {result['rounds']} round(s); e2e: {e2e['sessions']} sessions x {e2e['tokens']} tokens "
        f"at {e2e['tps']} tokens/s over {e2e['provider']}, one SSE subscriber each"
    )


def main() -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=2000, help="tokens of the recorded answer")
    parser.add_argument("--repeats", type=int, default=5, help="runs of each in-process stage per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", metavar="GIT_REF", help="measure REF too, alternating with this tree")
    parser.add_argument("--redis-url", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument("--no-redis", action="store_true", help="memory stages only")
    parser.add_argument("--no-e2e", action="store_true", help="in-process stages only")
    parser.add_argument("--provider", choices=["bedrock", "openai"], default="bedrock", help="e2e: the wire")
    parser.add_argument("--e2e-sessions", type=int, default=20)
    parser.add_argument("--e2e-tokens", type=int, default=300)
    parser.add_argument("--tps", type=float, default=100.0, help="e2e: tokens per second of each answer")
    parser.add_argument("--ttft-ms", type=float, default=300.0, help="e2e: time to first token")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--streams", help=argparse.SUPPRESS)
    parser.add_argument("--source", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    args.e2e_stores = [] if args.no_e2e else ["memory"] + ([] if args.no_redis else ["redis"])
    result = bench(args)
    if args.json:
        print(json.dumps(result))
    else:
        print_table(result)


if __name__ == "__main__":
    main()
