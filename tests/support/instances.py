"""The service in its own process (``python -m service``), as many as a test needs.

Each :class:`ServiceProcess` listens on its own loopback port; callers pass the settings as
environment variables, layered over ``os.environ`` (a value of None removes a variable)::

    async with ServiceProcess({"AGENT_REDIS_URL": url, "AGENT_EMULATOR_TTFT_MS": 0}) as service:
        ...  # service.base_url

Blocking work (waiting for the ready line, waiting for exit) has async twins that run it on a
thread, so a test's event loop keeps going meanwhile.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType

from tests.support._pipes import PipeDrain, ProcessStartError, free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 30.0

EnvValue = str | int | float | bool | None
# A test's clients are one anonymous owner doing many users' work: no per-key quotas unless the
# test's env sets them.
NO_QUOTAS = {
    "AGENT_QUOTA_STREAMS": "0",
    "AGENT_QUOTA_RUNS": "0",
    "AGENT_QUOTA_REQUESTS_PER_MINUTE": "0",
    "AGENT_QUOTA_TOKENS_PER_DAY": "0",
}


def _is_ready_line(line: str) -> bool:
    # service/workers.py prints aiohttp's banner as "... agentstream (<provider>) on http://host:port ..."
    return "agentstream (" in line and "on http://" in line


class ServiceProcess:
    """``python -m service --host 127.0.0.1 --port <port>`` with ``env`` over ``os.environ``.

    ``start()`` returns once the service prints that it listens (or raises ProcessStartError with
    its output). After ``terminate()``/``kill()``, ``start()`` runs it again on the same port.
    """

    def __init__(
        self,
        env: Mapping[str, EnvValue] | None = None,
        *,
        port: int | None = None,
        args: Sequence[str] = (),
        ready_timeout: float = READY_TIMEOUT_S,
    ) -> None:
        self.env = dict(env or {})
        self.port = port
        self.args = list(args)
        self.ready_timeout = ready_timeout
        self.process: subprocess.Popen[bytes] | None = None
        self._stdout: PipeDrain | None = None
        self._stderr: PipeDrain | None = None

    @property
    def base_url(self) -> str:
        if self.port is None:
            raise RuntimeError("the service has not been started")
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def output(self, lines: int = 40) -> str:
        """The last lines of the service's stdout and stderr (its log)."""
        stdout = self._stdout.tail(lines) if self._stdout else ""
        stderr = self._stderr.tail(lines) if self._stderr else ""
        return f"--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}"

    def log_lines(
        self, match: Callable[[str], bool], count: int = 1, timeout: float = READY_TIMEOUT_S
    ) -> list[str]:
        """The lines of the service's stderr (its log) that ``match``, waiting until there are
        ``count`` of them (at most ``timeout``; fewer if it exits or time runs out). Blocks."""
        return self._stderr.wait_lines(match, count, timeout) if self._stderr else []

    def _environment(self) -> dict[str, str]:
        environment = {**os.environ, **NO_QUOTAS, "PYTHONUNBUFFERED": "1"}
        for name, value in self.env.items():
            if value is None:
                environment.pop(name, None)
            else:
                environment[name] = str(value).lower() if isinstance(value, bool) else str(value)
        return environment

    def start(self) -> ServiceProcess:
        """Spawn the service and wait (at most ``ready_timeout``) until it listens. Blocks."""
        if self.running:
            return self
        fixed_port = self.port is not None
        for _attempt in range(1 if fixed_port else 5):
            port = self.port if fixed_port else free_port()
            assert port is not None
            if self._launch(port):
                self.port = port
                return self
            if fixed_port or "address already in use" not in self.output().lower():
                break
        raise ProcessStartError(
            f"the service did not start on port {port} (exit code {self.returncode}):\n{self.output()}"
        )

    def _launch(self, port: int) -> bool:
        command = [sys.executable, "-m", "service", "--host", "127.0.0.1", "--port", str(port), *self.args]
        self.process = subprocess.Popen(
            command,
            cwd=REPO_ROOT,
            env=self._environment(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert self.process.stdout is not None and self.process.stderr is not None
        self._stdout = PipeDrain(self.process.stdout, f"service:{port}:stdout", _is_ready_line)
        self._stderr = PipeDrain(self.process.stderr, f"service:{port}:stderr")
        if self._stdout.wait_ready(self.ready_timeout):
            _live.add(self)
            return True
        self.kill()
        return False

    def terminate(self, timeout: float = 15.0) -> int | None:
        """SIGTERM (a graceful shutdown) and wait; SIGKILL after ``timeout``. Returns the exit code."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self._reap()

    def kill(self) -> int | None:
        """SIGKILL and wait: the instance dies mid-whatever, as in a crash. Returns the exit code."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        return self._reap()

    def _reap(self) -> int | None:
        for drain in (self._stdout, self._stderr):
            if drain is not None:
                drain.join()
        _live.discard(self)
        return self.returncode

    async def astart(self) -> ServiceProcess:
        """:meth:`start` on a thread."""
        return await asyncio.to_thread(self.start)

    async def alog_lines(
        self, match: Callable[[str], bool], count: int = 1, timeout: float = READY_TIMEOUT_S
    ) -> list[str]:
        """:meth:`log_lines` on a thread."""
        return await asyncio.to_thread(self.log_lines, match, count, timeout)

    async def aterminate(self, timeout: float = 15.0) -> int | None:
        """:meth:`terminate` on a thread."""
        return await asyncio.to_thread(self.terminate, timeout)

    async def akill(self) -> int | None:
        """:meth:`kill` on a thread."""
        return await asyncio.to_thread(self.kill)

    def __enter__(self) -> ServiceProcess:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.terminate()

    async def __aenter__(self) -> ServiceProcess:
        return await self.astart()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aterminate()


ServiceFactory = Callable[..., Awaitable[ServiceProcess]]
"""The ``service_process`` fixture: ``await service_process(env, **options)`` -> a started ServiceProcess."""

# Instances still running when the interpreter exits (a test run cut short) are killed then.
_live: set[ServiceProcess] = set()
atexit.register(lambda: [service.kill() for service in list(_live)])
