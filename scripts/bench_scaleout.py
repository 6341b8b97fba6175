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
import resource
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import ROOT  # noqa: E402
from benchlib.procs import NO_QUOTAS, cpu_seconds, free_port, wait_until_up  # noqa: E402
from benchlib.procs import raise_open_file_limit as raise_fd_limit  # noqa: E402
from benchlib.stats import percentile  # noqa: E402

T = TypeVar("T")

CONFIGS: dict[str, tuple[str, int, bool]] = {
    "a": ("1 instance, memory", 1, False),
    "b": ("1 instance, Redis", 1, True),
    "c": ("2 instances, Redis", 2, True),
}


# -- processes ----------------------------------------------------------------------------------


class Cluster:
    """``instances`` service processes, on Redis under ``prefix`` when ``redis_url`` is set."""

    def __init__(
        self, args: argparse.Namespace, instances: int, redis_url: str, prefix: str, logs: Path
    ) -> None:
        self.ports = [free_port() for _ in range(instances)]
        self.urls = [f"http://127.0.0.1:{port}" for port in self.ports]
        self.env = {
            **os.environ,
            **NO_QUOTAS,
            "AGENT_PROVIDER": "emulator",
            "AGENT_HOST": "127.0.0.1",
            "AGENT_API_KEYS": "",
            "AGENT_EMULATOR_TTFT_MS": str(args.ttft_ms),
            "AGENT_EMULATOR_TOKENS_PER_SECOND": "0",
            "AGENT_GC_TUNING": "true" if args.gc_tuning else "false",
            "AGENT_MAX_SESSIONS": "100000",
            "AGENT_MAX_TOKENS": "200000",
            "AGENT_MAX_CONCURRENT_RUNS": "10000",
            "AGENT_MERGE_DELTAS_AFTER": "1000000",  # count every event, not merged runs of them
            "AGENT_POLL_MAX_EVENTS": "100000",
            "AGENT_REDIS_URL": redis_url,
        }
        if redis_url:
            self.env["AGENT_REDIS_PREFIX"] = prefix
        else:
            self.env.pop("AGENT_REDIS_PREFIX", None)
        self.logs = [logs / f"instance{n}.log" for n in range(instances)]
        self.children: list[subprocess.Popen[bytes]] = []

    @property
    def pids(self) -> list[int]:
        return [child.pid for child in self.children]

    def cpu(self) -> float:
        """CPU seconds of all the instances so far."""
        return sum(cpu_seconds(pid) for pid in self.pids)

    def log_tail(self, lines: int = 15) -> str:
        """The last lines each instance wrote to stderr."""
        parts = []
        for path in self.logs:
            if path.exists():
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- {path.name}\n" + "\n".join(tail))
        return "\n".join(parts)

    async def __aenter__(self) -> Cluster:
        for port, log_path in zip(self.ports, self.logs, strict=True):
            with open(log_path, "wb") as log_file:
                self.children.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "service", "--port", str(port)],
                        env=self.env,
                        cwd=ROOT,
                        stdout=subprocess.DEVNULL,
                        stderr=log_file,
                    )
                )
        try:
            waits = [asyncio.ensure_future(wait_until_up(url + "/healthz")) for url in self.urls]
            while not all(wait.done() for wait in waits):
                await asyncio.wait(waits, timeout=0.2, return_when=asyncio.FIRST_EXCEPTION)
                codes = [child.poll() for child in self.children if child.poll() is not None]
                if codes:  # a bad setting stops the start at once; say so instead of waiting
                    for wait in waits:
                        wait.cancel()
                    raise RuntimeError(f"a service instance exited at start with code {codes[0]}")
                for wait in waits:
                    if wait.done() and wait.exception():
                        raise wait.exception()  # type: ignore[misc]
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        for child in self.children:
            child.terminate()
        for child in self.children:
            try:
                child.wait(15)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


class Redis:
    """The Redis server: its CPU, and the keys under a prefix."""

    def __init__(self, url: str) -> None:
        import redis

        self.client = redis.Redis.from_url(url)
        self.client.ping()

    def cpu(self) -> float:
        info = self.client.info("cpu")
        return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])

    def count(self, prefix: str) -> int:
        return sum(1 for _ in self.client.scan_iter(match=prefix + ":*", count=1000))

    def delete(self, prefix: str) -> int:
        """UNLINK every key under ``prefix:``; how many there were."""
        deleted = 0
        batch: list[bytes] = []
        for key in self.client.scan_iter(match=prefix + ":*", count=1000):
            batch.append(key)
            if len(batch) >= 500:
                deleted += self.client.unlink(*batch)
                batch = []
        if batch:
            deleted += self.client.unlink(*batch)
        return deleted


class Meter:
    """Service, Redis and client CPU, and wall time, between start() and stop()."""

    def __init__(self, cluster: Cluster, redis: Redis | None) -> None:
        self.cluster, self.redis = cluster, redis

    @staticmethod
    def _client() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    def start(self) -> None:
        self.wall, self.service, self.client = time.monotonic(), self.cluster.cpu(), self._client()
        self.redis_cpu = self.redis.cpu() if self.redis else 0.0

    def stop(self) -> dict[str, float | None]:
        wall = time.monotonic() - self.wall
        return {
            "wall_s": wall,
            "service_cpu_s": self.cluster.cpu() - self.service,
            "redis_cpu_s": self.redis.cpu() - self.redis_cpu if self.redis else None,
            "client_cpu": (self._client() - self.client) / wall,
        }


# -- client -------------------------------------------------------------------------------------


async def create_session(http: aiohttp.ClientSession, url: str) -> str:
    async with http.post(url + "/sessions", json={}) as response:
        if response.status != 201:
            raise RuntimeError(f"POST /sessions: {response.status} {await response.text()}")
        return (await response.json())["id"]


async def post_message(http: aiohttp.ClientSession, url: str, session_id: str, content: str) -> int:
    """Start a query; the ``after_id`` to read all of it from."""
    async with http.post(url + f"/sessions/{session_id}/messages", json={"content": content}) as response:
        if response.status != 202:
            raise RuntimeError(f"POST /sessions/{{id}}/messages: {response.status} {await response.text()}")
        return int((await response.json())["after_id"])


async def wait_idle(http: aiohttp.ClientSession, url: str, session_id: str, timeout: float = 30.0) -> int:
    """Wait until the session's query is over (as ``url`` sees it); its last event id."""
    deadline = time.monotonic() + timeout
    while True:
        async with http.get(url + f"/sessions/{session_id}") as response:
            body = await response.json()
        if body["status"] != "running" or time.monotonic() > deadline:
            return int(body["last_event_id"])
        await asyncio.sleep(0.05)


async def ending(http: aiohttp.ClientSession, url: str, session_id: str, last: int) -> str:
    """How the session's query ended: ``done``, or ``error:<code>``, from its last event."""
    async with http.get(
        url + f"/sessions/{session_id}/events/poll?since_index={last - 1}&limit=1"
    ) as response:
        events = (await response.json())["events"]
    if not events:
        return "none"
    event = events[-1]
    return event["type"] if event["type"] != "error" else f"error:{event.get('code')}"


async def text_events(http: aiohttp.ClientSession, url: str, session_id: str, after: int) -> int:
    """How many ``assistant_text`` events the session logged after ``after``."""
    async with http.get(
        url + f"/sessions/{session_id}/events/poll?since_index={after}&limit=100000"
    ) as response:
        body = await response.json()
    return sum(1 for event in body["events"] if event["type"] == "assistant_text")


class Reading:
    """What one subscriber read."""

    __slots__ = ("status", "body", "events", "first_text", "last_read", "connected", "latencies", "texts")

    def __init__(self) -> None:
        self.status = 0
        self.body = ""
        self.events = 0
        self.first_text: float | None = None
        self.last_read: float | None = None
        self.connected: float | None = None
        self.latencies: list[float] = []
        self.texts = 0


async def count_stream(response: aiohttp.ClientResponse, reading: Reading) -> None:
    """Count the events of an SSE stream from raw chunks (``id:`` lines), parsing nothing."""
    tail = b"\n"
    while chunk := await response.content.readany():
        now = time.time()
        buffer = tail + chunk
        reading.events += buffer.count(b"\nid:")
        if reading.first_text is None and b"assistant_text" in buffer:
            reading.first_text = now
        tail = buffer[-3:]
        reading.last_read = now


async def parse_stream(response: aiohttp.ClientResponse, reading: Reading) -> None:
    """Read an SSE stream line by line: latency of every ``assistant_text`` event."""
    async for line in response.content:
        if line.startswith(b"id:"):
            reading.events += 1
        elif line.startswith(b"data:") and b'"assistant_text"' in line:
            now = time.time()
            reading.latencies.append((now - json.loads(line[5:])["ts"]) * 1000)
            reading.texts += 1
            if reading.first_text is None:
                reading.first_text = now
            reading.last_read = now


async def subscribe(
    http: aiohttp.ClientSession,
    url: str,
    session_id: str,
    after: int | None,
    parse: bool,
    gate: asyncio.Semaphore,
) -> Reading:
    """One SSE subscriber, to the end of the stream.

    ``gate`` bounds how many subscribers are setting up at once (request sent, first line not yet
    read); past that a subscriber costs the service no Redis call of its own.
    """
    reading = Reading()
    headers = {"Last-Event-ID": str(after)} if after is not None else {}
    async with gate:
        response = await http.get(url + f"/sessions/{session_id}/events", headers=headers)
        reading.status = response.status
        if response.status == 200:
            reading.connected = time.time()
            if (await response.content.readline()).startswith(b"id:"):  # a frame starts with id: or event:
                reading.events += 1
    async with response:
        if response.status != 200:
            reading.body = (await response.text())[:300]
            return reading
        await (parse_stream if parse else count_stream)(response, reading)
    return reading


def setup_gate(args: argparse.Namespace) -> asyncio.Semaphore:
    return asyncio.Semaphore(args.connect_concurrency if args.connect_concurrency > 0 else 1_000_000)


async def gated(gate: asyncio.Semaphore, awaitable: Awaitable[T]) -> T:
    async with gate:
        return await awaitable


def refusals(readings: list[Reading]) -> dict[str, Any]:
    """Subscribers that got no stream: how many per status, and one answer of each."""
    counts: dict[str, int] = {}
    samples: dict[str, str] = {}
    for r in readings:
        if r.status != 200:
            counts[str(r.status)] = counts.get(str(r.status), 0) + 1
            samples.setdefault(str(r.status), r.body)
    return {
        "non_200_subscribers": sum(counts.values()),
        "non_200_by_status": counts,
        "non_200_sample": samples,
    }


def costs(meter: dict[str, Any], delivered: int) -> dict[str, Any]:
    per = 1e6 / delivered if delivered else 0.0
    return {
        "service_cpu_s": round(meter["service_cpu_s"], 3),
        "service_cpu_us_per_event": round(meter["service_cpu_s"] * per, 2),
        "redis_cpu_s": None if meter["redis_cpu_s"] is None else round(meter["redis_cpu_s"], 3),
        "redis_cpu_us_per_event": None
        if meter["redis_cpu_s"] is None
        else round(meter["redis_cpu_s"] * per, 2),
        "client_cpu": round(meter["client_cpu"], 2),
    }


# -- scenarios ----------------------------------------------------------------------------------


async def throughput(
    args: argparse.Namespace, cluster: Cluster, redis: Redis | None, http: aiohttp.ClientSession
) -> dict[str, Any]:
    """Many sessions, one unpaced query and one subscriber each, homed and read across instances."""
    urls, count = cluster.urls, len(cluster.urls)
    home = [i % count for i in range(args.sessions)]
    away = [(i + 1) % count for i in range(args.sessions)]
    gate = setup_gate(args)
    ids = await asyncio.gather(
        *(gated(gate, create_session(http, urls[home[i]])) for i in range(args.sessions))
    )
    content = f"[emu:tokens={args.tokens}] [emu:tps=0] [emu:ttft={args.ttft_ms}]"
    meter = Meter(cluster, redis)
    meter.start()
    afters = await asyncio.gather(
        *(
            gated(gate, post_message(http, urls[home[i]], ids[i], f"throughput {i} {content}"))
            for i in range(args.sessions)
        )
    )
    readings = await asyncio.gather(
        *(subscribe(http, urls[away[i]], ids[i], afters[i], False, gate) for i in range(args.sessions))
    )
    measured = meter.stop()
    lasts = await asyncio.gather(*(wait_idle(http, urls[home[i]], ids[i]) for i in range(args.sessions)))
    expected = sum(last - after for last, after in zip(lasts, afters, strict=True))
    endings: dict[str, int] = {}
    for end in await asyncio.gather(
        *(ending(http, urls[home[i]], ids[i], lasts[i]) for i in range(args.sessions))
    ):
        endings[end] = endings.get(end, 0) + 1
    delivered = sum(r.events for r in readings)
    starts = [r.first_text for r in readings if r.first_text is not None]
    ends = [r.last_read for r in readings if r.last_read is not None]
    window = max(ends) - min(starts) if starts and ends else float("nan")
    connected = [r.connected for r in readings if r.connected is not None]
    return {
        "sessions": args.sessions,
        "tokens": args.tokens,
        "events_delivered": delivered,
        "events_expected": expected,
        "query_endings": endings,
        **refusals(readings),
        "subscribers_connected_after_first_token": sum(1 for t in connected if starts and t > min(starts)),
        "window_s": round(window, 3),
        "events_per_s": round(delivered / window) if window > 0 else 0,
        **costs(measured, delivered),
    }


async def fanout(
    args: argparse.Namespace, cluster: Cluster, redis: Redis | None, http: aiohttp.ClientSession
) -> dict[str, Any]:
    """One paced query to many subscribers round-robin over the instances: append-to-read latency."""
    urls, count = cluster.urls, len(cluster.urls)
    session_id = await create_session(http, urls[0])
    step = max(1, args.subscribers // max(1, args.parsed))
    # Subscriber i reads from instance i % count; every step-th on each instance parses.
    plan = [(i % count, (i // count) % step == 0) for i in range(args.subscribers)]
    content = (
        f"fanout [emu:tokens={args.fanout_tokens}] [emu:tps={args.tps}] [emu:ttft={args.fanout_ttft_ms}]"
    )
    meter = Meter(cluster, redis)
    meter.start()
    after = await post_message(http, urls[0], session_id, content)
    gate = setup_gate(args)
    readings = await asyncio.gather(
        *(subscribe(http, urls[n], session_id, None, parse, gate) for n, parse in plan)
    )
    measured = meter.stop()
    last = await wait_idle(http, urls[0], session_id)
    texts = await text_events(http, urls[0], session_id, after)
    end = await ending(http, urls[0], session_id, last)
    parsers = [(n, r) for (n, parse), r in zip(plan, readings, strict=True) if parse]
    latencies = [ms for _, r in parsers for ms in r.latencies]
    first_ts = min((r.first_text for _, r in parsers if r.first_text), default=None)
    connected = [r.connected for r in readings if r.connected is not None]

    def summary(values: list[float]) -> dict[str, float] | None:
        if not values:
            return None
        return {
            "p50": round(percentile(values, 0.5), 2),
            "p99": round(percentile(values, 0.99), 2),
            "max": round(max(values), 2),
        }

    delivered = sum(r.events for r in readings)
    result: dict[str, Any] = {
        "subscribers": args.subscribers,
        "parsed": len(parsers),
        "tokens": args.fanout_tokens,
        "tokens_per_second": args.tps,
        "text_events_logged": texts,
        "query_ending": end,
        "events_logged": last - after,
        "events_delivered": delivered,
        **refusals(readings),
        "incomplete_parsers": sum(1 for _, r in parsers if r.texts != texts),
        "subscribers_connected_after_first_token": sum(1 for t in connected if first_ts and t > first_ts),
        "latency_ms": summary(latencies),
        **costs(measured, delivered),
    }
    if count > 1:
        result["latency_ms_by_instance"] = {
            ("run_instance" if n == 0 else f"instance_{n}"): summary(
                [ms for m, r in parsers if m == n for ms in r.latencies]
            )
            for n in range(count)
        }
    return result


# -- run ----------------------------------------------------------------------------------------


async def one_config(
    args: argparse.Namespace, name: str, round_no: int, redis: Redis | None, run_prefix: str, logs: Path
) -> dict[str, Any]:
    """Start a configuration's processes, run the scenarios on them, stop them."""
    _, instances, on_redis = CONFIGS[name]
    prefix = f"{run_prefix}:{name}-r{round_no}" if on_redis else ""
    cluster = Cluster(args, instances, args.redis_url if on_redis else "", prefix, logs)
    result: dict[str, Any] = {}
    dbsize_before = redis.client.dbsize() if on_redis and redis else 0
    try:
        async with cluster:
            timeout = aiohttp.ClientTimeout(total=None, sock_read=args.timeout)
            async with aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0), timeout=timeout
            ) as http:
                for scenario, run in (("throughput", throughput), ("fanout", fanout)):
                    if scenario not in args.scenarios:
                        continue
                    try:
                        result[scenario] = await asyncio.wait_for(
                            run(args, cluster, redis if on_redis else None, http), args.timeout
                        )
                    except Exception as exc:  # reported, and the run goes on
                        result[scenario] = {"error": f"{type(exc).__name__}: {exc}"}
                        print(
                            f"[{name} round {round_no}] {scenario} failed: {exc!r}\n{cluster.log_tail()}",
                            file=sys.stderr,
                        )
    except Exception as exc:  # reported, and the next configuration runs
        result["error"] = f"{type(exc).__name__}: {exc}"
        print(f"[{name} round {round_no}] failed: {exc!r}\n{cluster.log_tail()}", file=sys.stderr)
    if on_redis and redis:
        result["redis_keys_under_prefix"] = redis.count(prefix)
        result["redis_keys_outside_prefix"] = max(
            0, redis.client.dbsize() - dbsize_before - result["redis_keys_under_prefix"]
        )
        redis.delete(prefix)
    return result


def median_tree(runs: list[Any]) -> Any:
    """The median of each number across the rounds, keeping the shape; errors are kept."""
    values = [run for run in runs if run is not None]
    if not values:
        return None
    first = values[0]
    if isinstance(first, dict):
        keys = list(dict.fromkeys(key for run in values if isinstance(run, dict) for key in run))
        return {key: median_tree([run.get(key) for run in values if isinstance(run, dict)]) for key in keys}
    if isinstance(first, bool) or not isinstance(first, (int, float)):
        return first if all(v == first for v in values) else values
    median = statistics.median(v for v in values if isinstance(v, (int, float)))
    return round(median, 3) if isinstance(median, float) else median


def cost_of_redis(configs: dict[str, Any]) -> dict[str, Any] | None:
    """b against a: CPU per delivered event and latency, as ratios and differences."""
    a, b = configs.get("a"), configs.get("b")
    if not a or not b:
        return None
    out: dict[str, Any] = {}
    for scenario in ("throughput", "fanout"):
        sa, sb = a.get(scenario) or {}, b.get(scenario) or {}
        ca, cb = sa.get("service_cpu_us_per_event"), sb.get("service_cpu_us_per_event")
        if ca and cb:
            out[f"{scenario}_service_cpu_us_per_event"] = {
                "memory": ca,
                "redis": cb,
                "ratio": round(cb / ca, 2),
            }
            redis_us = sb.get("redis_cpu_us_per_event")
            if redis_us is not None:
                out[f"{scenario}_service_plus_redis_cpu_ratio"] = round((cb + redis_us) / ca, 2)
        if scenario == "throughput" and sa.get("events_per_s") and sb.get("events_per_s"):
            out["throughput_events_per_s_ratio"] = round(sb["events_per_s"] / sa["events_per_s"], 2)
    la, lb = (a.get("fanout") or {}).get("latency_ms"), (b.get("fanout") or {}).get("latency_ms")
    if isinstance(la, dict) and isinstance(lb, dict):
        out["fanout_latency_ms"] = {
            q: {"memory": la[q], "redis": lb[q], "difference": round(lb[q] - la[q], 2)}
            for q in ("p50", "p99", "max")
        }
    return out


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    raise_fd_limit(args.subscribers * 4 + args.sessions * 4 + 1024)
    needs_redis = any(CONFIGS[name][2] for name in args.configs)
    private = None
    if needs_redis and args.private_redis:
        # A redis-server of our own, so its CPU figures count this benchmark only.
        port = free_port()
        private = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
        )
        args.redis_url = f"redis://127.0.0.1:{port}/0"
        for _ in range(100):
            try:
                Redis(args.redis_url)
                break
            except Exception:  # not up yet
                await asyncio.sleep(0.05)
    try:
        return await run_rounds(args, needs_redis)
    finally:
        if private is not None:
            private.terminate()
            private.wait(10)


async def run_rounds(args: argparse.Namespace, needs_redis: bool) -> dict[str, Any]:
    redis = Redis(args.redis_url) if needs_redis else None
    run_prefix = f"bench-scaleout:{secrets.token_hex(4)}"
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in args.configs}
    try:
        with tempfile.TemporaryDirectory(prefix="bench-scaleout-") as scratch:
            for round_no in range(1, args.rounds + 1):
                for name in args.configs:
                    print(
                        f"round {round_no}/{args.rounds}: {name} ({CONFIGS[name][0]})",
                        file=sys.stderr,
                        flush=True,
                    )
                    logs = Path(args.logs or scratch) / f"{name}-r{round_no}"
                    logs.mkdir(parents=True, exist_ok=True)
                    rounds[name].append(await one_config(args, name, round_no, redis, run_prefix, logs))
    finally:
        leftover = redis.delete(run_prefix) if redis else 0
    configs = {name: median_tree(runs) for name, runs in rounds.items()}
    for name in configs:
        configs[name]["label"] = CONFIGS[name][0]
    return {
        "cpus": os.cpu_count(),
        "service_version": git_version(),
        "parameters": {
            name: getattr(args, name)
            for name in (
                "scenarios",
                "configs",
                "sessions",
                "tokens",
                "ttft_ms",
                "subscribers",
                "parsed",
                "fanout_tokens",
                "tps",
                "fanout_ttft_ms",
                "connect_concurrency",
            )
        },
        "rounds": args.rounds,
        "redis_url": args.redis_url if needs_redis else None,
        "private_redis": bool(args.private_redis),
        "redis_prefix": run_prefix if needs_redis else None,
        "redis_keys_left_after_cleanup": leftover,
        "gc_tuning": args.gc_tuning,
        "configs": configs,
        "cost_of_redis_b_vs_a": cost_of_redis(configs),
        "per_round": rounds,
    }


def git_version() -> str:
    """The commit the service ran from, ``-dirty`` when the tree had changes."""
    try:
        done = subprocess.run(
            ["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True, timeout=10
        )
        return done.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def fmt(value: Any, spec: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return "/".join(fmt(v, spec) for v in value)
    return format(value, spec)


def print_table(result: dict[str, Any]) -> None:
    configs = result["configs"]
    args = argparse.Namespace(**result["parameters"])
    print(
        f"scale-out benchmark ({result['service_version']}): {result['cpus']} CPUs, median of {result['rounds']} round(s), "
        f"gc tuning {'on' if result['gc_tuning'] else 'off'}, "
        f"Redis {'private' if result['private_redis'] else 'shared'} {result['redis_url'] or '-'}"
    )
    if "throughput" in args.scenarios:
        print(
            f"\n1. throughput: {args.sessions} sessions x {args.tokens} unpaced tokens, one SSE subscriber each (in c on the other instance)"
        )
        print(
            f"  {'configuration':22} {'events/s':>9} {'delivered':>10} {'expected':>10} {'svc us/ev':>9} {'redis us/ev':>11} {'client cpu':>10}"
        )
        for name, config in configs.items():
            r = config.get("throughput") or {}
            if "error" in r or "error" in config:
                print(f"  {name} {config['label']:20} error: {r.get('error') or config.get('error')}")
                continue
            print(
                f"  {name} {config['label']:20} {fmt(r.get('events_per_s'), ',d'):>9} {fmt(r.get('events_delivered')):>10} "
                f"{fmt(r.get('events_expected')):>10} {fmt(r.get('service_cpu_us_per_event')):>9} "
                f"{fmt(r.get('redis_cpu_us_per_event')):>11} {fmt(r.get('client_cpu')):>10}"
            )
    if "fanout" in args.scenarios:
        print(
            f"\n2. fan-out: 1 session, {args.fanout_tokens} tokens at {args.tps}/s, {args.subscribers} SSE subscribers "
            f"round-robin over the instances, {args.parsed} parse; latency = read - ts, ms"
        )
        print(
            f"  {'configuration':22} {'p50':>7} {'p99':>7} {'max':>7} {'svc us/ev':>9} {'redis us/ev':>11} {'incomplete':>10} {'client cpu':>10}"
        )
        for name, config in configs.items():
            r = config.get("fanout") or {}
            if "error" in r or "error" in config:
                print(f"  {name} {config['label']:20} error: {r.get('error') or config.get('error')}")
                continue
            lat = r.get("latency_ms") or {}
            print(
                f"  {name} {config['label']:20} {fmt(lat.get('p50')):>7} {fmt(lat.get('p99')):>7} {fmt(lat.get('max')):>7} "
                f"{fmt(r.get('service_cpu_us_per_event')):>9} {fmt(r.get('redis_cpu_us_per_event')):>11} "
                f"{fmt(r.get('incomplete_parsers')):>10} {fmt(r.get('client_cpu')):>10}"
            )
            for where, lat in (r.get("latency_ms_by_instance") or {}).items():
                if lat:
                    print(f"    {where:20} {fmt(lat['p50']):>7} {fmt(lat['p99']):>7} {fmt(lat['max']):>7}")
    cost = result.get("cost_of_redis_b_vs_a")
    if cost:
        print("\n3. cost of Redis per event (b: 1 instance on Redis, against a: 1 instance in memory)")
        for scenario in ("throughput", "fanout"):
            c = cost.get(f"{scenario}_service_cpu_us_per_event")
            if c:
                extra = cost.get(f"{scenario}_service_plus_redis_cpu_ratio")
                print(
                    f"  {scenario:10} service CPU per event: {c['memory']} -> {c['redis']} us (x{c['ratio']}); "
                    f"service + Redis: x{fmt(extra)}"
                )
        if "throughput_events_per_s_ratio" in cost:
            print(f"  throughput events/s, Redis / memory: {cost['throughput_events_per_s_ratio']}")
        if "fanout_latency_ms" in cost:
            parts = [
                f"{q} {v['memory']} -> {v['redis']} ms ({v['difference']:+})"
                for q, v in cost["fanout_latency_ms"].items()
            ]
            print("  fan-out latency: " + ", ".join(parts))
    for name, config in configs.items():
        if CONFIGS[name][2] and not config.get("redis_keys_under_prefix"):
            print(
                f"  warning: {name} left no keys under its AGENT_REDIS_PREFIX: was the service on Redis at all?"
            )
        for scenario in ("throughput", "fanout"):
            r = config.get(scenario) or {}
            if r.get("events_expected") is not None and r.get("events_delivered") != r.get("events_expected"):
                print(
                    f"  warning: {name} {scenario}: {r['events_delivered']} events delivered, {r['events_expected']} expected"
                )
            endings = r.get("query_endings") or ({r["query_ending"]: 1} if "query_ending" in r else {})
            if any(key != "done" for key in endings):
                print(f"  warning: {name} {scenario}: queries ended {endings}")
            if r.get("non_200_subscribers"):
                print(
                    f"  warning: {name} {scenario}: {r['non_200_subscribers']} subscribers got no stream: "
                    f"{r.get('non_200_by_status')} {r.get('non_200_sample')}"
                )
            if r.get("subscribers_connected_after_first_token"):
                print(
                    f"  warning: {name} {scenario}: {r['subscribers_connected_after_first_token']} subscribers connected after the first token (raise the ttft)"
                )


def main() -> None:
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
