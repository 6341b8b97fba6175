"""Helpers shared by the benchmark scripts: free ports, child processes, waiting, percentiles.

Not a benchmark itself; ``bench_concurrency.py`` and ``bench_sessions.py`` import it (run as
``python scripts/<name>.py``, the scripts directory is first on ``sys.path``).
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
# A benchmark is one anonymous client doing the work of thousands: no per-key quotas.
NO_QUOTAS = {
    "AGENT_QUOTA_STREAMS": "0",
    "AGENT_QUOTA_RUNS": "0",
    "AGENT_QUOTA_REQUESTS_PER_MINUTE": "0",
    "AGENT_QUOTA_TOKENS_PER_DAY": "0",
}


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def wait_until_up(url: str, timeout: float = 30.0) -> None:
    """Poll ``url`` until it answers 200 (the process is starting; there is nothing else to wait on)."""
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.get(url) as response:
                    if response.status < 500:
                        return
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not come up within {timeout} s")
            await asyncio.sleep(0.1)


@contextmanager
def process(
    args: list[str],
    env: dict[str, str],
    preexec_fn: Callable[[], object] | None = None,
    log: IO[bytes] | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """Run a child process for the duration of the block.

    ``preexec_fn`` runs in the child before it execs (e.g. to raise its open-file limit); ``log``
    receives its output and errors (else the output is dropped).
    """
    child = subprocess.Popen(
        args,
        env={**os.environ, **NO_QUOTAS, **env},
        cwd=ROOT,
        stdout=log if log is not None else subprocess.DEVNULL,
        stderr=subprocess.STDOUT if log is not None else None,
        preexec_fn=preexec_fn,
    )
    try:
        yield child
    finally:
        child.terminate()
        try:
            child.wait(10)
        except subprocess.TimeoutExpired:
            child.kill()


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
