"""Benchmark: how soon a session event reaches an MCP client as a log notification (seed 004: 100 ms).

    python scripts/bench_mcp.py                       # 1, 10 and 50 MCP clients, 3 queries each
    python scripts/bench_mcp.py --clients 1 10 100 --queries 5 --json

Processes as in production: the emulator, the service (pointed at the emulator as at Bedrock) and
this script, whose clients are the official ``mcp`` SDK client over real HTTP. Each client opens
its MCP session, sets the logging level, and asks ``--queries`` questions in turn with
``session_message``; the emulator streams each answer at ``--tps`` tokens a second. For every
notification the script takes the time it arrived minus the event's ``ts`` (the moment the service
appended it to the session's log; both clocks are this machine's), and reports p50, p99 and max
for each number of clients, with the service's CPU use.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib.procs import cpu_seconds  # noqa: E402
from benchlib.stack import ServiceStack  # noqa: E402
from benchlib.stats import percentile  # noqa: E402

from service.loadtest.sse import read_events  # noqa: E402


async def one_client(url: str, queries: int, tokens: int, tps: int, delays: list[float]) -> int:
    """One MCP client: its queries one after another; the events it received."""
    ended = asyncio.Event()
    received = 0

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        nonlocal received
        arrived = time.time()
        data = params.data
        if isinstance(data, dict) and "ts" in data:
            delays.append(arrived - data["ts"])
            received += 1
            if data["type"] in ("done", "error"):
                ended.set()

    http = httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=300))
    async with http, Client(streamable_http_client(url, http_client=http), logging_callback=on_log) as mcp:
        await mcp.set_logging_level("info")
        session_id = None
        for n in range(queries):
            ended.clear()
            arguments: dict[str, Any] = {"content": f"question {n} [emu:tokens={tokens}] [emu:tps={tps}]"}
            if session_id:
                arguments["session_id"] = session_id
            result = await mcp.call_tool("session_message", arguments)
            assert not result.is_error, result.structured_content
            session_id = (result.structured_content or {})["session_id"]
            await asyncio.wait_for(ended.wait(), 120)
    return received


async def one_raw_client(url: str, queries: int, tokens: int, tps: int, delays: list[float]) -> int:
    """The same as :func:`one_client` with a minimal hand-written MCP client on aiohttp (reads SSE
    and nothing more), so that the figure is the service's, not a heavy client's."""
    import aiohttp

    accept = {"Accept": "application/json, text/event-stream"}
    received = 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as http:
        ids = iter(range(1, 1_000_000))

        async def rpc(method: str, params: dict[str, Any], headers: dict[str, str]) -> Any:
            message = {"jsonrpc": "2.0", "id": next(ids), "method": method, "params": params}
            async with http.post(url, json=message, headers=headers) as response:
                return response.headers.get("Mcp-Session-Id"), await response.json()

        init = {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "bench", "version": "1"},
        }
        mcp_session, _ = await rpc("initialize", init, accept)
        headers = {**accept, "Mcp-Session-Id": mcp_session, "MCP-Protocol-Version": "2025-06-18"}
        await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
        await rpc("logging/setLevel", {"level": "info"}, headers)
        stream = await http.get(url, headers={"Accept": "text/event-stream", "Mcp-Session-Id": mcp_session})
        events = read_events(stream.content)  # one reader for every query: the stream goes on
        session_id = None
        try:
            for n in range(queries):
                arguments: dict[str, Any] = {"content": f"question {n} [emu:tokens={tokens}] [emu:tps={tps}]"}
                if session_id:
                    arguments["session_id"] = session_id
                _, reply = await rpc(
                    "tools/call", {"name": "session_message", "arguments": arguments}, headers
                )
                session_id = reply["result"]["structuredContent"]["session_id"]
                async for _, _, message in events:
                    if not message.startswith("{"):
                        continue
                    arrived = time.time()
                    data = json.loads(message)["params"]["data"]
                    delays.append(arrived - data["ts"])
                    received += 1
                    if data["type"] in ("done", "error"):
                        break
        finally:
            stream.close()
    return received


async def round_of(
    url: str, clients: int, args: argparse.Namespace, pid: int, emulator_pid: int
) -> dict[str, Any]:
    """``clients`` clients at once: the delay of every notification, and each process's CPU use."""
    delays: list[float] = []
    cpu_before, started = cpu_seconds(pid), time.monotonic()
    emulator_before = cpu_seconds(emulator_pid)
    own_before = time.process_time()
    run = one_raw_client if args.client == "raw" else one_client
    counts = await asyncio.gather(
        *(run(url, args.queries, args.tokens, args.tps, delays) for _ in range(clients))
    )
    elapsed = time.monotonic() - started
    ms = [d * 1000 for d in delays]
    return {
        "clients": clients,
        "notifications": sum(counts),
        "p50_ms": round(percentile(ms, 0.50), 2),
        "p99_ms": round(percentile(ms, 0.99), 2),
        "max_ms": round(max(ms), 2),
        "mean_ms": round(statistics.fmean(ms), 2),
        "within_100ms": round(sum(1 for d in ms if d <= 100) / len(ms), 4),
        "service_cpu_pct": round(100 * (cpu_seconds(pid) - cpu_before) / elapsed, 1),
        "emulator_cpu_pct": round(100 * (cpu_seconds(emulator_pid) - emulator_before) / elapsed, 1),
        "clients_cpu_pct": round(100 * (time.process_time() - own_before) / elapsed, 1),
        "seconds": round(elapsed, 2),
    }


async def bench(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Start the processes, warm up, and run a round for each number of clients."""
    env = {"AGENT_PROVIDER": args.provider, "AGENT_MCP_MAX_SESSIONS": "100000"}
    async with ServiceStack(env) as stack:
        await one_client(stack.url + "/mcp", 1, 5, 0, [])  # warm-up: imports, connections, first query
        results = []
        for clients in args.clients:
            result = await round_of(stack.url + "/mcp", clients, args, stack.pid, stack.emulator_pid)
            results.append(result)
            if not args.json:
                print(
                    f"{clients:>4} MCP clients ({args.client}, {args.provider}): {result['notifications']:>6} notifications, event -> client "
                    f"p50 {result['p50_ms']} ms, p99 {result['p99_ms']} ms, max {result['max_ms']} ms; "
                    f"{100 * result['within_100ms']:.2f}% within 100 ms; service CPU {result['service_cpu_pct']}%, "
                    f"clients' CPU {result['clients_cpu_pct']}%, emulator CPU {result['emulator_cpu_pct']}%",
                    flush=True,
                )
        return results


def main() -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 10, 50])
    parser.add_argument("--queries", type=int, default=3, help="questions each client asks in turn")
    parser.add_argument("--tokens", type=int, default=40, help="tokens in each answer")
    parser.add_argument("--tps", type=int, default=50, help="tokens a second the emulator streams")
    parser.add_argument(
        "--client", choices=["sdk", "raw"], default="sdk", help="the mcp SDK client, or a minimal aiohttp one"
    )
    parser.add_argument(
        "--provider",
        choices=["bedrock", "openai"],
        default="bedrock",
        help="how the service reaches the emulator",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = asyncio.run(bench(args))
    if args.json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
