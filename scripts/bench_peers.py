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
3. ``live``: one paced answer (50 tokens/s, 500 tokens) to 100, 1,000 and 5,000 SSE subscribers;
   latency = the client's clock at read minus the event's ``ts`` (a sample of 100 subscribers
   parse, the others count frame ends); the peers broadcast an event every 20 ms with a ``ts``.
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

``--baseline GIT_REF`` also runs ``replay`` and ``live`` against the service as of that ref
(a temporary ``git worktree``, ``python -m service`` with that tree on ``PYTHONPATH``, the same
venv and the same emulator), in the same alternation, and prints current / baseline ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import random
import re
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import ROOT  # noqa: E402
from benchlib.api import fill_session, new_session  # noqa: E402
from benchlib.procs import NO_QUOTAS, cpu_seconds, free_port, rss_bytes, wait_until_up  # noqa: E402
from benchlib.stats import percentile  # noqa: E402

SCRIPTS = Path(__file__).resolve().parent
CLIENT_CPU, SERVER_CPU = 0, 1
FRAME_END = b"\r\n\r\n"  # aiohttp-sse's and sse-starlette's separator is CRLF

PEERS = {
    "fastapi": ("fastapi", "sse_starlette", "uvicorn"),
    "websockets": ("websockets",),
}
BARE, FASTAPI, WEBSOCKETS, SERVICE, BASELINE = (
    "bare aiohttp-sse",
    "FastAPI+sse-starlette",
    "websockets",
    "service",
    "baseline",
)

# Service settings for every scenario: no keep-alive frames or heartbeats inside a measurement
# (they would be counted as events), a quick stop, room for many sessions.
BASE_ENV = {
    **NO_QUOTAS,
    "AGENT_PROVIDER": "bedrock",
    "AGENT_MAX_SESSIONS": "100000",
    "AGENT_SSE_PING_INTERVAL_S": "600",
    "AGENT_HEARTBEAT_INTERVAL_S": "600",
    "AGENT_SHUTDOWN_TIMEOUT_S": "2",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
}
NO_MERGE = {"AGENT_MERGE_DELTAS_AFTER": "1000000"}


def installed(peer: str) -> bool:
    """Whether a peer's packages can be imported."""
    return all(importlib.util.find_spec(module) is not None for module in PEERS[peer])


# -- processes, cores -------------------------------------------------------------------------


# Whether both CPUs are there to pin to, as this process found them before pinning itself.
PINNING = {CLIENT_CPU, SERVER_CPU} <= os.sched_getaffinity(0)
# The servers' stderr goes to files here (made by main); kept and named when a scenario fails.
LOGS: Path | None = None


def can_pin() -> bool:
    """Both CPUs the suite pins to are available."""
    return PINNING


def raise_fd_limit() -> None:
    """This process's open-file limit up to its hard limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _child_setup(cpu: int | None) -> Callable[[], None]:
    def setup() -> None:
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})
        raise_fd_limit()

    return setup


@contextlib.contextmanager
def server_process(
    args: list[str], env: dict[str, str] | None = None, cwd: Path = ROOT, cpu: int | None = SERVER_CPU
) -> Iterator[subprocess.Popen[bytes]]:
    """A child process pinned to ``cpu`` with the highest open-file limit, for the block."""
    name = "-".join(Path(a).name for a in args[1:4] if a != "-m")
    log = LOGS / f"{name}-{time.monotonic_ns()}.log" if LOGS else os.devnull
    with open(log, "wb") as stderr:
        child = subprocess.Popen(
            args,
            env={**os.environ, **(env or {})},
            cwd=cwd,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            preexec_fn=_child_setup(cpu if can_pin() else None),
        )
    try:
        if can_pin() and cpu is not None and os.sched_getaffinity(child.pid) != {cpu}:
            raise RuntimeError(f"{name} is not pinned to CPU {cpu}")
        yield child
    finally:
        child.terminate()
        try:
            child.wait(10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


class ServiceStack:
    """The emulator and the service (from ``source``, a checkout), for one scenario."""

    def __init__(
        self,
        config: Config,
        env: dict[str, str] | None = None,
        source: Path = ROOT,
        emulator_args: list[str] | None = None,
    ) -> None:
        self.emulator_port, self.port = free_port(), free_port()
        self.emulator_url = f"http://127.0.0.1:{self.emulator_port}"
        self.url = f"http://127.0.0.1:{self.port}"
        self.source = source
        self.emulator_cpu = config.emulator_cpu
        self.emulator_cmd = [
            sys.executable,
            "-m",
            "service.emulator",
            "--port",
            str(self.emulator_port),
            *(emulator_args or []),
        ]
        self.env = {
            **BASE_ENV,
            "AGENT_PORT": str(self.port),
            "AWS_ENDPOINT_URL_BEDROCK_RUNTIME": self.emulator_url,
            **(env or {}),
        }
        if source != ROOT:
            self.env["PYTHONPATH"] = str(source)
        self._stack = contextlib.ExitStack()
        self.pid = 0
        self.emulator_pid = 0

    async def __aenter__(self) -> ServiceStack:
        # The emulator always comes from the current tree: only the service is compared.
        self.emulator_pid = self._stack.enter_context(
            server_process(self.emulator_cmd, cpu=self.emulator_cpu)
        ).pid
        self.pid = self._stack.enter_context(
            server_process([sys.executable, "-m", "service"], self.env, cwd=self.source)
        ).pid
        try:
            await wait_until_up(self.emulator_url + "/_emulator/records")
            await wait_until_up(self.url + "/healthz")
        except BaseException:
            self._stack.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stack.close()


@contextlib.contextmanager
def peer_process(kind: str, data_file: str) -> Iterator[tuple[str, int]]:
    """A peer server (``--serve-peer``) on CPU 1; its base URL and pid."""
    port = free_port()
    with server_process([sys.executable, __file__, "--serve-peer", kind, str(port), data_file]) as child:
        yield f"http://127.0.0.1:{port}", child.pid


@contextlib.contextmanager
def baseline_tree(ref: str) -> Iterator[Path]:
    """``ref`` checked out in a temporary worktree, removed afterwards."""
    parent = Path(tempfile.mkdtemp(prefix="agentstream-baseline-"))
    tree = parent / "tree"
    subprocess.run(
        ["git", "worktree", "add", "--detach", str(tree), ref], cwd=ROOT, check=True, capture_output=True
    )
    try:
        where = subprocess.run(
            [sys.executable, "-c", "import service; print(service.__file__)"],
            cwd=tree,
            env={**os.environ, "PYTHONPATH": str(tree)},
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        if not Path(where).resolve().is_relative_to(tree.resolve()):
            raise RuntimeError(f"the baseline imports the service from {where}, not from {tree}")
        yield tree
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)
        subprocess.run(["git", "worktree", "prune"], cwd=ROOT, capture_output=True)
        shutil.rmtree(parent, ignore_errors=True)


# -- configuration ----------------------------------------------------------------------------


@dataclass
class Config:
    """Sizes of every scenario (``--quick`` shrinks them)."""

    rounds: int = 3
    emulator_cpu: int = CLIENT_CPU
    baseline: Path | None = None
    baseline_ref: str = ""
    replay_tokens: int = 990
    replay_subscribers: int = 100
    replay_min_s: float = 2.0
    live_sizes: tuple[int, ...] = (100, 1000, 5000)
    live_tokens: int = 500
    live_tps: float = 50.0
    live_parsed: int = 100
    conc_sizes: tuple[int, ...] = (200, 500)
    conc_tokens: int = 200
    conc_warm: int = 500
    idle_connections: int = 10_000
    slow_subscribers: int = 50
    slow_tokens: int = 40_000
    slow_parsed: int = 10
    seed: int = 1
    notes: list[str] = field(default_factory=list)

    @classmethod
    def quick(cls) -> Config:
        """A smoke version of every scenario: small, one round."""
        return cls(
            rounds=1,
            replay_tokens=200,
            replay_subscribers=20,
            replay_min_s=0.3,
            live_sizes=(20, 200),
            live_tokens=60,
            live_parsed=20,
            conc_sizes=(20, 50),
            conc_tokens=30,
            conc_warm=50,
            idle_connections=300,
            slow_subscribers=10,
            slow_parsed=5,
            slow_tokens=3000,
        )


def client_session() -> aiohttp.ClientSession:
    """The client's HTTP session: no connection limit, no total timeout."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=None, sock_connect=30)
    )


@dataclass
class Meter:
    """Wall time, a server's CPU time and this client's CPU time over a measurement."""

    pid: int
    wall: float = 0.0
    server_cpu: float = 0.0
    client_cpu: float = 0.0

    def __enter__(self) -> Meter:
        self._cpu, self._client, self._started = cpu_seconds(self.pid), time.process_time(), time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.monotonic() - self._started
        self.server_cpu = cpu_seconds(self.pid) - self._cpu
        self.client_cpu = time.process_time() - self._client


def median(values: list[float]) -> float:
    """The median, or NaN for nothing."""
    return statistics.median(values) if values else float("nan")


def med(rounds: list[dict[str, Any]], key: str) -> float:
    """The median of one figure over rounds."""
    return median([r[key] for r in rounds if r.get(key) is not None])


def ratio(a: float, b: float) -> float | None:
    """a / b, or None when either is missing."""
    if not a or not b or a != a or b != b:
        return None
    return round(a / b, 2)


# -- SSE and WebSocket readers ----------------------------------------------------------------


async def count_frames(content: aiohttp.StreamReader) -> int:
    """Read a stream to its end, counting SSE frame ends (no parsing: the client stays cheap)."""
    count, tail = 0, b""
    while chunk := await content.readany():
        buffer = tail + chunk
        count += buffer.count(FRAME_END)
        tail = buffer[-3:]
    return count


async def sse_replay(http: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> int:
    """One SSE replay to its end; the number of events."""
    async with http.get(url, headers=headers) as response:
        if response.status != 200:
            raise RuntimeError(f"{url}: HTTP {response.status}")
        return await count_frames(response.content)


async def ws_replay(http: aiohttp.ClientSession, url: str, session_id: str) -> int:
    """One WebSocket replay from the start until ``done``; the number of events (frames with an id)."""
    count = 0
    subscribe = json.dumps({"type": "subscribe", "session_id": session_id, "last_event_id": 0})
    async with http.ws_connect(url, heartbeat=None, compress=0) as ws:
        await ws.send_str(subscribe)
        async for message in ws:
            if message.type != aiohttp.WSMsgType.TEXT:
                break
            if '"id":' in message.data:
                count += 1
                if '"type":"done"' in message.data:
                    break
    return count


async def poll_all(http: aiohttp.ClientSession, url: str, session_id: str) -> list[dict[str, Any]]:
    """Every event of a session's log, through the polling route."""
    events: list[dict[str, Any]] = []
    since = 0
    while True:
        async with http.get(
            url + f"/sessions/{session_id}/events/poll?since_index={since}&limit=1000"
        ) as response:
            body = await response.json()
        events += body["events"]
        if not body["events"] or body["next_index"] <= since:
            return events
        since = body["next_index"]


def write_json(directory: str, name: str, payload: Any) -> str:
    """Write ``payload`` to ``directory/name``; its path."""
    path = os.path.join(directory, name)
    Path(path).write_text(json.dumps(payload))
    return path


# -- 1. replay fan-out ------------------------------------------------------------------------


async def replay_throughput(
    cfg: Config, targets: dict[str, tuple[int, int, Callable[[], Awaitable[int]]]], subscribers: int
) -> dict[str, Any]:
    """Alternating rounds of ``subscribers`` concurrent replays per target.

    ``targets``: name -> (server pid, events expected per subscriber, one replay). A round is as
    many waves of ``subscribers`` replays as fill ``cfg.replay_min_s`` (CPU time is read in 10 ms
    ticks, and one wave of a fast server lasts a fraction of a second).
    """
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in targets}
    for _pid, _expected, one in targets.values():  # warm-up, not measured: first-request costs
        await asyncio.gather(*(one() for _ in range(min(10, subscribers))))
    for _ in range(cfg.rounds):
        for name, (pid, expected, one) in targets.items():
            delivered = waves = 0
            with Meter(pid) as meter:
                started = time.monotonic()
                while waves == 0 or time.monotonic() - started < cfg.replay_min_s:
                    counts = await asyncio.gather(*(one() for _ in range(subscribers)))
                    if sum(counts) != expected * subscribers:
                        raise RuntimeError(
                            f"{name}: {sum(counts)} events delivered, expected {expected * subscribers}"
                        )
                    delivered += sum(counts)
                    waves += 1
            runs[name].append(
                {
                    "events_per_s": delivered / meter.wall,
                    "cpu_us_per_event": meter.server_cpu / delivered * 1e6,
                    "client_busy": meter.client_cpu / meter.wall,
                    "waves": waves,
                }
            )
    return {
        name: {
            "events_per_subscriber": targets[name][1],
            "events_per_s": round(med(r, "events_per_s")),
            "cpu_us_per_event": round(med(r, "cpu_us_per_event"), 2),
            "client_busy": round(med(r, "client_busy"), 2),
            "rounds_events_per_s": [round(x["events_per_s"]) for x in r],
            "rounds_waves": [x["waves"] for x in r],
        }
        for name, r in runs.items()
    }


async def scenario_replay(cfg: Config) -> dict[str, Any]:
    """Replay of ~1,000 events to 100 SSE subscribers: service, baseline, bare aiohttp-sse, FastAPI."""
    result: dict[str, Any] = {"subscribers": cfg.replay_subscribers, "rounds": cfg.rounds, "targets": {}}
    async with contextlib.AsyncExitStack() as stack:
        service = await stack.enter_async_context(ServiceStack(cfg, NO_MERGE))
        http = await stack.enter_async_context(client_session())
        directory = stack.enter_context(tempfile.TemporaryDirectory())
        session_id, last_id = await fill_session(http, service.url, cfg.replay_tokens)
        events = [
            (e["id"], e["type"], json.dumps(e, separators=(",", ":"), ensure_ascii=False))
            for e in await poll_all(http, service.url, session_id)
        ]
        if len(events) != last_id:
            raise RuntimeError(f"polled {len(events)} events, the log's last id is {last_id}")
        result["events_in_log"] = last_id
        events_file = write_json(directory, "events.json", events)
        peer_file = write_json(directory, "peer.json", {"events": events})
        headers = {"Last-Event-ID": "0"}

        def sse_target(pid: int, expected: int, url: str) -> tuple[int, int, Callable[[], Awaitable[int]]]:
            return pid, expected, lambda: sse_replay(http, url, headers)

        targets = {SERVICE: sse_target(service.pid, last_id, service.url + f"/sessions/{session_id}/events")}
        if cfg.baseline is not None:
            base = await stack.enter_async_context(ServiceStack(cfg, NO_MERGE, source=cfg.baseline))
            base_session, base_last = await fill_session(http, base.url, cfg.replay_tokens)
            targets[BASELINE] = sse_target(base.pid, base_last, base.url + f"/sessions/{base_session}/events")
        port = free_port()
        ceiling = stack.enter_context(
            server_process(
                [sys.executable, str(SCRIPTS / "bench_fanout.py"), "--serve-ceiling", str(port), events_file]
            )
        )
        await wait_until_up(f"http://127.0.0.1:{port}/healthz")
        targets[BARE] = sse_target(ceiling.pid, last_id, f"http://127.0.0.1:{port}/replay")
        if installed("fastapi"):
            url, pid = stack.enter_context(peer_process("fastapi", peer_file))
            await wait_until_up(url + "/healthz")
            targets[FASTAPI] = sse_target(pid, last_id, url + "/replay")
        result["targets"] = await replay_throughput(cfg, targets, cfg.replay_subscribers)
        if not installed("fastapi"):
            result["targets"][FASTAPI] = "not installed"
    t = result["targets"]
    rate = {name: v["events_per_s"] for name, v in t.items() if isinstance(v, dict)}
    result["ratios"] = {
        "service/bare": ratio(rate.get(SERVICE, 0), rate.get(BARE, 0)),
        "service/fastapi": ratio(rate.get(SERVICE, 0), rate.get(FASTAPI, 0)),
    }
    if BASELINE in rate:
        result["ratios"]["current/baseline"] = ratio(rate[SERVICE], rate[BASELINE])
        result["ratios"]["current/baseline cpu_us_per_event"] = ratio(
            t[SERVICE]["cpu_us_per_event"], t[BASELINE]["cpu_us_per_event"]
        )
    return result


# -- 2. replay over WebSocket -----------------------------------------------------------------


async def scenario_ws(cfg: Config) -> dict[str, Any]:
    """The same replay over the service's /ws and over a bare websockets server."""
    result: dict[str, Any] = {"subscribers": cfg.replay_subscribers, "rounds": cfg.rounds, "targets": {}}
    async with contextlib.AsyncExitStack() as stack:
        service = await stack.enter_async_context(ServiceStack(cfg, NO_MERGE))
        http = await stack.enter_async_context(client_session())
        directory = stack.enter_context(tempfile.TemporaryDirectory())
        session_id, last_id = await fill_session(http, service.url, cfg.replay_tokens)
        result["events_in_log"] = last_id
        # The service's own frames for this replay, for the peer to send verbatim.
        frames: list[str] = []
        async with http.ws_connect(service.url + "/ws", heartbeat=None) as ws:
            await ws.send_str(json.dumps({"type": "subscribe", "session_id": session_id, "last_event_id": 0}))
            async for message in ws:
                frames.append(message.data)
                if '"type":"done"' in message.data:
                    break
        targets: dict[str, tuple[int, int, Callable[[], Awaitable[int]]]] = {
            SERVICE: (service.pid, last_id, lambda: ws_replay(http, service.url + "/ws", session_id))
        }
        if installed("websockets"):
            peer_file = write_json(directory, "peer.json", {"ws_frames": frames})
            url, pid = stack.enter_context(peer_process("websockets", peer_file))
            await wait_until_up(url)
            targets[WEBSOCKETS] = (pid, last_id, lambda: ws_replay(http, url, session_id))
        result["targets"] = await replay_throughput(cfg, targets, cfg.replay_subscribers)
        if not installed("websockets"):
            result["targets"][WEBSOCKETS] = "not installed"
    rate = {name: v["events_per_s"] for name, v in result["targets"].items() if isinstance(v, dict)}
    result["ratios"] = {"service/websockets": ratio(rate.get(SERVICE, 0), rate.get(WEBSOCKETS, 0))}
    return result


# -- 3. live fan-out --------------------------------------------------------------------------


async def connect_many(
    http: aiohttp.ClientSession, url: str, n: int, batch: int = 250
) -> list[aiohttp.ClientResponse]:
    """Open ``n`` SSE streams (in batches: the listen backlogs are small); each has its headers."""
    responses: list[aiohttp.ClientResponse] = []
    for start in range(0, n, batch):
        responses += await asyncio.gather(*(http.get(url) for _ in range(min(batch, n - start))))
    bad = [r.status for r in responses if r.status != 200]
    if bad:
        for response in responses:
            response.close()
        raise RuntimeError(f"{url}: {len(bad)} streams refused (HTTP {bad[0]})")
    return responses


# A text event's ``ts`` in a data line (JSON strings escape their quotes, so text cannot fake it).
TEXT_TS = re.compile(rb'"type":"assistant_text"[^\n]*?"ts":([0-9.]+)')


async def parse_frames(content: aiohttp.StreamReader, latencies: list[float]) -> tuple[int, int]:
    """Read a stream to its end; the latency of every text event (the client's clock when the read
    that completed its frame returned, minus its ``ts``); its frames and its text events."""
    frames = texts = 0
    tail = b""
    while chunk := await content.readany():
        now = time.time()
        buffer = tail + chunk
        cut = buffer.rfind(FRAME_END)
        if cut < 0:
            tail = buffer
            continue
        complete, tail = buffer[: cut + 4], buffer[cut + 4 :]
        frames += complete.count(FRAME_END)
        for match in TEXT_TS.finditer(complete):
            latencies.append((now - float(match.group(1))) * 1000)
            texts += 1
    return frames, texts


async def read_live(
    responses: list[aiohttp.ClientResponse], parsed: int
) -> tuple[list[int], list[float], list[int]]:
    """Read every stream to its end: every k-th parses and times text events, the rest count frames.

    The frames of every stream, the latencies of the parsed text events, and how many text events
    each parsing stream had.
    """
    latencies: list[float] = []
    texts: list[int] = []
    step = max(1, len(responses) // parsed)

    async def parse(response: aiohttp.ClientResponse) -> int:
        frames, text = await parse_frames(response.content, latencies)
        texts.append(text)
        return frames

    async def one(index: int, response: aiohttp.ClientResponse) -> int:
        try:
            return await (parse(response) if index % step == 0 else count_frames(response.content))
        finally:
            response.release()

    counts = await asyncio.gather(*(one(i, r) for i, r in enumerate(responses)))
    return list(counts), latencies, texts


def live_figures(
    counts: list[int],
    latencies: list[float],
    texts: list[int],
    tokens: int,
    meter: Meter,
    stream_started: float,
    ended: float,
    paced: float,
) -> dict[str, Any]:
    """One live round's figures; ``tokens``: the text events each parsing subscriber must see."""
    delivered = sum(counts)
    stream_s = ended - stream_started
    return {
        "p50_ms": percentile(latencies, 0.5) if latencies else None,
        "p99_ms": percentile(latencies, 0.99) if latencies else None,
        "max_ms": max(latencies) if latencies else None,
        "deliveries": delivered,
        # Streams with fewer frames than the longest, or parsers that missed text events.
        "short_subscribers": max(
            sum(1 for c in counts if c < max(counts)), sum(1 for t in texts if t != tokens)
        ),
        "cpu_us_per_delivery": meter.server_cpu / delivered * 1e6 if delivered else None,
        "stream_s": stream_s,
        "server_busy": meter.server_cpu / max(stream_s, 1e-9),
        "client_busy": meter.client_cpu / max(stream_s, 1e-9),
        "paced_s": paced,
    }


async def live_service_round(
    http: aiohttp.ClientSession, stack: ServiceStack, n: int, cfg: Config, tag: str
) -> dict[str, Any]:
    """One paced answer to ``n`` subscribers of the service."""
    paced = cfg.live_tokens / cfg.live_tps
    # The subscribers must be in before the first token: a fresh connection sees only what follows.
    ttft_ms = 3000 + 2 * n
    message = f"live {tag} [emu:tokens={cfg.live_tokens}] [emu:tps={cfg.live_tps:g}] [emu:ttft={ttft_ms}]"
    posted = time.monotonic()
    session_id = await new_session(http, stack.url, message)
    responses = await connect_many(http, stack.url + f"/sessions/{session_id}/events", n)
    connected = time.monotonic()
    with Meter(stack.pid) as meter:
        counts, latencies, texts = await read_live(responses, cfg.live_parsed)
    ended = time.monotonic()
    async with http.get(stack.emulator_url + "/_emulator/records") as response:
        record = next(r for r in await response.json() if r["user_text"] == message)
    started = record["first_token_at"] or posted + ttft_ms / 1000
    figures = live_figures(counts, latencies, texts, cfg.live_tokens, meter, started, ended, paced)
    figures["connected_before_first_token"] = connected < started
    return figures


async def live_peer_round(
    http: aiohttp.ClientSession, url: str, pid: int, n: int, cfg: Config
) -> dict[str, Any]:
    """One paced broadcast to ``n`` subscribers of a peer."""
    paced = cfg.live_tokens / cfg.live_tps
    responses = await connect_many(http, url + "/live", n)
    while True:  # the handlers register their queue before the headers go out; be sure anyway
        async with http.get(url + "/count") as response:
            if (await response.json())["subscribers"] >= n:
                break
        await asyncio.sleep(0.05)
    with Meter(pid) as meter:
        started = time.monotonic()
        query = f"events={cfg.live_tokens}&interval_ms={1000 / cfg.live_tps}"
        async with http.post(url + f"/start?{query}") as response:
            response.raise_for_status()
        counts, latencies, texts = await read_live(responses, cfg.live_parsed)
    ended = time.monotonic()
    figures = live_figures(counts, latencies, texts, cfg.live_tokens, meter, started, ended, paced)
    figures["connected_before_first_token"] = True
    return figures


async def scenario_live(cfg: Config) -> dict[str, Any]:
    """A paced answer to 100, 1,000, 5,000 SSE subscribers: service, baseline, peers."""
    result: dict[str, Any] = {
        "tokens": cfg.live_tokens,
        "tokens_per_second": cfg.live_tps,
        "parsed_subscribers": cfg.live_parsed,
        "rounds": cfg.rounds,
        "sizes": {},
        "not_installed": [],
    }
    async with contextlib.AsyncExitStack() as stack:
        service = await stack.enter_async_context(ServiceStack(cfg, NO_MERGE))
        http = await stack.enter_async_context(client_session())
        directory = stack.enter_context(tempfile.TemporaryDirectory())
        # A real text event of the service, as the peers' template (same fields, same size).
        session_id, _ = await fill_session(http, service.url, 3)
        template = next(
            e for e in await poll_all(http, service.url, session_id) if e["type"] == "assistant_text"
        )
        peer_file = write_json(directory, "peer.json", {"template": template})
        runners: dict[str, Callable[[int, str], Awaitable[dict[str, Any]]]] = {
            SERVICE: lambda n, tag: live_service_round(http, service, n, cfg, tag)
        }
        if cfg.baseline is not None:
            base = await stack.enter_async_context(ServiceStack(cfg, NO_MERGE, source=cfg.baseline))
            runners[BASELINE] = lambda n, tag: live_service_round(http, base, n, cfg, tag)
        peers = [(BARE, "aiohttp")] + [(FASTAPI, "fastapi")] * installed("fastapi")
        if not installed("fastapi"):
            result["not_installed"].append(FASTAPI)
        for name, kind in peers:
            url, pid = stack.enter_context(peer_process(kind, peer_file))
            await wait_until_up(url + "/healthz")
            runners[name] = lambda n, tag, url=url, pid=pid: live_peer_round(http, url, pid, n, cfg)
        for n in cfg.live_sizes:
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name in runners}
            for round_no in range(cfg.rounds):
                for name, run in runners.items():
                    runs[name].append(await run(n, f"n{n}_r{round_no}"))
                    await asyncio.sleep(0.5)  # let the closed connections settle
            summary: dict[str, Any] = {}
            for name, r in runs.items():
                summary[name] = {
                    key: round(med(r, key), 3)
                    for key in (
                        "p50_ms",
                        "p99_ms",
                        "max_ms",
                        "cpu_us_per_delivery",
                        "stream_s",
                        "server_busy",
                        "client_busy",
                    )
                }
                summary[name]["deliveries"] = round(med(r, "deliveries"))
                summary[name]["paced_s"] = r[0]["paced_s"]
                summary[name]["short_subscribers"] = max(x["short_subscribers"] for x in r)
                summary[name]["connected_before_first_token"] = all(
                    x["connected_before_first_token"] for x in r
                )
                summary[name]["rounds_p99_ms"] = [round(x["p99_ms"] or 0, 1) for x in r]
                # Kept up: the answer took at most 20% longer than its pacing, and p99 < 1 s.
                summary[name]["kept_up"] = (
                    summary[name]["stream_s"] <= 1.2 * summary[name]["paced_s"] + 0.5
                    and (summary[name]["p99_ms"] or 0) < 1000
                )
            s = summary[SERVICE]
            summary["ratios"] = {
                f"service/{peer} cpu_us_per_delivery": ratio(
                    s["cpu_us_per_delivery"], summary[peer]["cpu_us_per_delivery"]
                )
                for peer in (BARE, FASTAPI)
                if peer in summary
            } | {
                f"service/{peer} p99": ratio(s["p99_ms"], summary[peer]["p99_ms"])
                for peer in (BARE, FASTAPI)
                if peer in summary
            }
            if BASELINE in summary:
                b = summary[BASELINE]
                summary["ratios"]["current/baseline p99"] = ratio(s["p99_ms"], b["p99_ms"])
                summary["ratios"]["current/baseline cpu_us_per_delivery"] = ratio(
                    s["cpu_us_per_delivery"], b["cpu_us_per_delivery"]
                )
            result["sizes"][str(n)] = summary
    return result


# -- 4. concurrent runs -----------------------------------------------------------------------


@dataclass
class Run:
    """One POST /agent/stream as the client saw it."""

    message: str
    ttft_ms: int
    tps: int
    started: float = 0.0
    tokens: list[float] = field(default_factory=list)
    ok: bool = False


async def agent_run(http: aiohttp.ClientSession, url: str, run: Run) -> Run:
    """POST /agent/stream; the arrival time of every text token."""
    run.started = time.monotonic()
    last = b""
    async with http.post(url + "/agent/stream", json={"message": run.message}) as response:
        response.raise_for_status()
        async for line in response.content:
            if line.startswith(b"data:"):
                if b'"text_delta"' in line:
                    run.tokens.append(time.monotonic())
                last = line
    run.ok = b'"done"' in last
    return run


def spread(values: list[float]) -> dict[str, float | None]:
    """p50, p99 and max, rounded."""
    if not values:
        return {"p50": None, "p99": None, "max": None}
    return {
        "p50": round(percentile(values, 0.5), 2),
        "p99": round(percentile(values, 0.99), 2),
        "max": round(max(values), 2),
    }


async def concurrent_batch(
    http: aiohttp.ClientSession, stack: ServiceStack, n: int, cfg: Config, rng: random.Random, tag: str
) -> dict[str, Any]:
    """``n`` runs at once, each with its own pacing; what the service adds to it."""
    runs = [
        Run(
            f"conc {tag}_{i} [emu:tokens={cfg.conc_tokens}] [emu:ttft={ttft}] [emu:tps={tps}]",
            ttft,
            tps,
        )
        for i, (ttft, tps) in enumerate((rng.randint(600, 1200), rng.randint(50, 150)) for _ in range(n))
    ]
    emulator_cpu = cpu_seconds(stack.emulator_pid)
    with Meter(stack.pid) as meter:
        since = time.monotonic()
        await asyncio.gather(*(agent_run(http, stack.url, run) for run in runs))
    emulator_cpu = cpu_seconds(stack.emulator_pid) - emulator_cpu
    async with http.get(stack.url + f"/healthz?lag_since={since}") as response:
        lag = (await response.json())["loop_lag_ms"]
    async with http.get(stack.emulator_url + "/_emulator/records") as response:
        records = {r["user_text"]: r for r in await response.json()}
    gaps, late, ttft_added, first_added, to_upstream = [], [], [], [], []
    for run in runs:
        if not run.tokens:
            continue
        interval = 1000 / run.tps
        first = run.tokens[0]
        ttft_added.append((first - run.started) * 1000 - run.ttft_ms)
        record = records.get(run.message)
        if record and record.get("first_token_at"):
            first_added.append((first - record["first_token_at"]) * 1000)
            to_upstream.append((record["started_at"] - run.started) * 1000)
        for k in range(1, len(run.tokens)):
            gaps.append((run.tokens[k] - run.tokens[k - 1]) * 1000 - interval)
            late.append((run.tokens[k] - first) * 1000 - k * interval)
    paced_s = median([r.ttft_ms / 1000 + (cfg.conc_tokens - 1) / r.tps for r in runs])
    return {
        "runs": n,
        "done": sum(run.ok for run in runs),
        "tokens_seen": sum(len(run.tokens) for run in runs),
        "gap_minus_paced_ms": spread(gaps),
        "late_vs_schedule_ms": spread(late),
        "ttft_added_ms": spread(ttft_added),
        "emulator_first_token_to_client_ms": spread(first_added),
        "post_to_upstream_request_ms": spread(to_upstream),
        "loop_lag_ms": lag,
        "wall_s": round(meter.wall, 2),
        "paced_run_s_median": round(paced_s, 2),
        "service_busy": round(meter.server_cpu / meter.wall, 2),
        "emulator_busy": round(emulator_cpu / meter.wall, 2),
        "client_busy": round(meter.client_cpu / meter.wall, 2),
        "service_cpu_us_per_token": round(
            meter.server_cpu / max(1, sum(len(r.tokens) for r in runs)) * 1e6, 1
        ),
    }


async def scenario_concurrency(cfg: Config) -> dict[str, Any]:
    """200 and 500 runs at once on the paced emulator (no peer runs an agent)."""
    result: dict[str, Any] = {"tokens_per_run": cfg.conc_tokens, "rounds": cfg.rounds, "sizes": {}}
    rng = random.Random(cfg.seed)
    env = {"AGENT_MAX_CONCURRENT_RUNS": "1000"}
    async with ServiceStack(cfg, env) as stack, client_session() as http:
        # Warm boto3's connection pool and the code paths, as a running service has them.
        await asyncio.gather(
            *(agent_run(http, stack.url, Run(f"warm {i} [emu:tokens=5]", 0, 1)) for i in range(cfg.conc_warm))
        )
        batches: dict[int, list[dict[str, Any]]] = {n: [] for n in cfg.conc_sizes}
        for round_no in range(cfg.rounds):
            for n in cfg.conc_sizes:
                batches[n].append(await concurrent_batch(http, stack, n, cfg, rng, f"r{round_no}_n{n}"))
                await asyncio.sleep(0.5)
    for n, rounds in batches.items():
        summary: dict[str, Any] = {
            "runs": n,
            "done": min(r["done"] for r in rounds),
            "wall_s": med(rounds, "wall_s"),
            "paced_run_s_median": med(rounds, "paced_run_s_median"),
        }
        for key in (
            "gap_minus_paced_ms",
            "late_vs_schedule_ms",
            "ttft_added_ms",
            "post_to_upstream_request_ms",
            "emulator_first_token_to_client_ms",
        ):
            summary[key] = {
                q: median([r[key][q] for r in rounds if r[key][q] is not None]) for q in ("p50", "p99", "max")
            }
        summary["loop_lag_ms"] = {
            q: median([r["loop_lag_ms"][q] for r in rounds]) for q in ("p50", "p99", "max")
        }
        for key in ("service_busy", "emulator_busy", "client_busy", "service_cpu_us_per_token"):
            summary[key] = med(rounds, key)
        summary["rounds"] = rounds
        result["sizes"][str(n)] = summary
    return result


# -- 5. idle connections ----------------------------------------------------------------------


async def open_idle_sse(http: aiohttp.ClientSession, urls: list[str], n: int) -> list[aiohttp.ClientResponse]:
    """``n`` SSE streams over ``urls`` (round robin), each having sent its first line."""

    async def one(i: int) -> aiohttp.ClientResponse:
        response = await http.get(urls[i % len(urls)])
        await response.content.readline()
        return response

    responses: list[aiohttp.ClientResponse] = []
    for start in range(0, n, 1000):
        responses += await asyncio.gather(*(one(i) for i in range(start, min(n, start + 1000))))
    return responses


async def open_idle_ws(http: aiohttp.ClientSession, url: str, session_id: str, n: int) -> list[Any]:
    """``n`` WebSockets, each subscribed to an idle session (two frames back: subscribed, status)."""
    subscribe = json.dumps({"type": "subscribe", "session_id": session_id})

    async def one() -> aiohttp.ClientWebSocketResponse:
        ws = await http.ws_connect(url, heartbeat=None, compress=0)
        await ws.send_str(subscribe)
        for _ in range(2):
            await ws.receive()
        return ws

    sockets: list[Any] = []
    for start in range(0, n, 500):
        sockets += await asyncio.gather(*(one() for _ in range(min(500, n - start))))
    return sockets


async def idle_round(cfg: Config, target: str, directory: str) -> int:
    """A fresh server, ``cfg.idle_connections`` idle connections: its RSS growth per connection."""
    n = cfg.idle_connections
    async with contextlib.AsyncExitStack() as stack:
        http = await stack.enter_async_context(client_session())
        if target.startswith(SERVICE):
            service = await stack.enter_async_context(ServiceStack(cfg))
            pid = service.pid
            if target.endswith("sse"):
                sessions = [
                    await new_session(http, service.url, f"wait {i} [emu:ttft=600000]") for i in range(10)
                ]
                urls = [service.url + f"/sessions/{s}/events" for s in sessions]
            else:
                ws_session = await new_session(http, service.url)
                ws_url = service.url + "/ws"
        else:
            kind = {BARE: "aiohttp", FASTAPI: "fastapi", WEBSOCKETS: "websockets"}[target]
            peer_file = write_json(directory, "peer.json", {})
            url, pid = stack.enter_context(peer_process(kind, peer_file))
            await wait_until_up(url if kind == "websockets" else url + "/healthz")
            urls, ws_url, ws_session = [url + "/idle"], url, "idle"
        await asyncio.sleep(0.5)
        before = rss_bytes(pid)
        if target in (WEBSOCKETS, SERVICE + " ws"):
            opened = await open_idle_ws(http, ws_url, ws_session, n)
        else:
            opened = await open_idle_sse(http, urls, n)
        await asyncio.sleep(0.5)
        after = rss_bytes(pid)
        for connection in opened:
            if isinstance(connection, aiohttp.ClientWebSocketResponse):
                await connection.close()
            else:
                connection.close()
    return round((after - before) / n)


async def scenario_idle(cfg: Config) -> dict[str, Any]:
    """10,000 idle SSE and 10,000 idle WebSocket connections: server RSS per connection."""
    targets = {
        "sse": [SERVICE + " sse", BARE] + [FASTAPI] * installed("fastapi"),
        "ws": [SERVICE + " ws"] + [WEBSOCKETS] * installed("websockets"),
    }
    result: dict[str, Any] = {"connections": cfg.idle_connections, "rounds": cfg.rounds, "sse": {}, "ws": {}}
    per: dict[str, list[int]] = {t: [] for ts in targets.values() for t in ts}
    with tempfile.TemporaryDirectory() as directory:
        for _ in range(cfg.rounds):
            for transport_targets in targets.values():
                for target in transport_targets:
                    per[target].append(await idle_round(cfg, target, directory))
    for transport, names in targets.items():
        for target in names:
            name = SERVICE if target.startswith(SERVICE) else target
            result[transport][name] = {
                "rss_bytes_per_connection": round(median(per[target])),
                "rounds": per[target],
            }
    if not installed("fastapi"):
        result["sse"][FASTAPI] = "not installed"
    if not installed("websockets"):
        result["ws"][WEBSOCKETS] = "not installed"
    sse = {k: v for k, v in result["sse"].items() if isinstance(v, dict)}
    ws = {k: v for k, v in result["ws"].items() if isinstance(v, dict)}
    result["ratios"] = {
        "sse service/bare": ratio(
            sse[SERVICE]["rss_bytes_per_connection"], sse[BARE]["rss_bytes_per_connection"]
        ),
        "sse service/fastapi": ratio(
            sse[SERVICE]["rss_bytes_per_connection"], sse.get(FASTAPI, {}).get("rss_bytes_per_connection", 0)
        ),
        "ws service/websockets": ratio(
            ws[SERVICE]["rss_bytes_per_connection"], ws.get(WEBSOCKETS, {}).get("rss_bytes_per_connection", 0)
        ),
    }
    return result


# -- 6. slow reader ---------------------------------------------------------------------------


def stalled_reader(port: int, path: str) -> socket.socket:
    """A client that sends its request and then never reads (a tiny receive buffer)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)  # before connect: sets the window
    sock.connect(("127.0.0.1", port))
    sock.sendall(
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: text/event-stream\r\n\r\n".encode()
    )
    return sock


async def slow_round(cfg: Config, with_slow: bool, tag: str) -> dict[str, Any]:
    """A fresh service, one unpaced long answer to the normal subscribers (and the stalled one)."""
    # The answer is longer than a model turn's default token cap (4096). Delta merging is off: a
    # stalled reader's merged backlog is small enough to sit in the kernel's socket buffers, and
    # the point is a backlog that reaches the service.
    env = {"AGENT_MAX_TOKENS": str(max(4096, cfg.slow_tokens + 100)), **NO_MERGE}
    async with ServiceStack(cfg, env) as stack, client_session() as http:
        message = f"slow {tag} [emu:tokens={cfg.slow_tokens}] [emu:ttft=2000]"  # unpaced after 2 s
        session_id = await new_session(http, stack.url, message)
        path = f"/sessions/{session_id}/events"
        responses = await connect_many(http, stack.url + path, cfg.slow_subscribers)
        slow = stalled_reader(stack.port, path) if with_slow else None
        await asyncio.sleep(0.2)
        before = rss_bytes(stack.pid)
        peak = before
        sampling = True

        async def sample() -> None:
            nonlocal peak
            while sampling:
                peak = max(peak, rss_bytes(stack.pid))
                await asyncio.sleep(0.05)

        sampler = asyncio.create_task(sample())
        with Meter(stack.pid) as meter:
            counts, latencies, _ = await read_live(responses, cfg.slow_parsed)
        sampling = False
        await sampler
        await asyncio.sleep(0.5)  # what the service still holds once the others are done
        after = rss_bytes(stack.pid)
        ended = time.monotonic()
        async with http.get(stack.url + f"/sessions/{session_id}") as response:
            last_id = (await response.json())["last_event_id"]
        async with http.get(stack.emulator_url + "/_emulator/records") as response:
            record = next(r for r in await response.json() if r["user_text"] == message)
        # Streams the service still holds once the normal readers are done: the stalled one, if
        # its writes are still blocked (rather than all of it sitting in socket buffers).
        async with http.get(stack.url + "/metrics") as response:
            metrics = await response.text()
        still_open = sum(
            float(line.rsplit(" ", 1)[1])
            for line in metrics.splitlines()
            if line.startswith('agentstream_connections{transport="sse"}')
        )
        if slow is not None:
            slow.close()
    delivered = sum(counts)
    return {
        "with_slow_reader": with_slow,
        "events_in_log": last_id,
        "p50_ms": percentile(latencies, 0.5),
        "p99_ms": percentile(latencies, 0.99),
        "max_ms": max(latencies),
        "answer_s": ended - (record["first_token_at"] or ended),
        "streams_open_after": still_open,
        "rss_growth_bytes": after - before,
        "rss_peak_growth_bytes": max(peak, after) - before,
        "cpu_us_per_delivery": meter.server_cpu / delivered * 1e6,
        "server_busy": meter.server_cpu / meter.wall,
        "client_busy": meter.client_cpu / meter.wall,
    }


async def scenario_slow(cfg: Config) -> dict[str, Any]:
    """Normal subscribers with and without a stalled one, alternating, a fresh service each."""
    runs: dict[str, list[dict[str, Any]]] = {"without": [], "with": []}
    for round_no in range(cfg.rounds):
        runs["without"].append(await slow_round(cfg, False, f"r{round_no}_without"))
        runs["with"].append(await slow_round(cfg, True, f"r{round_no}_with"))
    result: dict[str, Any] = {
        "subscribers": cfg.slow_subscribers,
        "parsed_subscribers": cfg.slow_parsed,
        "tokens": cfg.slow_tokens,
        "rounds": cfg.rounds,
        "merge_deltas_after": "off",
    }
    for name, r in runs.items():
        result[name] = {
            key: round(med(r, key), 2)
            for key in (
                "events_in_log",
                "p50_ms",
                "p99_ms",
                "max_ms",
                "answer_s",
                "rss_growth_bytes",
                "rss_peak_growth_bytes",
                "cpu_us_per_delivery",
                "server_busy",
                "client_busy",
                "streams_open_after",
            )
        }
        result[name]["rounds_p99_ms"] = [round(x["p99_ms"], 1) for x in r]
    result["ratios"] = {
        "with/without p99": ratio(result["with"]["p99_ms"], result["without"]["p99_ms"]),
        "with/without rss_peak_growth": ratio(
            result["with"]["rss_peak_growth_bytes"], result["without"]["rss_peak_growth_bytes"]
        ),
    }
    return result


# -- peers (run in their own process: --serve-peer KIND PORT FILE) ----------------------------


async def broadcast(
    queues: set[asyncio.Queue[tuple[str, str, str] | None]],
    template: dict[str, Any],
    events: int,
    interval: float,
) -> None:
    """Every ``interval`` seconds one text event, stamped with ``ts``, to every subscriber; then done."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    for k in range(1, events + 1):
        delay = started + (k - 1) * interval - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        payload = {**template, "id": k, "ts": round(time.time(), 6)}
        item = (str(k), "assistant_text", json.dumps(payload, separators=(",", ":"), ensure_ascii=False))
        for queue in queues:
            queue.put_nowait(item)
    done = json.dumps({"type": "done", "id": events + 1, "ts": round(time.time(), 6)}, separators=(",", ":"))
    for queue in queues:
        queue.put_nowait((str(events + 1), "done", done))
        queue.put_nowait(None)


IDLE_STATUS = json.dumps({"type": "status_change", "status": "running"}, separators=(",", ":"))


def serve_aiohttp(port: int, data: dict[str, Any]) -> None:
    """Bare aiohttp-sse: a broadcast from a queue per subscriber (live) and idle streams."""
    from aiohttp import web
    from aiohttp_sse import sse_response

    subscribers: set[asyncio.Queue[tuple[str, str, str] | None]] = set()
    tasks: set[asyncio.Task[None]] = set()

    async def live(request: web.Request) -> web.StreamResponse:
        queue: asyncio.Queue[tuple[str, str, str] | None] = asyncio.Queue()
        subscribers.add(queue)
        try:
            async with sse_response(request, ping_interval=3600) as response:
                while (item := await queue.get()) is not None:
                    await response.send(item[2], id=item[0], event=item[1])
        finally:
            subscribers.discard(queue)
        return response

    async def idle(request: web.Request) -> web.StreamResponse:
        async with sse_response(request, ping_interval=3600) as response:
            await response.send(IDLE_STATUS, event="status_change")
            await asyncio.get_running_loop().create_future()
        return response

    async def start(request: web.Request) -> web.Response:
        task = asyncio.create_task(
            broadcast(
                subscribers,
                data["template"],
                int(request.query["events"]),
                float(request.query["interval_ms"]) / 1000,
            )
        )
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        return web.json_response({"subscribers": len(subscribers)})

    async def count(request: web.Request) -> web.Response:
        return web.json_response({"subscribers": len(subscribers)})

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/live", live)
    app.router.add_get("/idle", idle)
    app.router.add_post("/start", start)
    app.router.add_get("/count", count)
    app.router.add_get("/healthz", health)
    web.run_app(
        app,
        host="127.0.0.1",
        port=port,
        print=lambda *_: None,
        access_log=None,
        handler_cancellation=True,
        shutdown_timeout=1,
    )


def serve_fastapi(port: int, data: dict[str, Any]) -> None:
    """FastAPI + sse-starlette on uvicorn: replay from a list, live broadcast, idle streams."""
    import uvicorn
    from fastapi import FastAPI
    from fastapi.responses import PlainTextResponse
    from sse_starlette import EventSourceResponse, ServerSentEvent

    events = data.get("events", [])
    subscribers: set[asyncio.Queue[tuple[str, str, str] | None]] = set()
    tasks: set[asyncio.Task[None]] = set()
    app = FastAPI()

    @app.get("/replay")
    async def replay():
        async def stream():
            for event_id, name, payload in events:
                yield ServerSentEvent(data=payload, id=str(event_id), event=name)

        return EventSourceResponse(stream(), ping=3600)

    @app.get("/live")
    async def live():
        queue: asyncio.Queue[tuple[str, str, str] | None] = asyncio.Queue()
        subscribers.add(queue)

        async def stream():
            try:
                while (item := await queue.get()) is not None:
                    yield ServerSentEvent(data=item[2], id=item[0], event=item[1])
            finally:
                subscribers.discard(queue)

        return EventSourceResponse(stream(), ping=3600)

    @app.get("/idle")
    async def idle():
        async def stream():
            yield ServerSentEvent(data=IDLE_STATUS, event="status_change")
            await asyncio.get_running_loop().create_future()

        return EventSourceResponse(stream(), ping=3600)

    @app.post("/start")
    async def start(events: int, interval_ms: float):
        task = asyncio.create_task(broadcast(subscribers, data["template"], events, interval_ms / 1000))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        return {"subscribers": len(subscribers)}

    @app.get("/count")
    async def count():
        return {"subscribers": len(subscribers)}

    @app.get("/healthz", response_class=PlainTextResponse)
    async def health():
        return "ok"

    http = "httptools" if importlib.util.find_spec("httptools") else "h11"
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        loop="asyncio",  # the same event loop as the service and aiohttp
        http=http,
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=1,
    )


def serve_websockets(port: int, data: dict[str, Any]) -> None:
    """A bare websockets server: the service's replay frames verbatim, or an idle subscription."""
    from websockets.asyncio.server import ServerConnection, serve

    frames: list[str] = data.get("ws_frames", [])

    async def handler(ws: ServerConnection) -> None:
        request = json.loads(await ws.recv())
        if request.get("last_event_id") is None:  # idle: the acknowledgement and the status
            session_id = request.get("session_id")
            await ws.send(json.dumps({"type": "subscribed", "session_id": session_id}, separators=(",", ":")))
            await ws.send(
                json.dumps({"session_id": session_id, **json.loads(IDLE_STATUS)}, separators=(",", ":"))
            )
        else:
            for frame in frames:
                await ws.send(frame)
        await ws.wait_closed()

    async def main() -> None:
        async with serve(handler, "127.0.0.1", port, compression=None, max_size=2**20) as server:
            await server.serve_forever()

    asyncio.run(main())


def serve_peer(kind: str, port: int, path: str) -> None:
    """Run one peer server until terminated."""
    data = json.loads(Path(path).read_text())
    {"aiohttp": serve_aiohttp, "fastapi": serve_fastapi, "websockets": serve_websockets}[kind](port, data)


# -- report -----------------------------------------------------------------------------------


def fmt(value: Any, digits: int = 1) -> str:
    """A number for the table."""
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, int) or (isinstance(value, float) and abs(value) >= 1000):
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def table(headers: list[str], rows: list[list[Any]]) -> None:
    """Print rows under headers, columns aligned (the first left, the rest right)."""
    cells = [headers] + [
        [row[0]] + [fmt(c) if not isinstance(c, str) else c for c in row[1:]] for row in rows
    ]
    widths = [max(len(str(r[i])) for r in cells) for i in range(len(headers))]
    for r in cells:
        print(
            "  "
            + "  ".join(
                str(c).ljust(w) if i == 0 else str(c).rjust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=True))
            )
        )


def print_ratios(ratios: dict[str, Any]) -> None:
    """The ratios line."""
    shown = [f"{k} {fmt(v, 2)}" for k, v in ratios.items()]
    if shown:
        print("  ratios: " + ", ".join(shown))


def throughput_rows(targets: dict[str, Any]) -> list[list[Any]]:
    """Rows of a replay table."""
    rows = []
    for name, v in targets.items():
        if isinstance(v, str):
            rows.append([name, v, "", "", ""])
        else:
            rounds = " ".join(f"{x:,}" for x in v["rounds_events_per_s"])
            rows.append(
                [name, v["events_per_s"], v["cpu_us_per_event"], f"{v['client_busy'] * 100:.0f}%", rounds]
            )
    return rows


def report(result: dict[str, Any], cfg: Config) -> None:
    """Print the tables."""
    pin = (
        f"servers on CPU {SERVER_CPU}, client on CPU {CLIENT_CPU}"
        if can_pin()
        else "NOT pinned (fewer than 2 CPUs)"
    )
    print(
        f"bench_peers: {pin}, emulator on CPU {cfg.emulator_cpu}; medians of {cfg.rounds} alternating round(s)"
    )
    for note in cfg.notes:
        print(f"  {note}")
    if "replay" in result:
        r = result["replay"]
        print(
            f"\n1. replay fan-out: {r['events_in_log']} events x {r['subscribers']} SSE subscribers from Last-Event-ID 0"
        )
        table(
            ["target", "events/s", "CPU us/event", "client busy", "events/s by round"],
            throughput_rows(r["targets"]),
        )
        print_ratios(r["ratios"])
    if "ws" in result:
        r = result["ws"]
        print(f"\n2. replay over WebSocket: {r['events_in_log']} events x {r['subscribers']} subscribers")
        table(
            ["target", "events/s", "CPU us/event", "client busy", "events/s by round"],
            throughput_rows(r["targets"]),
        )
        print_ratios(r["ratios"])
    if "live" in result:
        r = result["live"]
        print(
            f"\n3. live fan-out: {r['tokens']} tokens at {r['tokens_per_second']:g}/s; latency = client read - ts "
            f"({r['parsed_subscribers']} parsing subscribers); busy = CPU s / stream s"
        )
        for name in r["not_installed"]:
            print(f"  {name}: not installed")
        rows = []
        for n, summary in r["sizes"].items():
            for name, v in summary.items():
                if name == "ratios":
                    continue
                rows.append(
                    [
                        f"{int(n):,} {name}",
                        v["p50_ms"],
                        v["p99_ms"],
                        v["max_ms"],
                        v["deliveries"],
                        v["cpu_us_per_delivery"],
                        f"{v['stream_s']:.1f}/{v['paced_s']:.0f}",
                        f"{v['server_busy'] * 100:.0f}%",
                        f"{v['client_busy'] * 100:.0f}%",
                        "yes" if v["kept_up"] else "NO",
                        v["short_subscribers"],
                    ]
                )
        table(
            [
                "subscribers target",
                "p50 ms",
                "p99 ms",
                "max ms",
                "deliveries",
                "CPU us/deliv",
                "stream/paced s",
                "server busy",
                "client busy",
                "kept up",
                "short",
            ],
            rows,
        )
        for n, summary in r["sizes"].items():
            print(f"  {int(n):,}:", end="")
            print_ratios(summary["ratios"])
    if "concurrency" in result:
        r = result["concurrency"]
        print(
            f"\n4. concurrent runs (POST /agent/stream, {r['tokens_per_run']} tokens, ttft 600-1200 ms, "
            "50-150 tokens/s each; service only: no peer runs an agent)"
        )
        rows = []
        for n, v in r["sizes"].items():

            def three(d: dict[str, Any]) -> str:
                return "/".join(fmt(d[q]) for q in ("p50", "p99", "max"))

            rows.append(
                [
                    f"{int(n):,} runs",
                    f"{v['done']}/{n}",
                    three(v["gap_minus_paced_ms"]),
                    three(v["late_vs_schedule_ms"]),
                    three(v["ttft_added_ms"]),
                    three(v["post_to_upstream_request_ms"]),
                    three(v["emulator_first_token_to_client_ms"]),
                    three(v["loop_lag_ms"]),
                    v["service_cpu_us_per_token"],
                    f"{v['service_busy'] * 100:.0f}/{v['emulator_busy'] * 100:.0f}/{v['client_busy'] * 100:.0f}%",
                ]
            )
        table(
            [
                "batch",
                "done",
                "gap-1/tps ms p50/p99/max",
                "late vs schedule ms",
                "TTFT added ms",
                "POST->emulator ms",
                "emu 1st token->client ms",
                "loop lag ms",
                "CPU us/token",
                "busy svc/emu/client",
            ],
            rows,
        )
    if "idle" in result:
        r = result["idle"]
        print(
            f"\n5. idle: {r['connections']:,} connections, server RSS bytes per connection (fresh process per round)"
        )
        rows = []
        for transport in ("sse", "ws"):
            for name, v in r[transport].items():
                rows.append(
                    [f"{transport.upper()} {name}"]
                    + (
                        [v, ""]
                        if isinstance(v, str)
                        else [v["rss_bytes_per_connection"], " ".join(f"{x:,}" for x in v["rounds"])]
                    )
                )
        table(["target", "bytes/conn", "by round"], rows)
        print_ratios(r["ratios"])
    if "slow" in result:
        r = result["slow"]
        print(
            f"\n6. slow reader: {r['subscribers']} SSE subscribers ({r['parsed_subscribers']} parse) + 1 that never "
            f"reads, {r['tokens']:,} unpaced tokens, delta merging off; a fresh service per round"
        )
        rows = [
            [
                f"{name} slow reader",
                v["events_in_log"],
                v["p50_ms"],
                v["p99_ms"],
                v["max_ms"],
                v["answer_s"],
                v["rss_growth_bytes"] / 2**20,
                v["rss_peak_growth_bytes"] / 2**20,
                v["cpu_us_per_delivery"],
                f"{v['server_busy'] * 100:.0f}%",
                f"{v['client_busy'] * 100:.0f}%",
                v["streams_open_after"],
            ]
            for name, v in ((k, r[k]) for k in ("without", "with"))
        ]
        table(
            [
                "round",
                "events",
                "p50 ms",
                "p99 ms",
                "max ms",
                "answer s",
                "RSS growth MiB",
                "peak growth MiB",
                "CPU us/deliv",
                "server busy",
                "client busy",
                "streams held after",
            ],
            rows,
        )
        print_ratios(r["ratios"])


# -- main -------------------------------------------------------------------------------------

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
    parser.add_argument("--baseline", metavar="GIT_REF", help="also run replay and live against this ref")
    parser.add_argument(
        "--emulator-cpu",
        type=int,
        choices=[CLIENT_CPU, SERVER_CPU],
        default=CLIENT_CPU,
        help="the core of the emulator (default: the client's)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON only")
    parser.add_argument("--serve-peer", nargs=3, metavar=("KIND", "PORT", "FILE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_peer:
        serve_peer(args.serve_peer[0], int(args.serve_peer[1]), args.serve_peer[2])
        return

    global LOGS
    LOGS = Path(tempfile.mkdtemp(prefix="bench_peers-logs-"))
    cfg = Config.quick() if args.quick else Config()
    if args.rounds:
        cfg.rounds = args.rounds
    cfg.emulator_cpu = args.emulator_cpu
    raise_fd_limit()
    if can_pin():
        os.sched_setaffinity(0, {CLIENT_CPU})
    else:
        cfg.notes.append("fewer than 2 CPUs available: nothing is pinned")
    names = args.only or list(SCENARIOS)
    result: dict[str, Any] = {}
    try:
        run_scenarios(args, cfg, names, result)
    except BaseException:
        print(f"bench_peers: failed; the servers' stderr is in {LOGS}", file=sys.stderr)
        raise
    shutil.rmtree(LOGS, ignore_errors=True)
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
        if args.baseline and {"replay", "live"} & set(names):
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
