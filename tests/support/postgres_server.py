"""A real PostgreSQL for tests: Debian's binaries (``initdb``, ``postgres``) run in a temp dir.

:class:`PostgresServer` makes a fresh cluster with ``initdb`` (trust authentication, loopback
only), starts ``postgres`` on a free port and waits for "ready to accept connections". initdb and
postgres refuse to run as root, so when the tests run as root the cluster's directory is handed
to ``nobody`` and both run through ``runuser``. Each test gets a database of its own
(:meth:`PostgresServer.create_database`), so the one server started per run serves them all.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import NoReturn

import pytest

from tests.support._pipes import PipeDrain, ProcessStartError, free_port

READY_MARKER = "ready to accept connections"
SUPERUSER = "agentstream"


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL binaries to start (apt-get install postgresql)."""


def find_binaries() -> Path:
    """The folder holding ``initdb`` and ``postgres`` (PATH first, then /usr/lib/postgresql/*/bin)."""
    for name in ("initdb", "postgres"):
        found = shutil.which(name)
        if found and Path(found).resolve().with_name("postgres").exists():
            return Path(found).resolve().parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    if versions:
        return Path(versions[-1]).parent
    raise PostgresUnavailable("no initdb/postgres binaries (apt-get install postgresql)")


def _as_service_user(command: list[str]) -> list[str]:
    """``command`` as run by a user PostgreSQL accepts: ourselves, or ``nobody`` when we are root."""
    if os.geteuid() != 0:
        return command
    runuser = shutil.which("runuser")
    if runuser is None:
        raise PostgresUnavailable("running as root and no runuser to start PostgreSQL as another user")
    return [runuser, "-u", "nobody", "--", *command]


class PostgresServer:
    """Its own PostgreSQL cluster on 127.0.0.1, in a temp dir removed by :meth:`stop`."""

    def __init__(self, start_timeout: float = 60.0) -> None:
        self.bin = find_binaries()
        self.start_timeout = start_timeout
        self.dir = Path(tempfile.mkdtemp(prefix="agentstream-pg-"))
        self.port: int | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self._output: PipeDrain | None = None

    def _own(self) -> None:
        if os.geteuid() == 0:
            self.dir.chmod(0o755)
            shutil.chown(self.dir, "nobody", "nogroup")

    def start(self) -> PostgresServer:
        """initdb, then postgres on a free port; returns once it accepts connections."""
        data = self.dir / "data"
        self._own()
        init = subprocess.run(
            _as_service_user(
                [
                    str(self.bin / "initdb"),
                    "-D",
                    str(data),
                    "-U",
                    SUPERUSER,
                    "--auth=trust",
                    "--no-sync",
                    "-E",
                    "UTF8",
                ]
            ),
            capture_output=True,
            timeout=self.start_timeout,
            check=False,
        )
        if init.returncode:
            raise ProcessStartError(f"initdb failed:\n{init.stdout.decode()}\n{init.stderr.decode()}")
        for _attempt in range(5):
            port = free_port()
            options = [
                str(self.bin / "postgres"),
                "-D",
                str(data),
                "-p",
                str(port),
                "-h",
                "127.0.0.1",
                "-k",
                str(self.dir),
                "-c",
                "fsync=off",
                "-c",
                "max_connections=200",
            ]
            self.process = subprocess.Popen(
                _as_service_user(options),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            assert self.process.stderr is not None
            self._output = PipeDrain(
                self.process.stderr, f"postgres:{port}", lambda line: READY_MARKER in line
            )
            if self._output.wait_ready(self.start_timeout):
                self.port = port
                return self
            self.stop(remove=False)
            if "could not bind" not in self.output().lower():
                break
        raise ProcessStartError(f"postgres did not start:\n{self.output()}")

    def output(self, lines: int = 40) -> str:
        """The server's last log lines."""
        return self._output.tail(lines) if self._output else ""

    def url(self, database: str = "postgres") -> str:
        """The SQLAlchemy URL of ``database`` on this server (asyncpg)."""
        if self.port is None:
            raise RuntimeError("the PostgreSQL server has not been started")
        return f"postgresql+asyncpg://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def create_database(self) -> str:
        """A new, empty database of its own; returns its URL."""
        name = f"t{uuid.uuid4().hex[:12]}"
        psql = self.bin / "psql"
        command = [str(psql), "-h", "127.0.0.1", "-p", str(self.port), "-U", SUPERUSER, "-d", "postgres"]
        done = subprocess.run(
            [*command, "-c", f"CREATE DATABASE {name}"], capture_output=True, timeout=30, check=False
        )
        if done.returncode:
            raise ProcessStartError(f"CREATE DATABASE failed: {done.stderr.decode()}")
        return self.url(name)

    def stop(self, *, remove: bool = True) -> None:
        """Stop the server (SIGTERM: a fast shutdown) and, unless told otherwise, remove its dir."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._output is not None:
            self._output.join()
        if remove:
            shutil.rmtree(self.dir, ignore_errors=True)


def postgres_unavailable(reason: str) -> NoReturn:
    """In CI a PostgreSQL test must run: no PostgreSQL is a failure there, a skip elsewhere."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"PostgreSQL tests cannot run in CI: {reason}")
    pytest.skip(reason)
