"""A load run from start to report: the path check first, the clients, the figures."""

from __future__ import annotations

import asyncio
import resource
import sys
import time
from typing import Any

import aiohttp

from service.loadtest.clients import client
from service.loadtest.report import plot, progress
from service.loadtest.run import MODES, Config, Run
from service.loadtest.selftest import selftest
from service.loadtest.stats import now, summary


def raise_open_file_limit(wanted: int | None = None) -> int:
    """Raise the soft limit on open files to ``wanted`` (at most the hard limit), or to the hard one.

    Each client holds a socket or two; child processes inherit the limit. Returns the soft limit.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if wanted is None:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    else:
        target = wanted if hard == resource.RLIM_INFINITY else min(hard, wanted)
    if soft == resource.RLIM_INFINITY or soft >= target:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        return target
    except (ValueError, OSError):
        return soft


async def _watch_loop(lags: list[float], period: float = 0.05) -> None:
    """Sample this process's own event-loop lag (how late a timer fires), to show the client kept up."""
    loop = asyncio.get_running_loop()
    while True:
        expected = loop.time() + period
        await asyncio.sleep(period)
        lags.append(max(0.0, loop.time() - expected))


def _session(config: Config, limit: int) -> aiohttp.ClientSession:
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else None
    connector = aiohttp.TCPConnector(limit=limit, limit_per_host=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
    return aiohttp.ClientSession(connector=connector, headers=headers, timeout=timeout)


async def run_selftest(config: Config) -> dict[str, Any]:
    """``--selftest`` alone: the path check's findings."""
    async with _session(config, 4) as http:
        return await selftest(
            http, config.url, config.selftest_ticks, config.selftest_interval_ms, config.selftest_idle_ms
        )


async def run(config: Config) -> dict[str, Any]:
    """Run the load (after the path check unless disabled) and return the report (``--json``'s)."""
    raise_open_file_limit()
    if config.count is None and config.duration is None:
        config.count = config.clients
    report: dict[str, Any] = {}
    async with _session(config, config.clients + 16) as http:
        if config.selftest:
            report["selftest"] = await selftest(
                http, config.url, config.selftest_ticks, config.selftest_interval_ms, config.selftest_idle_ms
            )
            if not config.json:
                print("\n".join(report["selftest"]["lines"]), flush=True)
        load = Run(config, http)
        modes = MODES if config.mode == "mixed" else (config.mode,)
        shown = None
        if config.progress:
            shown = asyncio.create_task(progress(load, sys.stderr))
        lags: list[float] = []
        watcher = asyncio.create_task(_watch_loop(lags))
        cpu = time.process_time()
        started = now()
        load.stats.start = started
        if load.deadline is not None:
            load.deadline = started + (config.duration or 0)
        try:
            await asyncio.gather(*(client(load, i, modes[i % len(modes)]) for i in range(config.clients)))
        finally:
            for task in (shown, watcher):
                if task is not None:
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
        wall = now() - started
        cpu = time.process_time() - cpu
    stats = load.stats
    failed = stats.finished - stats.ok
    errors = dict(stats.errors.most_common())
    clean = (
        failed == 0
        and not errors
        and stats.lost == 0
        and stats.repeated == 0
        and stats.started == stats.finished
    )
    report.update(
        {
            "url": config.url,
            "mode": config.mode,
            "clients": config.clients,
            "ramp_up_s": config.ramp_up,
            "duration_s": round(wall, 3),
            "queries": {
                "started": stats.started,
                "finished": stats.finished,
                "ok": stats.ok,
                "failed": failed,
            },
            "by_mode": {mode: dict(counts) for mode, counts in stats.by_mode.items()},
            "ttft_ms": summary(stats.ttft),
            "gap_ms": summary(stats.gaps),
            "e2e_ms": summary(stats.e2e),
            "events": stats.events,
            "events_per_s": round(stats.events / wall, 1) if wall > 0 else 0.0,
            "heartbeats": stats.heartbeats,
            "errors": errors,
            "ids": {"lost": stats.lost, "repeated": stats.repeated},
            "client_cpu": {
                "seconds": round(cpu, 3),
                "share_of_one_core": round(cpu / wall, 3) if wall > 0 else 0.0,
                "us_per_event": round(cpu / stats.events * 1e6, 2) if stats.events else None,
                "loop_lag_ms": summary(lags),
            },
            "clean": clean,
        }
    )
    if config.plot:
        report["plot"] = plot(stats, config.plot)
    return report
