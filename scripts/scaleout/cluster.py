"""The configurations under test: service processes (on Redis or not), the Redis server, and a
meter of the CPU both spend."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from benchlib.procs import Meter, ProcessGroup, free_port

CONFIGS: dict[str, tuple[str, int, bool]] = {
    "a": ("1 instance, memory", 1, False),
    "b": ("1 instance, Redis", 1, True),
    "c": ("2 instances, Redis", 2, True),
}


class Cluster(ProcessGroup):
    """``instances`` service processes, on Redis under ``prefix`` when ``redis_url`` is set."""

    def __init__(
        self, args: argparse.Namespace, instances: int, redis_url: str, prefix: str, logs: Path
    ) -> None:
        super().__init__()
        self.ports = [free_port() for _ in range(instances)]
        self.urls = [f"http://127.0.0.1:{port}" for port in self.ports]
        self.env = {
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
        self.logs = [logs / f"instance{n}.log" for n in range(instances)]
        self.pids: list[int] = []

    def log_tail(self, lines: int = 15) -> str:
        """The last lines each instance wrote."""
        parts = []
        for path in self.logs:
            if path.exists():
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- {path.name}\n" + "\n".join(tail))
        return "\n".join(parts)

    def launch(self) -> list[tuple[str, subprocess.Popen[bytes]]]:
        """Start the instances."""
        children = [
            self.start([sys.executable, "-m", "service", "--port", str(port)], self.env, log=log, grace=15)
            for port, log in zip(self.ports, self.logs, strict=True)
        ]
        self.pids = [child.pid for child in children]
        return [(url + "/healthz", child) for url, child in zip(self.urls, children, strict=True)]


class Redis:
    """The Redis server: its CPU, and the keys under a prefix."""

    def __init__(self, url: str) -> None:
        import redis

        self.client = redis.Redis.from_url(url)
        self.client.ping()

    def cpu(self) -> float:
        """Redis's CPU seconds so far (system + user)."""
        info = self.client.info("cpu")
        return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])

    def count(self, prefix: str) -> int:
        """How many keys there are under ``prefix:``."""
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


class ClusterMeter(Meter):
    """The instances' CPU and this client's over a ``with`` block, and Redis's own (``redis_cpu``)."""

    def __init__(self, cluster: Cluster, redis: Redis | None) -> None:
        super().__init__(*cluster.pids)
        self.redis = redis
        self.redis_cpu: float | None = None

    def __enter__(self) -> ClusterMeter:
        self._redis = self.redis.cpu() if self.redis else 0.0
        super().__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        self.redis_cpu = self.redis.cpu() - self._redis if self.redis else None
