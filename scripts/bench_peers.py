"""Benchmark suite: the service side by side with its peers, on pinned cores, in one invocation.

    python scripts/bench_peers.py                         # every scenario, 3 alternating rounds
    python scripts/bench_peers.py --quick                 # a fast smoke version of every scenario
    python scripts/bench_peers.py --only replay --only live --rounds 5 --json
    python scripts/bench_peers.py --only replay --only live --baseline HEAD~1   # before/after

Every server under test (the service, each peer) runs on CPU 1 and this client on CPU 0. The
emulator stands in for Bedrock, a remote service, so it runs on CPU 0 too, out of the service's
core (``--emulator-cpu 1`` puts it on the server's core; its CPU use is printed in the
concurrency scenario, where it streams tens of thousands of tokens a second).

In every scenario the targets take turns round by round (A B C A B C ...) and the medians are
printed, with the ratios, and the server's CPU time per delivered event next to every
throughput (``/proc/<pid>/stat``; the client's own CPU use is printed too, so a saturated client
shows). The peers (``pip install -e '.[bench]'``; a missing one prints "not installed"):

- bare aiohttp-sse: a handler sending pre-encoded events from a list (``bench_fanout.py
  --serve-ceiling``, the framework's ceiling), and for the live and idle scenarios the same
  handler broadcasting from a queue per subscriber;
- FastAPI + sse-starlette on uvicorn (asyncio loop, httptools when installed): an
  ``EventSourceResponse`` over an async generator with the same ``id``/``event``/``data`` lines;
- websockets (``compression=None``): the service's own WebSocket frames, pre-encoded.

Scenarios (``--only NAME``):

1. ``replay``: one session whose log holds a finished query of ~1,000 events, 100 SSE
   subscribers replaying it from ``Last-Event-ID: 0``; events/s and CPU us/event. Delta merging
   is off (``AGENT_MERGE_DELTAS_AFTER=1000000``) so that all send the same events; events are
   counted by their frame ends.
   The service writes a reader's batch in one write; the bare handler one write per event.
2. ``ws``: the same replay over ``/ws`` (``subscribe`` with ``last_event_id: 0``, frames until
   ``done``) against a bare websockets server sending the same frames.
3. ``live``: one paced answer (50 tokens/s, 500 tokens) to 100, 1,000 and 5,000 subscribers
   (``--subscribers N[,N...]`` for others) over SSE, WebSocket or the AI SDK's resume stream
   (``--dialect``); latency = when a subscriber's read returned a token minus when the model
   produced it (the emulator's own record, ``--record-token-times``), for every token at every
   subscriber, merged deltas counted by their text. The subscribers are read by
   ``--client-procs`` processes (default one per 10,000) pinned to the client's CPU, each one's
   CPU printed; ``--workers N`` runs the service as N workers on a private Redis. The peers (SSE
   only, one process; ``--no-peers`` leaves them out) broadcast the same texts every 20 ms and
   say when they produced each. See ``peers/live.py`` and ``peers/viewers.py``.
4. ``concurrency``: 200 and 500 concurrent ``POST /agent/stream`` runs, each paced by
   ``[emu:ttft=600..1200]`` and ``[emu:tps=50..150]``: the gap between tokens minus 1/tps, the
   first-token time the service adds, and the event-loop lag (``/healthz?lag_since=``). No peer
   runs an agent, so this one is the service alone.
5. ``idle``: 10,000 idle SSE and 10,000 idle WebSocket connections, server RSS per connection
   (a fresh process per round).
6. ``slow``: one session, 50 SSE subscribers and (every other round) one that never reads (raw
   socket, tiny ``SO_RCVBUF``), an unpaced answer of 40,000 tokens with delta merging off (merged,
   a stalled reader's backlog fits in the kernel's socket buffers): the service's RSS growth, the
   normal subscribers' latency with and without it, and whether the service still holds it.

``--baseline GIT_REF`` also runs ``replay``, ``ws`` and ``live`` against the service as of that ref
(a temporary ``git worktree``, ``python -m service`` with that tree on ``PYTHONPATH``, the same
venv and the same emulator), in the same alternation, and prints current / baseline ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib.procs import CLIENT_CPU, SERVER_CPU, can_pin, raise_open_file_limit  # noqa: E402
from benchlib.stack import baseline_tree  # noqa: E402
from peers.concurrency import scenario_concurrency  # noqa: E402
from peers.config import PEERS, Config, installed  # noqa: E402
from peers.idle import scenario_idle  # noqa: E402
from peers.live import scenario_live  # noqa: E402
from peers.replay import scenario_replay, scenario_ws  # noqa: E402
from peers.report import report  # noqa: E402
from peers.servers import serve_peer  # noqa: E402
from peers.slow import scenario_slow  # noqa: E402
from peers.viewers import viewers_main  # noqa: E402

SCENARIOS: dict[str, Callable[[Config], Awaitable[dict[str, Any]]]] = {
    "replay": scenario_replay,
    "ws": scenario_ws,
    "live": scenario_live,
    "concurrency": scenario_concurrency,
    "idle": scenario_idle,
    "slow": scenario_slow,
}


def main() -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--only", choices=list(SCENARIOS), action="append", help="run this scenario (repeatable)"
    )
    parser.add_argument(
        "--rounds", type=int, help="alternating rounds per scenario (default 3, 1 with --quick)"
    )
    parser.add_argument("--quick", action="store_true", help="a fast smoke version of every scenario")
    parser.add_argument("--baseline", metavar="GIT_REF", help="also run replay, ws and live against this ref")
    parser.add_argument(
        "--emulator-cpu",
        type=int,
        choices=[CLIENT_CPU, SERVER_CPU],
        default=CLIENT_CPU,
        help="the core of the emulator (default: the client's)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON only")
    live = parser.add_argument_group("live")
    live.add_argument("--subscribers", metavar="N[,N...]", help="live: these sizes (default 100,1000,5000)")
    live.add_argument(
        "--dialect", choices=["sse", "ws", "aisdk"], default="sse", help="live: how the subscribers follow"
    )
    live.add_argument(
        "--client-pause-ms",
        type=float,
        default=0.0,
        metavar="MS",
        help="live: each client process pauses this long before every epoll_wait (0: none)",
    )
    live.add_argument(
        "--client-procs", type=int, default=0, metavar="K", help="live: client processes (0: one per 10,000)"
    )
    live.add_argument(
        "--workers",
        type=int,
        default=0,
        metavar="N",
        help="live: the service as N workers on a private Redis",
    )
    live.add_argument("--no-peers", action="store_true", help="live: the service (and baseline) alone")
    parser.add_argument("--serve-peer", nargs=3, metavar=("KIND", "PORT", "FILE"), help=argparse.SUPPRESS)
    parser.add_argument("--viewers", metavar="SPEC", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_peer:
        serve_peer(args.serve_peer[0], int(args.serve_peer[1]), args.serve_peer[2])
        return
    if args.viewers:
        viewers_main(args.viewers)
        return

    cfg = Config.quick() if args.quick else Config()
    cfg.logs = Path(tempfile.mkdtemp(prefix="bench_peers-logs-"))
    if args.rounds:
        cfg.rounds = args.rounds
    cfg.emulator_cpu = args.emulator_cpu
    if args.subscribers:
        cfg.live_sizes = tuple(int(n.replace("_", "")) for n in args.subscribers.split(","))
    cfg.live_dialect, cfg.client_procs, cfg.workers = args.dialect, args.client_procs, args.workers
    cfg.client_pause_ms = args.client_pause_ms
    cfg.peers = not args.no_peers
    if cfg.workers:
        cfg.notes.append(
            f"live: the service as {cfg.workers} workers on a private Redis, unpinned (both cores)"
        )
    raise_open_file_limit()
    if can_pin():
        os.sched_setaffinity(0, {CLIENT_CPU})
    else:
        cfg.notes.append("fewer than 2 CPUs available: nothing is pinned")
    names = args.only or list(SCENARIOS)
    result: dict[str, Any] = {}
    try:
        run_scenarios(args, cfg, names, result)
    except BaseException:
        print(f"bench_peers: failed; the servers' stderr is in {cfg.logs}", file=sys.stderr)
        raise
    shutil.rmtree(cfg.logs, ignore_errors=True)
    result["config"] = {
        "rounds": cfg.rounds,
        "quick": args.quick,
        "pinned": can_pin(),
        "emulator_cpu": cfg.emulator_cpu,
        "baseline": cfg.baseline_ref or None,
        "peers_installed": {peer: installed(peer) for peer in PEERS},
    }
    if args.json:
        print(json.dumps(result))
    else:
        report(result, cfg)


def run_scenarios(args: argparse.Namespace, cfg: Config, names: list[str], result: dict[str, Any]) -> None:
    """Run the chosen scenarios (with the baseline's worktree around them when asked)."""
    with contextlib.ExitStack() as stack:
        if args.baseline and {"replay", "ws", "live"} & set(names):
            cfg.baseline = stack.enter_context(baseline_tree(args.baseline))
            cfg.baseline_ref = args.baseline
            cfg.notes.append(f"baseline: the service as of {args.baseline} (a temporary worktree)")
        for name in names:
            started = time.monotonic()
            result[name] = asyncio.run(SCENARIOS[name](cfg))
            result[name]["seconds"] = round(time.monotonic() - started, 1)
            if not args.json:
                print(f"[{name} done in {result[name]['seconds']} s]", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
