"""A load run's settings and the state its clients share: the HTTP session, the budget, the stats."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from dataclasses import dataclass

import aiohttp

from service.loadtest.checks import IdCheck, error_kind, http_error
from service.loadtest.stats import Probe, Stats, now

DEFAULT_URL = "http://127.0.0.1:8080"
DEFAULT_MESSAGE = "Tell me a story [emu:tokens=100]"
MODES = ("sse", "ws", "agent")
JSON_HEADERS = {"Content-Type": "application/json"}


@dataclass
class Config:
    """What a run does (the command line, parsed)."""

    url: str = DEFAULT_URL
    api_key: str | None = None
    mode: str = "sse"
    clients: int = 10
    count: int | None = None
    duration: float | None = None
    ramp_up: float = 0.0
    message: str = DEFAULT_MESSAGE
    timeout: float = 120.0
    queries_per_session: int = 10
    selftest: bool = True
    selftest_only: bool = False
    selftest_ticks: int = 20
    selftest_interval_ms: int = 50
    selftest_idle_ms: int = 2000
    progress: bool = True
    json: bool = False
    plot: str | None = None


class Run:
    """Shared state of the clients: the HTTP session, the budget of queries, the stats."""

    def __init__(self, config: Config, http: aiohttp.ClientSession) -> None:
        self.config = config
        self.http = http
        self.base = config.url.rstrip("/")
        self.stats = Stats()
        self.remaining = config.count
        self.deadline = None if config.duration is None else self.stats.start + config.duration
        self.active = 0
        self.query_body = json.dumps({"content": config.message}).encode()
        self.agent_body = json.dumps({"message": config.message}).encode()

    def take(self) -> bool:
        """Whether a client may start another query (and if so, count it as started)."""
        if self.deadline is not None:
            if now() >= self.deadline:
                return False
        elif self.remaining is not None:
            if self.remaining <= 0:
                return False
            self.remaining -= 1
        self.stats.started += 1
        return True

    def record(self, mode: str, probe: Probe, failure: BaseException | None, ids: IdCheck | None) -> None:
        """Count a finished query: its timings, or its failure, and the ids its stream lost or repeated."""
        stats = self.stats
        end = probe.end or now()
        stats.finished += 1
        modes = stats.by_mode.setdefault(mode, Counter())
        e2e = None
        if failure is None:
            stats.ok += 1
            modes["ok"] += 1
            e2e = end - probe.t0
            stats.e2e.append(e2e)
        else:
            modes["failed"] += 1
            stats.errors[error_kind(failure)] += 1
        if probe.ttft is not None:
            stats.ttft.append(probe.ttft)
        if ids is not None:
            stats.lost += ids.lost
            stats.repeated += ids.repeated
            ids.lost = ids.repeated = 0
        stats.timeline.append((probe.t0 - stats.start, probe.ttft, e2e, failure is None))

    async def create_session(self) -> str:
        """``POST /sessions``: a new session's id."""
        async with self.http.post(self.base + "/sessions", data=b"{}", headers=JSON_HEADERS) as response:
            if response.status != 201:
                raise http_error(response.status, "POST /sessions")
            return (await response.json())["id"]

    async def delete_session(self, session_id: str) -> None:
        """``DELETE /sessions/{id}``, as far as it goes."""
        try:
            async with asyncio.timeout(10):
                async with self.http.delete(f"{self.base}/sessions/{session_id}"):
                    pass
        except (aiohttp.ClientError, OSError, TimeoutError):
            pass  # it expires on its own
