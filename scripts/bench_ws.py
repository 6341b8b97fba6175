"""Benchmark: the cost of an event over WebSocket against SSE, and memory per idle WebSocket.

    python scripts/bench_ws.py                      # 100 subscribers x ~1,000 events, 3 rounds
    python scripts/bench_ws.py --subscribers 200 --idle 5000 --json
    python scripts/bench_ws.py --baseline main      # the same, against the service as of main too

Processes as in production: the emulator, the service (pointed at the emulator as at Bedrock)
and this client. One session's log is filled with about 1,000 events by a real query; then, in
alternating rounds, the same number of subscribers replay it from the start over SSE
(``Last-Event-ID: 0``) and over WebSocket (``subscribe`` with ``last_event_id: 0``). It reports
events/s delivered and the service's CPU-seconds per delivered event for each, and their ratio.
Then it opens many WebSockets, each subscribed to an idle session, and reports the service's
resident memory per connection.

``--baseline GIT_REF`` also starts the service as of GIT_REF (``baseline``: a temporary ``git
worktree``, the same venv, the same emulator) beside this tree's (``current``), fills a log on
each with the same query (each replay is checked against its own service's event count), and in
each of ``--rounds`` rounds replays over SSE and over WebSocket from current, then from baseline;
the idle WebSockets are then opened on each in turn (once per service, as without it). Added per
figure: the baseline's value and a ratio above 1 when the current tree is better
(``benchlib.baseline``): the *speed ratio* baseline / current CPU per event and current /
baseline events/s, the *memory ratio* baseline / current bytes per idle WebSocket.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib.api import client_session, create_session, fill_session  # noqa: E402
from benchlib.baseline import BASELINE, CURRENT, legend, print_versus, trees, versus  # noqa: E402
from benchlib.procs import Meter, raise_open_file_limit, rss_bytes  # noqa: E402
from benchlib.stack import ServiceStack  # noqa: E402
from benchlib.streams import count_id_lines, open_idle_ws, sse_replay, ws_replay  # noqa: E402


async def replay_round(
    args: argparse.Namespace, http: aiohttp.ClientSession, url: str, pid: int, session_id: str, last_id: int
) -> dict[str, tuple[float, float]]:
    """One round: every subscriber replays the log over SSE, then over WebSocket; per transport
    (events/s, server CPU us per event)."""
    events_url = url + f"/sessions/{session_id}/events"
    figures: dict[str, tuple[float, float]] = {}
    for transport in ("sse", "ws"):
        with Meter(pid) as meter:
            if transport == "sse":
                counts = await asyncio.gather(
                    *(
                        sse_replay(http, events_url, {"Last-Event-ID": "0"}, count_id_lines)
                        for _ in range(args.subscribers)
                    )
                )
            else:
                counts = await asyncio.gather(
                    *(ws_replay(http, url + "/ws", session_id) for _ in range(args.subscribers))
                )
        delivered = sum(counts)
        if delivered != last_id * args.subscribers:
            raise RuntimeError(
                f"{transport}: {delivered} events delivered, expected {last_id * args.subscribers}"
            )
        figures[transport] = (delivered / meter.wall, meter.server_cpu / delivered * 1e6)
    return figures


def summarize(
    args: argparse.Namespace, last_id: int, runs: list[dict[str, tuple[float, float]]]
) -> dict[str, Any]:
    """The medians over rounds of one service's replays."""
    summary: dict[str, Any] = {
        "events_in_log": last_id,
        "subscribers": args.subscribers,
        "rounds": args.rounds,
    }
    for transport in ("sse", "ws"):
        summary[transport] = {
            "events_per_s": round(statistics.median(run[transport][0] for run in runs)),
            "server_cpu_us_per_event": round(statistics.median(run[transport][1] for run in runs), 2),
        }
    summary["ws_over_sse_events_per_s"] = round(
        summary["ws"]["events_per_s"] / summary["sse"]["events_per_s"], 2
    )
    return summary


async def idle_sockets(args: argparse.Namespace, url: str, pid: int) -> dict[str, Any]:
    """Many WebSockets, each subscribed to an idle session: resident memory per connection."""
    async with client_session() as http:
        session_id = await create_session(http, url)
        before = rss_bytes(pid)
        sockets = await open_idle_ws(http, url + "/ws", session_id, args.idle)
        after = rss_bytes(pid)
        for ws in sockets:
            await ws.close()
    return {"connections": len(sockets), "rss_per_connection_bytes": round((after - before) / len(sockets))}


async def bench(args: argparse.Namespace, sources: dict[str, Path]) -> dict[str, Any]:
    """Start the processes (a service per tree in ``sources``) and run both scenarios."""
    raise_open_file_limit(args.idle * 2 + 1024)
    env = {
        "AGENT_MERGE_DELTAS_AFTER": "1000000",  # compare the per-event cost, not merging
        "AGENT_MAX_SESSIONS": "100000",
    }
    async with contextlib.AsyncExitStack() as exits:
        stacks = {
            tree: await exits.enter_async_context(ServiceStack(env, source=source))
            for tree, source in sources.items()
        }
        async with client_session(total=600) as http:
            logs = {tree: await fill_session(http, stack.url, args.tokens) for tree, stack in stacks.items()}
            runs: dict[str, list[dict[str, tuple[float, float]]]] = {tree: [] for tree in stacks}
            for _ in range(args.rounds):
                for tree, stack in stacks.items():
                    runs[tree].append(await replay_round(args, http, stack.url, stack.pid, *logs[tree]))
        results = {tree: {"fan_out": summarize(args, logs[tree][1], runs[tree])} for tree in stacks}
        if args.idle:
            for tree, stack in stacks.items():
                results[tree]["idle_websockets"] = await idle_sockets(args, stack.url, stack.pid)
    result = results[CURRENT]
    if BASELINE in results:
        base = results[BASELINE]
        fan, base_fan = result["fan_out"], base["fan_out"]
        fan[BASELINE] = base_fan
        fan["vs_baseline"] = {
            f"{transport}_{key}": row
            for transport in ("sse", "ws")
            for key, row in versus(
                fan[transport],
                base_fan[transport],
                costs=["server_cpu_us_per_event"],
                rates=["events_per_s"],
            ).items()
        }
        if args.idle:
            idle, base_idle = result["idle_websockets"], base["idle_websockets"]
            idle[BASELINE] = dict(base_idle)
            idle["vs_baseline"] = versus(idle, base_idle, memory=["rss_per_connection_bytes"])
        result[BASELINE] = legend(args.baseline)
    return result


def main() -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--subscribers", type=int, default=100)
    parser.add_argument("--tokens", type=int, default=990, help="text tokens of the query that fills the log")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--idle", type=int, default=5000, help="idle WebSockets to open (0 to skip)")
    parser.add_argument(
        "--baseline", metavar="GIT_REF", help="also run both scenarios against the service as of this ref"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with contextlib.ExitStack() as exits:
        result = asyncio.run(bench(args, trees(exits, args.baseline)))
    if args.json:
        print(json.dumps(result))
        return
    fan = result["fan_out"]
    print(
        f"replay of {fan['events_in_log']} events to {fan['subscribers']} subscribers, median of {fan['rounds']} rounds"
    )
    for transport in ("sse", "ws"):
        figures = fan[transport]
        print(
            f"  {transport:3}: {figures['events_per_s']:>9,} events/s, "
            f"{figures['server_cpu_us_per_event']} us of server CPU per event"
        )
    print(f"  WebSocket / SSE events/s: {fan['ws_over_sse_events_per_s']}")
    if "vs_baseline" in fan:
        base = fan[BASELINE]
        for transport in ("sse", "ws"):
            figures = base[transport]
            print(
                f"  {transport:3} of baseline {args.baseline} ({base['events_in_log']} events in its log): "
                f"{figures['events_per_s']:>9,} events/s, "
                f"{figures['server_cpu_us_per_event']} us of server CPU per event"
            )
        print_versus(fan["vs_baseline"], args.baseline)
    if "idle_websockets" in result:
        idle = result["idle_websockets"]
        print(
            f"{idle['connections']} idle WebSockets: {idle['rss_per_connection_bytes']:,} bytes of server RSS each"
        )
        if "vs_baseline" in idle:
            print_versus(idle["vs_baseline"], args.baseline)


if __name__ == "__main__":
    main()
