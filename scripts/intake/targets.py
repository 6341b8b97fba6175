"""The targets ``bench_concurrency.py --paced`` measures, each with an emulator of its own: the
service of this tree, the service as of ``--baseline``, the bare relay, and the service with
``--workers N`` on a private Redis."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from benchlib import ROOT
from benchlib.procs import (
    CLIENT_CPU,
    SERVER_CPU,
    ProcessGroup,
    free_port,
    log_file,
    process,
    process_tree,
)
from benchlib.stack import ServiceStack
from peers.config import BASE_ENV

CURRENT, BASELINE, RELAY = "current", "baseline", "relay"
# Every request of a run keeps its record (the default keeps 10,000): 3 rounds of 1,000 and more.
EMULATOR_ARGS = ["--max-records", "200000"]


@dataclass
class Config:
    """What one paced comparison runs (the command line decides it)."""

    sizes: list[int]
    tokens: int = 150
    ttft_ms: tuple[int, int] = (600, 1200)
    tps: tuple[int, int] = (50, 100)
    rounds: int = 3
    warm: int = 0
    provider: str = "bedrock"
    relay: bool = True
    baseline: Path | None = None
    baseline_ref: str = ""
    workers: int = 0
    workers_runs: int = 1000
    seed: int = 1
    logs: Path | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def workers_name(self) -> str:
        """The name of the ``--workers`` target."""
        return f"current x{self.workers} workers"


@dataclass
class Target:
    """A server under test, up: where it answers, its emulator, its process (and its children)."""

    name: str
    url: str
    emulator_url: str
    pid: int
    emulator_pid: int
    workers: int = 1

    def pids(self) -> list[int]:
        """The server's processes now: its own and its workers' (not multiprocessing's helpers)."""
        return [pid for pid in process_tree(self.pid) if not is_helper(pid)]


# The sandbox's forkserver (and its children) idle through a run of text: they would only add
# their threads. The workers that --workers spawns are not helpers (multiprocessing.spawn).
HELPERS = (b"multiprocessing.forkserver", b"multiprocessing.resource_tracker")


def is_helper(pid: int) -> bool:
    """Whether a process is one of multiprocessing's helpers, not a server."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # gone: nothing to count
    return any(helper in command for helper in HELPERS)


class RelayStack(ProcessGroup):
    """An emulator and the bare relay (``scripts/intake/relay.py``) reading it, pinned like the service."""

    def __init__(self, logs: Path | None = None) -> None:
        super().__init__()
        self.emulator_url = f"http://127.0.0.1:{free_port()}"
        self.url = f"http://127.0.0.1:{free_port()}"
        self.logs = logs
        self.pid = self.emulator_pid = 0

    def launch(self) -> list[tuple[str, subprocess.Popen[bytes]]]:
        """Start the emulator and the relay."""
        emulator_port = self.emulator_url.rsplit(":", 1)[1]
        emulator = self.start(
            [sys.executable, "-m", "service.emulator", "--port", emulator_port, *EMULATOR_ARGS],
            cpu=CLIENT_CPU,
            log=log_file(self.logs, "relay-emulator"),
        )
        relay = self.start(
            [
                sys.executable,
                str(Path(__file__).resolve().parent / "relay.py"),
                "--port",
                self.url.rsplit(":", 1)[1],
                "--upstream",
                self.emulator_url,
            ],
            cpu=SERVER_CPU,
            log=log_file(self.logs, "relay"),
        )
        self.pid, self.emulator_pid = relay.pid, emulator.pid
        return [(self.emulator_url + "/_emulator/records", emulator), (self.url + "/healthz", relay)]


def service_env(cfg: Config, runs: int) -> dict[str, str]:
    """The service's settings for a paced comparison: no keep-alives inside a measurement, room for ``runs``."""
    return {
        **BASE_ENV,
        "AGENT_PROVIDER": cfg.provider,
        "AGENT_MAX_CONCURRENT_RUNS": str(max(1000, runs)),
    }


def supports_workers(source: Path) -> bool:
    """Whether ``python -m service`` in ``source`` takes ``--workers`` (its ``--help`` lists it)."""
    done = subprocess.run(
        [sys.executable, "-m", "service", "--help"],
        cwd=source,
        env={**os.environ, "PYTHONPATH": str(source)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    return "--workers" in done.stdout


async def private_redis(stack: contextlib.AsyncExitStack) -> str:
    """A ``redis-server`` of this run's own (no persistence) for as long as ``stack``; its URL."""
    import redis

    if shutil.which("redis-server") is None:
        raise SystemExit("bench_concurrency: --workers needs redis-server on PATH (the workers share Redis)")
    port = free_port()
    stack.enter_context(
        process(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            cpu=CLIENT_CPU,
        )
    )
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    try:
        for _ in range(200):  # the process is starting; there is nothing else to wait on
            try:
                client.ping()
                return url
            except redis.ConnectionError:
                await asyncio.sleep(0.05)
    finally:
        client.close()
    raise RuntimeError(f"redis-server on port {port} did not come up")


async def open_targets(cfg: Config, stack: contextlib.AsyncExitStack) -> dict[str, Target]:
    """Start every target of ``cfg`` (each waited for, all stopped with ``stack``), in turn order."""
    targets: dict[str, Target] = {}
    single = max(cfg.sizes) if cfg.sizes else 0
    sources = [(CURRENT, ROOT)] + ([(BASELINE, cfg.baseline)] if cfg.baseline is not None else [])
    for name, source in sources:
        if not cfg.sizes:
            break
        service = await stack.enter_async_context(
            ServiceStack(
                service_env(cfg, single),
                source=source,
                emulator_args=EMULATOR_ARGS,
                service_cpu=SERVER_CPU,
                emulator_cpu=CLIENT_CPU,
                logs=cfg.logs,
            )
        )
        targets[name] = Target(name, service.url, service.emulator_url, service.pid, service.emulator_pid)
    if cfg.relay and cfg.sizes:
        relay = await stack.enter_async_context(RelayStack(cfg.logs))
        targets[RELAY] = Target(RELAY, relay.url, relay.emulator_url, relay.pid, relay.emulator_pid)
    if cfg.workers:
        redis_url = await private_redis(stack)
        # Unpinned: N workers on the machine's cores, the emulator and this client with them.
        service = await stack.enter_async_context(
            ServiceStack(
                {**service_env(cfg, cfg.workers_runs), "AGENT_REDIS_URL": redis_url},
                emulator_args=EMULATOR_ARGS,
                emulator_cpu=CLIENT_CPU,
                logs=cfg.logs,
                service_args=["--workers", str(cfg.workers)],
            )
        )
        name = cfg.workers_name
        targets[name] = Target(
            name, service.url, service.emulator_url, service.pid, service.emulator_pid, cfg.workers
        )
    return targets
