"""Benchmark: one live answer fanned out to many subscribers, in each protocol the service speaks.

    python scripts/bench_dialects.py                          # 200 subscribers, 3 rounds
    python scripts/bench_dialects.py --subscribers 500 --rounds 5 --json

The emulator, the service and this client in their own processes (``benchlib.stack``). Per round
and per dialect, one session answers a paced query (``--tokens`` at ``--tps``, after a first-token
wait that lets every subscriber connect) while ``--subscribers`` clients follow it from its first
event to its end:

- ``session``: ``GET /sessions/{id}/events`` (``Last-Event-ID: 0``), the service's own dialect;
- ``ai_sdk``: ``GET /api/chat/{id}/stream``, the Vercel AI SDK's UI message stream (``useChat``'s
  resume, which replays the running query from its first event, then follows it);
- ``ag_ui``: ``GET /ag-ui/{id}/events``, AG-UI's events, the same way.

The figure is the service's CPU per log event delivered to one subscriber (the service's CPU over
the round, divided by the query's events times the subscribers), so that dialects that write a
different number of frames per event compare on what they carry; and each dialect's ratio to the
session dialect. Dialects take turns within each round; medians over rounds.
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
from benchlib.api import client_session, wait_idle  # noqa: E402
from benchlib.procs import Meter, raise_open_file_limit  # noqa: E402
from benchlib.stack import ServiceStack  # noqa: E402

ENV = {"AGENT_MAX_SESSIONS": "100000", "AGENT_MERGE_DELTAS_AFTER": "1000000", "AGENT_DATABASE_URL": ""}
DIALECTS = {
    "session": ("/sessions/{id}/events", {"Last-Event-ID": "0"}, b"event: done"),
    "ai_sdk": ("/api/chat/{id}/stream", {}, b"data: [DONE]"),
    "ag_ui": ("/ag-ui/{id}/events", {}, b'"type":"RUN_FINISHED"'),
}


async def follow(http: aiohttp.ClientSession, url: str, headers: dict[str, str], end: bytes) -> int:
    """Read one stream until its end mark; the bytes read."""
    read = 0
    async with http.get(url, headers=headers) as response:
        if response.status != 200:
            raise RuntimeError(f"{url}: HTTP {response.status}")
        tail = b""
        async for chunk in response.content.iter_any():
            read += len(chunk)
            if end in tail + chunk:
                return read
            tail = chunk[-64:]
    raise RuntimeError(f"{url}: ended without {end!r}")


async def one_round(
    args: argparse.Namespace, http: aiohttp.ClientSession, stack: ServiceStack, name: str
) -> dict[str, float]:
    path, headers, end = DIALECTS[name]
    session_id = f"bench-{name}-{id(args)}-{asyncio.get_running_loop().time():.0f}"[:120].replace(".", "-")
    # A client-chosen id: made on first use by the AI SDK route, with the query started there.
    body = {
        "id": session_id,
        "messages": [
            {
                "id": "u1",
                "role": "user",
                "parts": [
                    {
                        "type": "text",
                        "text": f"go [emu:tokens={args.tokens}] [emu:tps={args.tps}] [emu:ttft={args.ttft_ms}]",
                    }
                ],
            }
        ],
        "trigger": "submit-message",
    }
    with Meter(stack.pid) as meter:
        starter = await http.post(stack.url + "/api/chat", json=body)
        if starter.status != 200:
            raise RuntimeError(f"POST /api/chat: HTTP {starter.status} {await starter.text()}")
        url = stack.url + path.format(id=session_id)
        readers = [asyncio.create_task(follow(http, url, headers, end)) for _ in range(args.subscribers)]
        read = await asyncio.gather(*readers)
        await starter.read()
        starter.release()
        last_id = await wait_idle(http, stack.url, session_id)
    events = last_id  # the session holds this one query: its events are ids 1..last_id
    return {
        "cpu_us_per_event": meter.server_cpu / (events * args.subscribers) * 1e6,
        "bytes_per_event": statistics.mean(read) / events,
        "events": events,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    raise_open_file_limit(args.subscribers * 2 + 1024)
    results: dict[str, list[dict[str, float]]] = {name: [] for name in args.dialects}
    async with ServiceStack(ENV) as stack, client_session(total=600) as http:
        for _ in range(args.rounds):
            for name in args.dialects:
                results[name].append(await one_round(args, http, stack, name))
    summary: dict[str, Any] = {"subscribers": args.subscribers, "tokens": args.tokens, "rounds": args.rounds}
    for name, rounds in results.items():
        summary[name] = {
            "cpu_us_per_event": round(statistics.median(r["cpu_us_per_event"] for r in rounds), 3),
            "bytes_per_event": round(statistics.median(r["bytes_per_event"] for r in rounds), 1),
            "rounds": [round(r["cpu_us_per_event"], 3) for r in rounds],
        }
    if "session" in summary:
        base = summary["session"]["cpu_us_per_event"]
        for name in args.dialects:
            summary[name]["over_session"] = round(summary[name]["cpu_us_per_event"] / base, 3)
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--subscribers", type=int, default=200)
    parser.add_argument("--tokens", type=int, default=300)
    parser.add_argument("--tps", type=float, default=100.0)
    parser.add_argument("--ttft-ms", type=int, default=2000, help="time for every subscriber to connect")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dialects", nargs="+", choices=list(DIALECTS), default=list(DIALECTS))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    summary = asyncio.run(run(args))
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    print(
        f"one paced answer ({args.tokens} tokens at {args.tps:g}/s) to {args.subscribers} subscribers per "
        f"dialect; medians of {args.rounds} alternating rounds"
    )
    print(f"  {'dialect':<10} {'CPU us per event delivered':>28} {'bytes per event':>16} {'x session':>10}")
    for name in args.dialects:
        row = summary[name]
        print(
            f"  {name:<10} {row['cpu_us_per_event']:>28.3f} {row['bytes_per_event']:>16.1f} "
            f"{row.get('over_session', float('nan')):>10.3f}"
        )


if __name__ == "__main__":
    main()
