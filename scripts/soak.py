"""Soak: thousands of streams with random drops for a set time; is anything growing?

    python scripts/soak.py                                  # 10 minutes, 2,000 streams
    python scripts/soak.py --duration 60 --streams 500      # a quick look

Processes as in production: the emulator, the service (pointed at the emulator as at Bedrock)
and this script. ``--sessions`` sessions answer one question after another (``--tps`` tokens a
second, now and then cancelled); ``--streams`` clients follow them, SSE and WebSocket mixed with
a few MCP clients, and each drops its connection at a random moment (no goodbye: the socket is
aborted) and resumes from its last event id. Every ``--interval`` seconds the script prints the
service's resident memory, file descriptors, threads and asyncio tasks, the streams it holds,
and what the clients saw: reconnects, events, and gaps or repeats in the ids (there must be
none). At the end it reads the service's log for "Task was destroyed but it is pending",
"exception was never retrieved" and tracebacks, and says whether memory, descriptors and tasks
stayed flat over the second half of the run (the first half is warm-up).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib.api import client_session  # noqa: E402
from benchlib.procs import raise_open_file_limit  # noqa: E402
from benchlib.stack import ServiceStack  # noqa: E402

from service.loadtest.sse import read_batches  # noqa: E402

BAD_LOG_LINES = ("Task was destroyed but it is pending", "exception was never retrieved", "Traceback")


@dataclass
class Tally:
    """What the clients saw."""

    events: int = 0
    reconnects: int = 0
    gaps: int = 0
    repeats: int = 0
    purged: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    open_streams: int = 0

    def error(self, kind: str) -> None:
        """Count one client error of ``kind``."""
        self.errors[kind] = self.errors.get(kind, 0) + 1


def proc_stats(pid: int) -> dict[str, int]:
    """A process's resident memory (KiB), threads and open file descriptors, from /proc."""
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {
        "rss_kib": int(fields["VmRSS"].split()[0]),
        "threads": int(fields["Threads"]),
        "fds": len(list(Path(f"/proc/{pid}/fd").iterdir())),
    }


async def scrape(http: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """The service's own gauges from /metrics."""
    wanted = {
        "agentstream_asyncio_tasks": "tasks",
        'agentstream_connections{transport="sse"}': "sse",
        'agentstream_connections{transport="ws"}': "ws",
        'agentstream_connections{transport="mcp"}': "mcp",
        "agentstream_runs_active": "runs",
    }
    out: dict[str, float] = {}
    async with http.get(url + "/healthz") as response:
        out["sessions"] = float((await response.json()).get("sessions", -1))
    async with http.get(url + "/metrics") as response:
        for line in (await response.text()).splitlines():
            name, _, value = line.rpartition(" ")
            if name in wanted:
                out[wanted[name]] = float(value)
    return out


def abort(response: aiohttp.ClientResponse) -> None:
    """Drop the connection under ``response`` as a client that vanished would: no goodbye."""
    if response.connection is not None and response.connection.transport is not None:
        response.connection.transport.abort()


class Soak:
    """The run: the conversations, the followers, the samples and the verdict."""

    def __init__(self, args: argparse.Namespace, url: str) -> None:
        self.args = args
        self.url = url
        self.tally = Tally()
        self.sessions: list[str] = []
        self.stop = asyncio.Event()
        self.rng = random.Random(args.seed)
        self.gap_examples: list[str] = []

    def lifetime(self) -> float:
        """How long a connection lives before it is dropped (exponential, mean --drop-every)."""
        return self.rng.expovariate(1.0 / self.args.drop_every)

    # --- sessions that keep answering ---

    async def drive(self, http: aiohttp.ClientSession, slot: int) -> None:
        """One conversation after another in this slot: a few questions, then the session is
        deleted (its streams end) and a new one takes the slot, as chats come and go."""
        question = f"soak [emu:tokens={self.args.tokens}] [emu:tps={self.args.tps}]"
        asked = 0
        while not self.stop.is_set():
            session_id = self.sessions[slot]
            try:
                if asked >= self.args.queries_per_session:
                    async with http.post(self.url + "/sessions", json={}) as response:
                        self.sessions[slot] = (await response.json())["id"]
                    async with http.delete(f"{self.url}/sessions/{session_id}"):
                        pass
                    asked = 0
                    continue
                async with http.post(
                    f"{self.url}/sessions/{session_id}/messages", json={"content": question}
                ):
                    pass
                asked += 1
                if self.rng.random() < 0.05:
                    await asyncio.sleep(self.rng.uniform(0.5, 3))
                    async with http.post(f"{self.url}/sessions/{session_id}/cancel"):
                        pass
                while not self.stop.is_set():
                    async with http.get(f"{self.url}/sessions/{session_id}") as response:
                        if (await response.json())["status"] == "idle":
                            break
                    await asyncio.sleep(0.5)
                await asyncio.sleep(self.rng.uniform(0, 1))
            except (TimeoutError, aiohttp.ClientError, KeyError, ValueError):
                self.tally.error("driver")
                await asyncio.sleep(1)

    # --- followers ---

    def seen(self, last: int, event_id: int, first_id: int | None = None, kind: str = "") -> int:
        """Count an event (or a merged run of text events, ``first_id`` to ``event_id``) after ``last``."""
        first = event_id if first_id is None else first_id
        if first == last + 1 or last == 0:
            self.tally.events += event_id - first + 1
        elif event_id <= last:
            self.tally.repeats += 1
            return last
        else:
            self.tally.gaps += 1
            if len(self.gap_examples) < 10:
                self.gap_examples.append(f"{kind}: after {last} came {first}..{event_id}")
        return event_id

    async def sse_follower(self, http: aiohttp.ClientSession, slot: int) -> None:
        """Follow a slot's session over SSE, dropping and resuming from the last id."""
        last, session_id = 0, self.sessions[slot]
        while not self.stop.is_set():
            if self.sessions[slot] != session_id:  # the conversation moved on: follow the new one
                last, session_id = 0, self.sessions[slot]
            headers = {"Last-Event-ID": str(last)} if last else {}
            deadline = time.monotonic() + self.lifetime()
            try:
                async with http.get(f"{self.url}/sessions/{session_id}/events", headers=headers) as response:
                    if response.status == 204:  # idle and nothing new: come back soon
                        await asyncio.sleep(0.5)
                        continue
                    if response.status == 410:
                        self.tally.purged += 1
                        last = (await response.json())["last_id"]
                        continue
                    if response.status == 404:  # deleted: the slot has a new session
                        await asyncio.sleep(0.1)
                        continue
                    if response.status != 200:
                        self.tally.error(f"sse {response.status}")
                        await asyncio.sleep(1)
                        continue
                    self.tally.open_streams += 1
                    try:
                        last = await self._read_sse(response, deadline, last)
                    finally:
                        self.tally.open_streams -= 1
                    self.tally.reconnects += 1
            except (TimeoutError, aiohttp.ClientError):
                self.tally.error("sse connection")
                await asyncio.sleep(0.5)

    async def _read_sse(self, response: aiohttp.ClientResponse, deadline: float, last: int) -> int:
        """Read until the stream ends or its time is up (then abort it); the last id applied."""
        async for batch in read_batches(response.content):
            for _, event_id, data in batch:
                if event_id is not None:
                    # A reader far behind gets adjacent text merged: the frame names its first id.
                    last = self.seen(last, int(event_id), json.loads(data).get("first_id"), "sse")
            if time.monotonic() > deadline or self.stop.is_set():
                abort(response)  # gone without a word
                break
        return last

    async def ws_follower(self, http: aiohttp.ClientSession, slot: int) -> None:
        """Follow a slot's session over WebSocket, dropping and resubscribing from the last id."""
        last, session_id = 0, self.sessions[slot]
        while not self.stop.is_set():
            if self.sessions[slot] != session_id:
                last, session_id = 0, self.sessions[slot]
            deadline = time.monotonic() + self.lifetime()
            try:
                ws = await http.ws_connect(f"{self.url.replace('http', 'ws')}/ws", heartbeat=None)
            except (TimeoutError, aiohttp.ClientError):
                self.tally.error("ws connect")
                await asyncio.sleep(0.5)
                continue
            self.tally.open_streams += 1
            try:
                message: dict[str, Any] = {"type": "subscribe", "session_id": session_id}
                if last:
                    message["last_event_id"] = last
                await ws.send_json(message)
                while not self.stop.is_set():
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    try:
                        frame = await ws.receive(timeout=remaining)
                    except TimeoutError:
                        break
                    if frame.type != aiohttp.WSMsgType.TEXT:
                        break
                    data = json.loads(frame.data)
                    if "id" in data:
                        last = self.seen(last, data["id"], data.get("first_id"), "ws")
                    elif data.get("type") == "error":
                        if data.get("code") == "not_found":  # deleted: the slot has a new session
                            break
                        self.tally.error(f"ws {data.get('code')}")
                        if data.get("code") == "events_purged":
                            self.tally.purged += 1
                            last = 0
                        break
            finally:
                self.tally.open_streams -= 1
                abort(ws._response)  # gone without a close frame
                await ws.close()
                self.tally.reconnects += 1

    async def mcp_client(self, http: aiohttp.ClientSession) -> None:
        """An MCP client: its own session, answers in turn, notifications on a stream it drops."""
        accept = {"Accept": "application/json, text/event-stream"}
        ids = iter(range(1, 10**9))

        async def rpc(method: str, params: dict[str, Any], headers: dict[str, str]) -> Any:
            message = {"jsonrpc": "2.0", "id": next(ids), "method": method, "params": params}
            async with http.post(self.url + "/mcp", json=message, headers=headers) as response:
                return response.headers.get("Mcp-Session-Id"), await response.json()

        init = {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "soak", "version": "1"},
        }
        mcp_session, _ = await rpc("initialize", init, accept)
        headers = {**accept, "Mcp-Session-Id": mcp_session}
        await rpc("logging/setLevel", {"level": "info"}, headers)
        question = f"mcp soak [emu:tokens={self.args.tokens}] [emu:tps={self.args.tps}]"
        _, reply = await rpc(
            "tools/call", {"name": "session_message", "arguments": {"content": question}}, headers
        )
        session_id = reply["result"]["structuredContent"]["session_id"]
        cursor: str | None = None
        asked = 0
        lasts: dict[str, int] = {}  # per agent session: ids are counted per session
        while not self.stop.is_set():
            stream_headers = {"Accept": "text/event-stream", "Mcp-Session-Id": mcp_session}
            if cursor:
                stream_headers["Last-Event-ID"] = cursor
            deadline = time.monotonic() + self.lifetime()
            try:
                async with http.get(self.url + "/mcp", headers=stream_headers) as response:
                    self.tally.open_streams += 1
                    try:
                        async for batch in read_batches(response.content):
                            for _, event_id, message in batch:
                                if not message.startswith("{"):
                                    continue
                                if event_id is not None:
                                    cursor = event_id
                                data = json.loads(message)["params"]["data"]
                                if "id" in data:
                                    sid = data["session_id"]
                                    lasts[sid] = self.seen(lasts.get(sid, 0), data["id"], None, "mcp")
                                ended = data.get("type") in ("done", "error") and "id" in data
                                if ended and data["session_id"] == session_id:
                                    asked += 1
                                    arguments = {"content": question}
                                    if asked % self.args.queries_per_session:
                                        arguments["session_id"] = session_id
                                    # else a new conversation; the MCP session follows both
                                    _, reply = await rpc(
                                        "tools/call",
                                        {"name": "session_message", "arguments": arguments},
                                        headers,
                                    )
                                    session_id = reply["result"]["structuredContent"]["session_id"]
                            if time.monotonic() > deadline or self.stop.is_set():
                                abort(response)
                                break
                    finally:
                        self.tally.open_streams -= 1
                self.tally.reconnects += 1
            except (TimeoutError, aiohttp.ClientError, KeyError, ValueError):
                self.tally.error("mcp")
                await asyncio.sleep(0.5)

    # --- the run ---

    async def run(self, pid: int) -> dict[str, Any]:
        """Soak for ``--duration`` seconds, sampling the service ``pid``; the verdict's figures."""
        args = self.args
        samples: list[dict[str, Any]] = []
        async with client_session() as http:
            for _ in range(args.sessions):
                async with http.post(self.url + "/sessions", json={}) as response:
                    self.sessions.append((await response.json())["id"])
            tasks = [asyncio.create_task(self.drive(http, slot)) for slot in range(len(self.sessions))]
            mcp_count = max(1, args.streams // 50)
            for n in range(args.streams - mcp_count):
                follower = self.sse_follower if n % 2 else self.ws_follower
                tasks.append(asyncio.create_task(follower(http, n % len(self.sessions))))
                if n % 100 == 99:
                    await asyncio.sleep(0.05)  # ramp up rather than stampede
            tasks += [asyncio.create_task(self.mcp_client(http)) for _ in range(mcp_count)]
            started = time.monotonic()
            header = (
                f"{'t (s)':>6} {'RSS MiB':>8} {'fds':>6} {'threads':>7} {'tasks':>6} {'streams':>7} "
                f"{'runs':>5} {'sess':>5} {'events':>9} {'reconn':>7} {'gaps':>5} {'repeats':>7} {'errors':>6}"
            )
            print(header, flush=True)
            while (elapsed := time.monotonic() - started) < args.duration:
                await asyncio.sleep(min(args.interval, args.duration - elapsed))
                stats = proc_stats(pid)
                gauges = await scrape(http, self.url)
                sample = {
                    "t": round(time.monotonic() - started),
                    **stats,
                    "tasks": int(gauges.get("tasks", -1)),
                    "streams": int(gauges.get("sse", 0) + gauges.get("ws", 0) + gauges.get("mcp", 0)),
                    "runs": int(gauges.get("runs", 0)),
                    "sessions": int(gauges.get("sessions", -1)),
                    "events": self.tally.events,
                    "reconnects": self.tally.reconnects,
                    "gaps": self.tally.gaps,
                    "repeats": self.tally.repeats,
                    "errors": sum(self.tally.errors.values()),
                }
                samples.append(sample)
                print(
                    f"{sample['t']:>6} {sample['rss_kib'] / 1024:>8.1f} {sample['fds']:>6} {sample['threads']:>7} "
                    f"{sample['tasks']:>6} {sample['streams']:>7} {sample['runs']:>5} {sample['sessions']:>5} "
                    f"{sample['events']:>9} "
                    f"{sample['reconnects']:>7} {sample['gaps']:>5} {sample['repeats']:>7} {sample['errors']:>6}",
                    flush=True,
                )
            self.stop.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return self.verdict(samples)

    def verdict(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        """Growth over the second half of the samples, and what the clients saw."""
        second_half = samples[len(samples) // 2 :]
        first, last = second_half[0], second_half[-1]

        def growth(key: str) -> float:
            return (last[key] - first[key]) / max(1, first[key])

        result = {
            "rss_growth_second_half": round(growth("rss_kib"), 4),
            "fds_growth_second_half": round(growth("fds"), 4),
            "tasks_growth_second_half": round(growth("tasks"), 4),
            "rss_mib_max": round(max(s["rss_kib"] for s in samples) / 1024, 1),
            "gaps": self.tally.gaps,
            "repeats": self.tally.repeats,
            "purged": self.tally.purged,
            "reconnects": self.tally.reconnects,
            "events": self.tally.events,
            "client_errors": self.tally.errors,
        }
        for example in self.gap_examples:
            print("gap:", example)
        return result


async def main_async(args: argparse.Namespace) -> int:
    """Start the processes, soak, read the service's log, print the verdict; the exit status."""
    raise_open_file_limit(args.streams * 3 + 4096)
    env = {
        "AGENT_MAX_SESSIONS": "100000",
        "AGENT_MCP_MAX_SESSIONS": "100000",
        "AGENT_SESSION_TTL_S": str(args.session_ttl),
        **({"MALLOC_ARENA_MAX": str(args.malloc_arena_max)} if args.malloc_arena_max else {}),
        **({"AGENT_GC_TUNING": "false"} if args.no_gc_tuning else {}),
    }
    stack = ServiceStack(env, logs=Path(tempfile.mkdtemp(prefix="soak-")))
    log_path = stack.service_log
    assert log_path is not None
    print(f"service log: {log_path}", flush=True)
    async with stack:
        result = await Soak(args, stack.url).run(stack.pid)
    # Read once the service has stopped, so that what its shutdown logged counts too.
    bad_lines = [
        line
        for line in log_path.read_text(errors="replace").splitlines()
        if any(b in line for b in BAD_LOG_LINES)
    ]
    for line in bad_lines[:10]:
        print("log:", line)
    result["bad_log_lines"] = len(bad_lines)
    print(json.dumps(result, indent=2))
    flat = all(abs(result[key]) < args.flat for key in ("rss_growth_second_half", "fds_growth_second_half"))
    ok = flat and result["gaps"] == 0 and result["repeats"] == 0 and result["bad_log_lines"] == 0
    print("verdict:", "flat, nothing lost, a clean log" if ok else "NOT CLEAN", flush=True)
    return 0 if ok else 1


def main() -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=600, help="seconds")
    parser.add_argument("--streams", type=int, default=2000)
    parser.add_argument("--sessions", type=int, default=40)
    parser.add_argument("--tokens", type=int, default=60, help="tokens in each answer")
    parser.add_argument("--tps", type=float, default=4, help="tokens a second the emulator streams")
    parser.add_argument(
        "--queries-per-session", type=int, default=4, help="questions in a conversation before a new one"
    )
    parser.add_argument("--drop-every", type=float, default=20, help="mean seconds a connection lives")
    parser.add_argument("--interval", type=float, default=30, help="seconds between samples")
    parser.add_argument("--flat", type=float, default=0.10, help="allowed growth over the second half")
    parser.add_argument(
        "--session-ttl", type=float, default=120, help="AGENT_SESSION_TTL_S: idle sessions go after this"
    )
    parser.add_argument(
        "--malloc-arena-max",
        type=int,
        default=0,
        help="MALLOC_ARENA_MAX for the service (0: glibc's default)",
    )
    parser.add_argument("--no-gc-tuning", action="store_true", help="AGENT_GC_TUNING=false for the service")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    raise SystemExit(asyncio.run(main_async(args)))


if __name__ == "__main__":
    main()
