"""What every scenario of ``bench_peers.py`` shares: sizes, the targets' names, the processes under test."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchlib import ROOT
from benchlib.procs import CLIENT_CPU, SERVER_CPU, free_port, log_file, process
from benchlib.stack import ServiceStack

SCRIPTS = ROOT / "scripts"

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
    "AGENT_MAX_SESSIONS": "100000",
    "AGENT_SSE_PING_INTERVAL_S": "600",
    "AGENT_HEARTBEAT_INTERVAL_S": "600",
    "AGENT_SHUTDOWN_TIMEOUT_S": "2",
}
NO_MERGE = {"AGENT_MERGE_DELTAS_AFTER": "1000000"}


def installed(peer: str) -> bool:
    """Whether a peer's packages can be imported."""
    return all(importlib.util.find_spec(module) is not None for module in PEERS[peer])


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
    live_dialect: str = "sse"  # sse, ws or aisdk (the service's subscribers; the peers are SSE)
    client_procs: int = 0  # the live clients' processes; 0: one per 10,000 subscribers
    client_pause_ms: float = 0.0  # each client's pause before every epoll_wait (peers.viewers.Loop)
    workers: int = 0  # live: the service as this many workers on a private Redis
    redis_url: str = ""
    peers: bool = True
    conc_sizes: tuple[int, ...] = (200, 500)
    conc_tokens: int = 200
    conc_warm: int = 500
    idle_connections: int = 10_000
    slow_subscribers: int = 50
    slow_tokens: int = 40_000
    slow_parsed: int = 10
    seed: int = 1
    notes: list[str] = field(default_factory=list)
    logs: Path | None = None  # the servers' output goes to files here; kept when a scenario fails

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
            conc_sizes=(20, 50),
            conc_tokens=30,
            conc_warm=50,
            idle_connections=300,
            slow_subscribers=10,
            slow_parsed=5,
            slow_tokens=3000,
        )


def service_stack(cfg: Config, env: dict[str, str] | None = None, source: Path = ROOT) -> ServiceStack:
    """The emulator (on ``cfg.emulator_cpu``) and the service (on the servers' CPU) for a scenario."""
    return ServiceStack(
        {**BASE_ENV, **(env or {})},
        source=source,
        service_cpu=SERVER_CPU,
        emulator_cpu=cfg.emulator_cpu,
        logs=cfg.logs,
    )


@contextlib.contextmanager
def server_process(cfg: Config, name: str, command: Callable[[int], list[str]]) -> Iterator[tuple[str, int]]:
    """A server under test, ``command(port)`` on a free port, on the servers' CPU: its base URL and pid."""
    port = free_port()
    with process(command(port), cpu=SERVER_CPU, log=log_file(cfg.logs, name)) as child:
        yield f"http://127.0.0.1:{port}", child.pid


def peer_process(
    cfg: Config, kind: str, data_file: str
) -> contextlib.AbstractContextManager[tuple[str, int]]:
    """A peer server (``bench_peers.py --serve-peer KIND PORT FILE``); its base URL and pid."""
    return server_process(
        cfg,
        f"peer-{kind}",
        lambda port: [
            sys.executable,
            str(SCRIPTS / "bench_peers.py"),
            "--serve-peer",
            kind,
            str(port),
            data_file,
        ],
    )


def write_json(directory: str, name: str, payload: Any) -> str:
    """Write ``payload`` to ``directory/name``; its path."""
    path = os.path.join(directory, name)
    Path(path).write_text(json.dumps(payload))
    return path
