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
import os
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _benchlib import free_port, process, wait_until_up  # noqa: E402

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def rss_bytes(pid: int) -> int:
    """Resident memory of a process, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


async def fill_session(http: aiohttp.ClientSession, url: str, tokens: int) -> tuple[str, int]:
    """A session whose log holds a finished query of ``tokens`` text tokens; its id and last id."""
    async with http.post(url + "/sessions", json={}) as response:
        session_id = (await response.json())["id"]
    async with http.post(
        url + f"/sessions/{session_id}/messages", json={"content": f"fill [emu:tokens={tokens}]"}
    ):
        pass
    while True:  # the query runs in the background; its status says when it is done
        async with http.get(url + f"/sessions/{session_id}") as response:
            body = await response.json()
        if body["status"] == "idle" and body["last_event_id"] > tokens:
            return session_id, body["last_event_id"]
        await asyncio.sleep(0.05)


async def sse_reader(http: aiohttp.ClientSession, url: str, session_id: str) -> int:
    """Replay the whole log over SSE; the number of events read."""
    count = 0
    async with http.get(url + f"/sessions/{session_id}/events", headers={"Last-Event-ID": "0"}) as response:
        async for line in response.content:
            if line.startswith(b"id:"):
                count += 1
    return count


async def ws_reader(http: aiohttp.ClientSession, url: str, session_id: str, last_id: int) -> int:
    """Replay the whole log over WebSocket; the number of events read."""
    count = 0
    async with http.ws_connect(url + "/ws") as ws:
        await ws.send_str(json.dumps({"type": "subscribe", "session_id": session_id, "last_event_id": 0}))
        async for message in ws:
            if message.type != aiohttp.WSMsgType.TEXT:
                break
            if '"id":' in message.data:
                count += 1
                if f'"id":{last_id},' in message.data:
                    break
    return count


async def fan_out(
    args: argparse.Namespace, url: str, pid: int, http: aiohttp.ClientSession
) -> dict[str, Any]:
    """Alternating rounds of SSE and WebSocket replay to the same number of subscribers."""
    session_id, last_id = await fill_session(http, url, args.tokens)
    results: dict[str, list[tuple[float, float]]] = {"sse": [], "ws": []}
    for _ in range(args.rounds):
        for transport in ("sse", "ws"):
            cpu_before, started = cpu_seconds(pid), time.monotonic()
            if transport == "sse":
                counts = await asyncio.gather(
                    *(sse_reader(http, url, session_id) for _ in range(args.subscribers))
                )
            else:
                counts = await asyncio.gather(
                    *(ws_reader(http, url, session_id, last_id) for _ in range(args.subscribers))
                )
            elapsed, cpu = time.monotonic() - started, cpu_seconds(pid) - cpu_before
            delivered = sum(counts)
            if delivered != last_id * args.subscribers:
                raise RuntimeError(
                    f"{transport}: {delivered} events delivered, expected {last_id * args.subscribers}"
                )
            results[transport].append((delivered / elapsed, cpu / delivered * 1e6))
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
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        async with http.post(url + "/sessions", json={}) as response:
            session_id = (await response.json())["id"]
        before = rss_bytes(pid)
        sockets = []

        async def open_one() -> aiohttp.ClientWebSocketResponse:
            ws = await http.ws_connect(url + "/ws", heartbeat=None)
            await ws.send_str(json.dumps({"type": "subscribe", "session_id": session_id}))
            for _ in range(2):  # subscribed, then the status
                await ws.receive()
            return ws

        for start in range(0, args.idle, 500):
            sockets += await asyncio.gather(*(open_one() for _ in range(min(500, args.idle - start))))
        after = rss_bytes(pid)
        for ws in sockets:
            await ws.close()
    return {"connections": len(sockets), "rss_per_connection_bytes": round((after - before) / len(sockets))}


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    """Start the processes and run both scenarios."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, args.idle * 2 + 1024)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    emulator_port, service_port = free_port(), free_port()
    emulator_url = f"http://127.0.0.1:{emulator_port}"
    url = f"http://127.0.0.1:{service_port}"
    service_env = {
        "AGENT_PROVIDER": "bedrock",
        "AGENT_PORT": str(service_port),
        "AGENT_MERGE_DELTAS_AFTER": "1000000",  # compare the per-event cost, not merging
        "AGENT_MAX_SESSIONS": "100000",
        "AWS_ENDPOINT_URL_BEDROCK_RUNTIME": emulator_url,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
    }
    emulator_cmd = [sys.executable, "-m", "service.emulator", "--port", str(emulator_port)]
    with process(emulator_cmd, {}), process([sys.executable, "-m", "service"], service_env) as service:
        await wait_until_up(emulator_url + "/_emulator/records")
        await wait_until_up(url + "/healthz")
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=600)
        ) as http:
            result = {"fan_out": await fan_out(args, url, service.pid, http)}
        if args.idle:
            result["idle_websockets"] = await idle_sockets(args, url, service.pid)
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
