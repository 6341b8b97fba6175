"""Benchmark: the session database adds no per-token cost.

    python scripts/bench_database.py                 # 2 alternating rounds, briefly
    python scripts/bench_database.py --rounds 3 --json

Runs the existing benchmarks in one invocation, taking turns between the service with the
database on (``AGENT_DATABASE_URL`` a fresh SQLite file) and off (``AGENT_DATABASE_URL=``):

- ``bench_fanout.py --only live``: one session's paced answer to many SSE subscribers (the
  session is recorded when its query starts and ends; the tokens are not);
- ``bench_concurrency.py``: many concurrent ``POST /agent/stream`` runs (short-lived sessions,
  which are never recorded: the database is only started and migrated).

Medians per setting, and on / off ratios (1.0: the same; above: the database costs).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

SCRIPTS = Path(__file__).resolve().parent
ROOT = SCRIPTS.parent


def run(script: str, arguments: list[str], database_url: str) -> dict[str, Any]:
    """One benchmark run, its JSON result."""
    env = {**os.environ, "AGENT_DATABASE_URL": database_url, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / script), *arguments, "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def measures(args: argparse.Namespace, database_url: str) -> dict[str, float]:
    """The numbers compared, from one fan-out and one concurrency run."""
    fanout = run(
        "bench_fanout.py",
        [
            "--only",
            "live",
            "--subscribers",
            str(args.subscribers),
            "--tokens",
            str(args.tokens),
            "--tps",
            "50",
        ],
        database_url,
    )["live"]
    concurrency = run(
        "bench_concurrency.py",
        ["--runs", str(args.runs), "--tokens", "30", "--warm", "50", "--single-repeats", "1"],
        database_url,
    )
    return {
        "fanout_latency_p50_ms": fanout["latency_ms"]["p50"],
        "fanout_latency_p99_ms": fanout["latency_ms"]["p99"],
        "fanout_server_cpu_s": fanout["server_cpu_s"],
        "concurrency_wall_s": concurrency["concurrent_wall_s"],
        "concurrency_first_token_added_p50_ms": concurrency["first_token_added_ms"]["p50"],
    }


def main() -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--subscribers", type=int, default=200)
    parser.add_argument("--tokens", type=int, default=100)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    samples: dict[str, list[dict[str, float]]] = {"on": [], "off": []}
    with tempfile.TemporaryDirectory(prefix="agentstream-bench-db-") as folder:
        for round_ in range(args.rounds):
            url = f"sqlite+aiosqlite:///{folder}/round{round_}.db"
            # Which goes first alternates, so a machine warming up or busy elsewhere favours neither.
            order = [("on", url), ("off", "")] if round_ % 2 == 0 else [("off", ""), ("on", url)]
            for setting, database_url in order:
                samples[setting].append(measures(args, database_url))
    medians = {
        setting: {name: statistics.median(sample[name] for sample in runs) for name in runs[0]}
        for setting, runs in samples.items()
    }
    ratios = {
        name: round(medians["on"][name] / medians["off"][name], 3) if medians["off"][name] else None
        for name in medians["on"]
    }
    result = {"rounds": args.rounds, "medians": medians, "on_over_off": ratios}
    if args.json:
        print(json.dumps(result))
        return
    width = max(len(name) for name in ratios)
    print(f"{'':{width}}  {'db on':>10}  {'db off':>10}  on/off")
    for name, ratio in ratios.items():
        print(f"{name:{width}}  {medians['on'][name]:>10.3f}  {medians['off'][name]:>10.3f}  {ratio}")


if __name__ == "__main__":
    main()
