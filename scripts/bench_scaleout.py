"""Benchmark: the service scaled out on Redis — throughput, fan-out latency, and what Redis costs.

    python scripts/bench_scaleout.py                     # configurations a, b, c; 3 rounds
    python scripts/bench_scaleout.py --quick --json      # scaled down, machine-readable
    python scripts/bench_scaleout.py --configs a         # memory only: no Redis needed
    python scripts/bench_scaleout.py --private-redis     # a redis-server of its own

Each configuration is a fresh set of service processes (``python -m service --port P``, the
embedded emulator, ``AGENT_EMULATOR_TOKENS_PER_SECOND=0``) and this client:

- a: one instance, in-memory event log;
- b: one instance on Redis (``AGENT_REDIS_URL``);
- c: two instances sharing Redis.

Every Redis configuration gets its own ``AGENT_REDIS_PREFIX`` under one prefix unique to the
run; its keys are deleted (SCAN + UNLINK) when the run ends. The configurations run in
alternation (a, b, c, a, b, c, ...) within one invocation and the figures are medians over the
rounds, so the ratios are same-run.

Scenarios, on the same processes:

1. throughput: ``--sessions`` sessions each run one query of ``--tokens`` tokens, unpaced, with
   one SSE subscriber each (``Last-Event-ID`` = the ``after_id`` of the 202, so it reads the
   whole query). In c, session i is created and its message posted on instance i % 2 and its
   subscriber reads from the other instance, so every event crosses Redis. Events/s = events
   delivered to all subscribers / (last read - first text token read). The subscribers count
   ``id:`` lines in raw chunks and parse nothing. Checked: events delivered against the ids
   logged, and how each query ended (``done``, or ``error:<code>`` when the service cut it).
2. fan-out: one session (on instance 0), ``--fanout-tokens`` tokens paced at ``--tps``, with
   ``--subscribers`` fresh SSE connections round-robin over the instances. Latency = this
   client's clock at read minus the event's ``ts`` (when the service logged it; one clock on
   one machine), over the ``assistant_text`` events of ``--parsed`` subscribers spread evenly
   over the instances and the connection order; the others count raw chunks. In c the
   figures are also split into subscribers on the run's instance and on the other one.
3. cost: b against a from the same run — the service's CPU seconds (user + system, every
   thread, from /proc; the embedded emulator's thread included, the same in both) per
   delivered event in each scenario, and the fan-out latency difference. Redis's own CPU
   (INFO cpu, ``used_cpu_sys + used_cpu_user``) per delivered event is shown beside it; it
   counts whatever else uses that Redis meanwhile, unless ``--private-redis`` starts one
   (``redis-server`` on a free port, no persistence) for this run alone.

``client_cpu`` is this client's CPU seconds over the wall time of the measurement: near 1.0
means the client, not the service, was the limit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scaleout.cluster import CONFIGS  # noqa: E402
from scaleout.report import print_table  # noqa: E402
from scaleout.rounds import bench  # noqa: E402


def main() -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--configs", default="a,b,c", help="comma-separated subset of a, b, c")
    parser.add_argument(
        "--only", choices=["throughput", "fanout"], action="append", help="run only this scenario"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=50, help="throughput: sessions (one subscriber each)")
    parser.add_argument("--tokens", type=int, default=2000, help="throughput: tokens per query (unpaced)")
    parser.add_argument(
        "--ttft-ms", type=int, default=2000, help="throughput: time to first token, to connect first"
    )
    parser.add_argument("--subscribers", type=int, default=200, help="fan-out: SSE subscribers")
    parser.add_argument("--parsed", type=int, default=20, help="fan-out: subscribers that parse every event")
    parser.add_argument("--fanout-tokens", type=int, default=500)
    parser.add_argument("--tps", type=float, default=50.0, help="fan-out: tokens per second")
    parser.add_argument("--fanout-ttft-ms", type=int, default=3000)
    parser.add_argument("--redis-url", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument(
        "--gc-tuning", action=argparse.BooleanOptionalAction, default=True, help="AGENT_GC_TUNING"
    )
    parser.add_argument(
        "--private-redis", action="store_true", help="start a redis-server of its own instead of --redis-url"
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a scenario may take")
    parser.add_argument(
        "--quick", action="store_true", help="scaled down: 1 round, 10 sessions, 40 subscribers"
    )
    parser.add_argument(
        "--connect-concurrency",
        type=int,
        default=50,
        help="SSE subscribers setting up at once (0: all at once; the Redis mode answers 503 past ~100)",
    )
    parser.add_argument("--logs", help="keep each instance's stderr under this directory")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--show", metavar="FILE", help="print the table of a saved --json output and exit")
    if parser.parse_known_args()[0].quick:  # smaller defaults; explicit options still win
        parser.set_defaults(rounds=1, sessions=10, tokens=500, subscribers=40, parsed=10, fanout_tokens=100)
    args = parser.parse_args()
    args.configs = [name.strip() for name in args.configs.split(",") if name.strip()]
    unknown = [name for name in args.configs if name not in CONFIGS]
    if unknown:
        parser.error(f"unknown configuration(s) {unknown}; choose from a, b, c")
    args.scenarios = args.only or ["throughput", "fanout"]
    if args.show:
        print_table(json.loads(Path(args.show).read_text()))
        return
    result = asyncio.run(bench(args))
    if args.json:
        print(json.dumps(result))
    else:
        print_table(result)


if __name__ == "__main__":
    main()
