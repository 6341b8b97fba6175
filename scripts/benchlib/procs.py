"""Child processes for the benchmarks: started (on a core of their own when asked), waited for,
measured from ``/proc``, stopped."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, Self

import aiohttp

from benchlib import ROOT
from service.loadtest.load import raise_open_file_limit  # re-exported: the scripts raise theirs too

# A benchmark is one anonymous client doing the work of thousands: no per-key quotas, and no
# instance-wide bound on streams below what a scenario opens (10,000 idle SSE connections).
NO_QUOTAS = {
    "AGENT_MAX_STREAMS": "1000000",
    "AGENT_QUOTA_STREAMS": "0",
    "AGENT_QUOTA_RUNS": "0",
    "AGENT_QUOTA_REQUESTS_PER_MINUTE": "0",
    "AGENT_QUOTA_TOKENS_PER_DAY": "0",
}
CLIENT_CPU, SERVER_CPU = 0, 1
# Whether both CPUs are there to pin to, as this process found them before pinning itself.
PINNING = {CLIENT_CPU, SERVER_CPU} <= os.sched_getaffinity(0)
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def can_pin() -> bool:
    """Both CPUs the benchmarks pin to are available."""
    return PINNING


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def wait_until_up(
    url: str, timeout: float = 30.0, child: subprocess.Popen[bytes] | None = None
) -> None:
    """Poll ``url`` until it answers below 500 (the process is starting; there is nothing else to wait on).

    With ``child``, the process behind ``url``: if it exits meanwhile (a bad setting stops a start
    at once), say so instead of waiting out the timeout.
    """
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.get(url) as response:
                    if response.status < 500:
                        return
            except aiohttp.ClientError:
                pass
            if child is not None and child.poll() is not None:
                raise RuntimeError(f"{url}: the process exited at start with code {child.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not come up within {timeout} s")
            await asyncio.sleep(0.1)


def _pinned(cpu: int) -> Callable[[], None]:
    def setup() -> None:
        os.sched_setaffinity(0, {cpu})
        raise_open_file_limit()

    return setup


def log_file(directory: Path | None, name: str) -> Path | None:
    """A fresh file name under ``directory`` for a process's output (None without a directory)."""
    return directory / f"{name}-{time.monotonic_ns()}.log" if directory else None


@contextlib.contextmanager
def process(
    args: list[str],
    env: dict[str, str] | None = None,
    *,
    cwd: Path = ROOT,
    cpu: int | None = None,
    log: IO[bytes] | Path | None = None,
    grace: float = 10.0,
) -> Iterator[subprocess.Popen[bytes]]:
    """Run a child process for the duration of the block, with ``env`` added and no quotas.

    ``cpu`` pins it to that core (when :func:`can_pin`) with the highest open-file limit; ``log``
    (an open file or a path) receives its output and errors, else the output is dropped and the
    errors go to this process's. At the end it is terminated, and killed after ``grace`` seconds.
    """
    pin = cpu if cpu is not None and can_pin() else None
    opened = open(log, "wb") if isinstance(log, Path) else None  # noqa: SIM115 (the child keeps its copy)
    out = opened or log
    try:
        child = subprocess.Popen(
            args,
            env={**os.environ, **NO_QUOTAS, **(env or {})},
            cwd=cwd,
            stdout=out if out is not None else subprocess.DEVNULL,
            stderr=subprocess.STDOUT if out is not None else None,
            preexec_fn=_pinned(pin) if pin is not None else None,
        )
    finally:
        if opened is not None:
            opened.close()
    try:
        if pin is not None and os.sched_getaffinity(child.pid) != {pin}:
            raise RuntimeError(f"{args} is not pinned to CPU {pin}")
        yield child
    finally:
        child.terminate()
        try:
            child.wait(grace)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


class ProcessGroup:
    """Processes started together for an ``async with`` block: each waited for at its URL, all stopped after.

    A subclass starts them in :meth:`launch` (with :meth:`start`) and says where each answers.
    """

    def __init__(self) -> None:
        self._processes = contextlib.ExitStack()

    def start(
        self, args: list[str], env: dict[str, str] | None = None, **options: Any
    ) -> subprocess.Popen[bytes]:
        """A :func:`process` of the group (the same arguments), stopped with it."""
        return self._processes.enter_context(process(args, env, **options))

    def launch(self) -> list[tuple[str, subprocess.Popen[bytes]]]:
        """Start the processes; for each, the URL that answers once it is up."""
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        try:
            async with asyncio.TaskGroup() as waits:  # the first to fail stops the others
                for url, child in self.launch():
                    waits.create_task(wait_until_up(url, child=child))
        except BaseExceptionGroup as group:
            self._processes.close()
            raise group.exceptions[0] from None
        except BaseException:
            self._processes.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._processes.close()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (every thread), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def rss_bytes(pid: int) -> int:
    """Resident memory of a process, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def thread_count(pid: int) -> int:
    """How many threads a process has now, from /proc (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Threads:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def connections_to(pid: int, port: int) -> int:
    """How many established TCP connections a process holds to ``port`` (its upstream's), from
    /proc: the sockets among its file descriptors, matched by inode in the TCP tables of its
    network namespace (0 once it is gone)."""
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):  # closed meanwhile
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[len("socket:[") : -1])
    except OSError:
        return 0
    count = 0
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                fields = line.split()
                # remote address as HEX_IP:HEX_PORT; state 01 is ESTABLISHED
                if int(fields[2].rsplit(":", 1)[1], 16) == port and fields[3] == "01" and fields[9] in inodes:
                    count += 1
    return count


def process_tree(pid: int) -> list[int]:
    """``pid`` and every live descendant of it (a service's worker processes), from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):  # gone meanwhile
                continue
            parents.setdefault(ppid, []).append(int(entry.name))
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo += parents.get(current, [])
    return tree


class Meter:
    """Wall time, the CPU time of some processes and this client's CPU time over a ``with`` block."""

    def __init__(self, *pids: int) -> None:
        self.pids = pids
        self.wall = 0.0
        self.server_cpu = 0.0
        self.client_cpu = 0.0

    def _servers(self) -> float:
        return sum(cpu_seconds(pid) for pid in self.pids)

    def __enter__(self) -> Meter:
        self._cpu, self._client, self._started = self._servers(), time.process_time(), time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.monotonic() - self._started
        self.server_cpu = self._servers() - self._cpu
        self.client_cpu = time.process_time() - self._client
