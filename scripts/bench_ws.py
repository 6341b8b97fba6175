"""Benchmark: the cost of an event over WebSocket against SSE, and memory per idle WebSocket.

    python scripts/bench_ws.py                      # 100 subscribers x ~1,000 events, 3 rounds
    python scripts/bench_ws.py --subscribers 200 --idle 5000 --json

Processes as in production: the emulator, the service (pointed at the emulator as at Bedrock)
and this client. One session's log is filled with about 1,000 events by a real query; then, in
alternating rounds, the same number of subscribers replay it from the start over SSE
(``Last-Event-ID: 0``) and over WebSocket (``subscribe`` with ``last_event_id: 0``). It reports
events/s delivered and the service's CPU-seconds per delivered event for each, and their ratio.
Then it opens many WebSockets, each subscribed to an idle session, and reports the service's
resident memory per connection.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib.api import client_session, create_session, fill_session  # noqa: E402
from benchlib.procs import Meter, raise_open_file_limit, rss_bytes  # noqa: E402
from benchlib.stack import ServiceStack  # noqa: E402
from benchlib.streams import count_id_lines, open_idle_ws, sse_replay, ws_replay  # noqa: E402


async def fan_out(
    args: argparse.Namespace, url: str, pid: int, http: aiohttp.ClientSession
) -> dict[str, Any]:
    """Alternating rounds of SSE and WebSocket replay to the same number of subscribers."""
    session_id, last_id = await fill_session(http, url, args.tokens)
    events_url = url + f"/sessions/{session_id}/events"
    results: dict[str, list[tuple[float, float]]] = {"sse": [], "ws": []}
    for _ in range(args.rounds):
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
            results[transport].append((delivered / meter.wall, meter.server_cpu / delivered * 1e6))
    summary: dict[str, Any] = {
        "events_in_log": last_id,
        "subscribers": args.subscribers,
        "rounds": args.rounds,
    }
    for transport, runs in results.items():
        summary[transport] = {
            "events_per_s": round(statistics.median(rate for rate, _ in runs)),
            "server_cpu_us_per_event": round(statistics.median(cost for _, cost in runs), 2),
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


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    """Start the processes and run both scenarios."""
    raise_open_file_limit(args.idle * 2 + 1024)
    env = {
        "AGENT_MERGE_DELTAS_AFTER": "1000000",  # compare the per-event cost, not merging
        "AGENT_MAX_SESSIONS": "100000",
    }
    async with ServiceStack(env) as stack:
        async with client_session(total=600) as http:
            result = {"fan_out": await fan_out(args, stack.url, stack.pid, http)}
        if args.idle:
            result["idle_websockets"] = await idle_sockets(args, stack.url, stack.pid)
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
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = asyncio.run(bench(args))
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
    if "idle_websockets" in result:
        idle = result["idle_websockets"]
        print(
            f"{idle['connections']} idle WebSockets: {idle['rss_per_connection_bytes']:,} bytes of server RSS each"
        )


if __name__ == "__main__":
    main()
