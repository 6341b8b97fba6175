"""Benchmark: what a query waiting for a tool approval costs the service while it waits.

    python scripts/bench_approvals.py                  # 1,000 queries waiting at once
    python scripts/bench_approvals.py --runs 200 --json

Processes as in production: the emulator, and the service pointed at it as at Bedrock with
``AGENT_TOOLS_REQUIRE_APPROVAL=calculator``. The script starts ``--runs`` queries that each call
the calculator (``--wave`` at a time, each wave once the last one waits), waits until every
session says ``waiting``, and then reads from ``/proc``: the
service's resident memory against the same service before the queries (so the memory per waiting
query), its thread count, and its TCP connections to the emulator, each marked busy or idle by
the emulator's own records (a request still ``running`` there is a stream the service holds
open). Then it approves every request and checks that every query ends with ``done``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib.api import client_session, create_session, post_message  # noqa: E402
from benchlib.procs import rss_bytes, thread_count  # noqa: E402
from benchlib.stack import ServiceStack  # noqa: E402

QUESTION = "What is 6*7?"


def socket_inodes(pid: int) -> set[str]:
    """The inodes of the sockets a process holds open."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = fd.readlink().as_posix()
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def connections_to(pid: int, port: int) -> int:
    """The process's established TCP connections to ``port`` on this machine."""
    mine = socket_inodes(pid)
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            remote_port = int(fields[2].rsplit(":", 1)[1], 16)
            if fields[3] == "01" and remote_port == port and fields[9] in mine:
                count += 1
    return count


async def upstream_streams(http: aiohttp.ClientSession, emulator_url: str) -> int:
    """Requests the emulator is still answering (streams open to it)."""
    async with http.get(emulator_url + "/_emulator/records") as response:
        records = await response.json()
    return sum(record["outcome"] == "running" for record in records)


async def gather_bounded(jobs: list[Any], limit: int = 100) -> list[Any]:
    gate = asyncio.Semaphore(limit)

    async def one(job: Any) -> Any:
        async with gate:
            return await job

    return await asyncio.gather(*(one(job) for job in jobs))


async def session_state(http: aiohttp.ClientSession, url: str, session_id: str) -> dict[str, Any]:
    async with http.get(f"{url}/sessions/{session_id}") as response:
        return await response.json()  # type: ignore[no-any-return]


async def until_all(
    http: aiohttp.ClientSession, url: str, ids: list[str], status: str, timeout: float, pause: float = 0.25
) -> list[Any]:
    """Poll until every session has ``status``; their bodies."""
    deadline = time.monotonic() + timeout
    while True:
        bodies = await gather_bounded([session_state(http, url, session_id) for session_id in ids])
        if all(body["status"] == status for body in bodies):
            return bodies
        if time.monotonic() > deadline:
            left = sum(body["status"] != status for body in bodies)
            raise RuntimeError(f"{left} sessions are not {status} after {timeout} s")
        await asyncio.sleep(pause)


async def approve_all(http: aiohttp.ClientSession, url: str, bodies: list[Any]) -> None:
    async def one(body: Any) -> None:
        [pending] = body["pending_approvals"]
        path = f"{url}/sessions/{body['id']}/approvals/{pending['approval_id']}"
        async with http.post(path, json={"approved": True}) as response:
            if response.status != 200:
                raise RuntimeError(f"approve: {response.status} {await response.text()}")

    await gather_bounded([one(body) for body in bodies])


def measure(stack: ServiceStack) -> dict[str, int]:
    return {
        "rss": rss_bytes(stack.pid),
        "threads": thread_count(stack.pid),
        "upstream_connections": connections_to(stack.pid, stack.emulator_port),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    env = {
        "AGENT_TOOLS_REQUIRE_APPROVAL": "calculator",
        "AGENT_MAX_CONCURRENT_RUNS": str(max(256, args.runs + 10)),
        "AGENT_MAX_SESSIONS": str(max(10_000, args.runs + 10)),
        "AGENT_GC_TUNING": "false",
        "AGENT_LOG_LEVEL": "WARNING",
    }
    emulator = ["--ttft-ms", "0", "--tokens-per-second", "0"]
    async with ServiceStack(env, emulator_args=emulator) as stack, client_session(total=120) as http:
        url = stack.url
        # Warm-up: one query through, approval and all (imports, the calculator's worker, pools).
        warm = await create_session(http, url)
        await post_message(http, url, warm, QUESTION)
        await approve_all(http, url, await until_all(http, url, [warm], "waiting", 30))
        await until_all(http, url, [warm], "idle", 30)
        ids = await gather_bounded([create_session(http, url) for _ in range(args.runs)])
        before = measure(stack)
        started = time.monotonic()
        bodies = []
        for first in range(0, len(ids), args.wave):
            # In waves, so the model turns that lead up to the waits overlap only a wave at a time:
            # the upstream connections open at the end are what a wave needed, whatever waits.
            wave = ids[first : first + args.wave]
            await asyncio.gather(*(post_message(http, url, session_id, QUESTION) for session_id in wave))
            bodies += await until_all(http, url, wave, "waiting", 60, pause=0.01)
        reached = time.monotonic() - started
        waiting = measure(stack)
        streams = await upstream_streams(http, stack.emulator_url)
        await approve_all(http, url, bodies)
        finished = await until_all(http, url, ids, "idle", 120)
        done = sum(bool(body["messages"]) and body["pending_approvals"] == [] for body in finished)
    return {
        "runs": args.runs,
        "seconds_until_all_waiting": round(reached, 2),
        "rss_before_mb": round(before["rss"] / 2**20, 1),
        "rss_waiting_mb": round(waiting["rss"] / 2**20, 1),
        "kb_per_waiting_run": round((waiting["rss"] - before["rss"]) / args.runs / 1024, 1),
        "threads_before": before["threads"],
        "threads_waiting": waiting["threads"],
        "upstream_connections_before": before["upstream_connections"],
        "upstream_connections_waiting": waiting["upstream_connections"],
        "upstream_streams_open_waiting": streams,
        "finished_after_approval": done,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=1000, help="queries waiting at once (default 1000)")
    parser.add_argument(
        "--wave",
        type=int,
        default=10,
        help="queries started together, each wave once the last waits (default 10)",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    result = asyncio.run(run(args))
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for name, value in result.items():
        print(f"{name:32} {value}")


if __name__ == "__main__":
    main()
