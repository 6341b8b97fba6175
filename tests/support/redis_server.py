"""A real redis-server for tests: the shared one on 127.0.0.1:6379, or one started here.

:class:`RedisServer` runs its own ``redis-server`` on a free loopback port in a fresh temp dir,
with the append-only file fsynced on every write, so data survives :meth:`RedisServer.restart`
and even :meth:`RedisServer.kill`; :meth:`RedisServer.pause` freezes it (``SIGSTOP``) the way a
hung host does, with its sockets open and silent.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType
from typing import NoReturn

import pytest
import redis

from tests.support._pipes import PipeDrain, ProcessStartError, free_port

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
READY_MARKER = "Ready to accept connections"


class RedisUnavailable(RuntimeError):
    """No Redis to test against: nothing on 6379 and no ``redis-server`` binary on PATH."""


def reachable(url: str, timeout: float = 0.5) -> bool:
    """Whether a Redis answers PING at ``url`` within ``timeout`` seconds."""
    client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()


def delete_prefix(url: str, prefix: str) -> int:
    """UNLINK every key whose name starts with ``prefix`` (SCAN MATCH prefix*); returns how many."""
    if not prefix:
        raise ValueError("refusing to delete every key: empty prefix")
    client = redis.Redis.from_url(url, socket_timeout=5)
    deleted = 0
    try:
        batch: list[bytes] = []
        for key in client.scan_iter(match=f"{prefix}*", count=500):
            batch.append(key)
            if len(batch) >= 500:
                deleted += client.unlink(*batch)
                batch.clear()
        if batch:
            deleted += client.unlink(*batch)
    finally:
        client.close()
    return deleted


class RedisServer:
    """Its own ``redis-server`` on 127.0.0.1, AOF on with ``appendfsync always``, in a temp dir.

    ``start()`` returns once the server prints "Ready to accept connections"; ``restart()`` comes
    back on the same port and dir, so the data is still there (with ``persistent=False``, no AOF:
    a restart comes back empty). As a context manager it starts on entry and on exit stops the
    server and removes the dir.
    """

    def __init__(
        self, binary: str = "redis-server", start_timeout: float = 15.0, *, persistent: bool = True
    ) -> None:
        self.binary = binary
        self.start_timeout = start_timeout
        self.persistent = persistent
        self.port: int | None = None
        self.dir = Path(tempfile.mkdtemp(prefix="agentstream-redis-"))
        self.process: subprocess.Popen[bytes] | None = None
        self._output: PipeDrain | None = None

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("the Redis server has not been started")
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def client(self, **options: object) -> redis.Redis:
        """A redis-py client for this server (decode_responses=True unless told otherwise)."""
        return redis.Redis.from_url(self.url, **{"decode_responses": True, **options})

    def output(self, lines: int = 40) -> str:
        """The server's last log lines."""
        return self._output.tail(lines) if self._output else ""

    def start(self) -> RedisServer:
        """Start the server and wait for "Ready to accept connections"; on a port race, try another port."""
        if self.running:
            return self
        if shutil.which(self.binary) is None:
            raise RedisUnavailable(f"{self.binary!r} is not on PATH (apt-get install redis-server)")
        fixed_port = self.port is not None
        for _attempt in range(1 if fixed_port else 5):
            port = self.port if fixed_port else free_port()
            assert port is not None
            if self._launch(port):
                self.port = port
                return self
            if fixed_port or "Address already in use" not in self.output():
                break
        raise ProcessStartError(f"redis-server did not start on port {port}:\n{self.output()}")

    def _launch(self, port: int) -> bool:
        # stderr joins stdout: one pipe, drained on a thread, read for the ready line.
        options = {
            "save": "",
            "appendonly": "yes" if self.persistent else "no",
            "appendfsync": "always",
            "dir": str(self.dir),
            "port": str(port),
            "bind": "127.0.0.1",
            "daemonize": "no",
        }
        self.process = subprocess.Popen(
            [self.binary, *(arg for name, value in options.items() for arg in (f"--{name}", value))],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        assert self.process.stdout is not None
        self._output = PipeDrain(
            self.process.stdout, f"redis-server:{port}", lambda line: READY_MARKER in line
        )
        if self._output.wait_ready(self.start_timeout):
            _live.add(self)
            return True
        self.kill()
        return False

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM and wait (SIGKILL if it takes longer than ``timeout``). A no-op when not running."""
        if self.process is not None and self.process.poll() is None:
            # A paused server would not act on SIGTERM until continued.
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._reap()

    def kill(self) -> None:
        """SIGKILL and wait: a crash, as far as clients can tell."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._reap()

    def pause(self) -> None:
        """SIGSTOP: the server keeps its sockets (connects still complete) but answers nothing."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`: it answers again, commands sent meanwhile included."""
        self._signal(signal.SIGCONT)

    def _signal(self, signum: int) -> None:
        if not self.running:
            raise RuntimeError("the Redis server is not running")
        assert self.process is not None
        self.process.send_signal(signum)

    def restart(self) -> RedisServer:
        """Stop, then start again on the same port and dir (the AOF brings the data back)."""
        self.stop()
        return self.start()

    def close(self) -> None:
        """Stop the server and remove its dir."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _reap(self) -> None:
        if self._output is not None:
            self._output.join()
        _live.discard(self)

    def __enter__(self) -> RedisServer:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


# Servers still running when the interpreter exits (a test run cut short) are stopped then.
_live: set[RedisServer] = set()
atexit.register(lambda: [server.close() for server in list(_live)])

_session_server: RedisServer | None = None


def redis_url_for_tests(shared: str = DEFAULT_REDIS_URL) -> str:
    """The shared Redis (``shared``, 127.0.0.1:6379) when it answers, else one started here for the run.

    Raises :class:`RedisUnavailable` when neither is possible, and ProcessStartError when a
    ``redis-server`` is there but does not start.
    """
    global _session_server
    if _session_server is not None and _session_server.running:
        return _session_server.url
    if reachable(shared):
        return shared
    if shutil.which("redis-server") is None:
        raise RedisUnavailable(f"no Redis answers at {shared} and redis-server is not installed")
    server = RedisServer()
    try:
        server.start()
    except BaseException:
        server.close()
        raise
    _session_server = server
    return server.url


def stop_session_redis() -> None:
    """Stop the Redis :func:`redis_url_for_tests` started, if it started one."""
    global _session_server
    if _session_server is not None:
        _session_server.close()
        _session_server = None


def redis_unavailable(reason: str) -> NoReturn:
    """In CI a Redis test must run: no Redis is a failure there, a skip elsewhere."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"Redis tests cannot run in CI: {reason}")
    pytest.skip(reason)


def require_redis_server() -> None:
    """Skip (or in CI fail) the calling test when there is no ``redis-server`` binary to start."""
    if shutil.which("redis-server") is None:
        redis_unavailable("redis-server is not installed (apt-get install redis-server)")
