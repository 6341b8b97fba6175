"""Serving: one process, or N worker processes on one port (``python -m service --workers N``).

One process: :func:`serve` runs the app with ``web.run_app``.

Several (``AGENT_WORKERS`` > 1, which the settings allow only with ``AGENT_REDIS_URL``, where the
workers share sessions): a :class:`Supervisor` starts each worker with multiprocessing's ``spawn``
context. Every worker is :func:`serve` listening on the same host and port with ``SO_REUSEPORT``,
so the kernel spreads new connections between them, under an ``AGENT_INSTANCE_ID`` of its own
(the configured one plus ``-<index>``; when none is configured the store makes a unique one).

- Start: the supervisor applies the session database's missing migrations, once, then starts the
  workers (which do not migrate), and prints the banner once every worker listens. A worker that exits before
  it listens stops the others, and the supervisor exits with that worker's code (1 if it had none).
- Signals: SIGTERM and SIGINT are forwarded to every worker, which drains as one process does
  (``AGENT_SHUTDOWN_TIMEOUT_S``; a second signal, like a second Ctrl-C, cuts the drain short).
  Workers run in a process group of their own, so a terminal's Ctrl-C reaches them once, through
  the supervisor; a worker whose supervisor is gone (``kill -9``) sees its pipe close and drains.
  A worker still running :data:`STOP_GRACE_S` past the drain's timeout is killed.
- Later deaths: a worker that dies is started again after a backoff (:class:`Restarts`); after
  repeated deaths soon after starting, the supervisor gives up, stops the others and exits 1.

:func:`gunicorn_app` is the same app for gunicorn's ``aiohttp.GunicornWebWorker`` instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

from aiohttp import web

from service.config import Settings, load_settings
from service.errors import AgentStreamError
from service.logs import configure as configure_logging

log = logging.getLogger(__name__)

# How long past AGENT_SHUTDOWN_TIMEOUT_S a stopping worker may take (its cleanup: the store, the
# provider, the calculator's processes) before the supervisor kills it.
STOP_GRACE_S = 15.0
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


async def tune_gc(app: web.Application) -> None:
    """Keep the garbage collector from stalling the event loop mid-stream.

    What start-up loaded (botocore's service models, pydantic's schemas) is frozen, so full
    collections never walk it, and collections run less often.
    """
    gc.collect()
    gc.freeze()
    # A young collection every 5,000 allocations, not the default 700: with the default
    # thresholds, full collections land mid-stream often under load, each a long pause of the
    # loop (measured: docs/benchmarks.md, section Garbage collection; scripts/bench_concurrency.py
    # --compare-gc). The middle generation is collected at every second young collection, not
    # every tenth: what a run keeps per token (its log entry, the event) survives the young
    # collections, and a middle collection over ten of them walks it all at once in one long
    # pause; over two, the same total work goes in short pauses (measured with gc.callbacks:
    # docs/benchmarks.md, section Garbage collection). Full collections come after 5,000 x 2 x
    # 100 allocations, as many as young collections every 10,000 with the default ratios (x 10 x
    # 10) give: what clients leave behind when they drop (exceptions, tracebacks, closed
    # connections) is cyclic garbage that only a full collection frees, and spacing full
    # collections further lets the heap grow with it before it levels (measured:
    # docs/benchmarks.md, section Soak; scripts/soak.py).
    gc.set_threshold(5_000, 2, 100)


def _app_and_options(settings: Settings) -> tuple[web.Application, dict[str, Any]]:
    """The application and the server options every way of serving it uses."""
    from service.app import create_app, server_options

    app = create_app(settings)
    if settings.gc_tuning:
        app.on_startup.append(tune_gc)
    options = {
        "handler_cancellation": True,
        "shutdown_timeout": settings.shutdown_timeout_s,
        "access_log": None,
        **server_options(settings),
    }
    return app, options


def banner(message: str, settings: Settings) -> str:
    """aiohttp's "Running on http://…" line, naming the service and its provider."""
    return message.replace("http://", f"agentstream ({settings.provider}) on http://")


# The listening socket's queue of connections the kernel has accepted and the loop has not yet
# taken. aiohttp's default is 128: a burst of new connections beyond it (a reconnecting load
# balancer, a page of users after a deploy) has its SYNs dropped, the clients send them again
# 1, 3 and 7 s later, and their first tokens come seconds late while the service has CPU to spare
# (measured: docs/benchmarks.md, section A burst's connections, the time to upstream, a noisy day
# (724aefa), "The listen backlog"). The kernel caps it at net.core.somaxconn (4,096 on current
# Linux); gunicorn's own default is 2,048.
LISTEN_BACKLOG = 4096


def serve(
    settings: Settings,
    *,
    reuse_port: bool = False,
    announce: Callable[[web.Application, str], None] | None = None,
) -> None:
    """Serve until SIGTERM or SIGINT; ``announce(app, aiohttp's banner)`` replaces printing it."""
    app, options = _app_and_options(settings)

    def listening(message: str) -> None:
        if announce is None:
            print(banner(message, settings), flush=True)
        else:
            announce(app, message)

    web.run_app(
        app,
        host=settings.host,
        port=settings.port,
        reuse_port=reuse_port or None,
        backlog=LISTEN_BACKLOG,
        print=listening,
        **options,
    )


async def gunicorn_app() -> web.AppRunner:
    """The app for gunicorn: ``gunicorn service.workers:gunicorn_app -k aiohttp.GunicornWebWorker``.

    Settings come from the environment (gunicorn's ``--bind`` and ``--workers`` decide where and
    how many); the runner gets the options :func:`serve` gives ``web.run_app``.
    """
    settings = load_settings()
    configure_logging(settings.log_format, settings.log_level)
    app, options = _app_and_options(settings)
    return web.AppRunner(app, **options)


def worker_instance_id(configured: str, index: int, generation: int) -> str:
    """A worker's ``AGENT_INSTANCE_ID``: the configured one plus ``-<index>``, and ``.<n>`` for the
    n-th restart; empty stays empty (the store makes a unique one)."""
    if not configured:
        return ""
    # A restarted worker gets a new name: the store's append tokens are the name plus a counter
    # from 1, and a token reused on a session whose last append bore it would be taken for a retry.
    return f"{configured}-{index}" + (f".{generation}" if generation else "")


@dataclass
class Restarts:
    """When a worker that died starts again: after ``base_s``, doubling with each death in a row
    that came within ``fast_s`` of its start, at most ``max_s``; never past ``max_fast`` of those."""

    base_s: float = 0.5
    max_s: float = 10.0
    fast_s: float = 30.0
    max_fast: int = 5
    fast_deaths: int = 0

    def after_death(self, lived_s: float) -> float | None:
        """The delay before the next start of a worker that lived ``lived_s``; None: give up."""
        if lived_s >= self.fast_s:
            self.fast_deaths = 0  # it served a while: what killed it is not at its start
            return self.base_s
        self.fast_deaths += 1
        if self.fast_deaths > self.max_fast:
            return None
        return min(self.max_s, self.base_s * 2 ** (self.fast_deaths - 1))


@dataclass
class _Slot:
    """One worker's place: its index, its current process and its restart history."""

    index: int
    restarts: Restarts
    generation: int = 0
    process: BaseProcess | None = None
    conn: Connection | None = None  # the supervisor's end of the worker's pipe
    started_at: float = 0.0
    listening: bool = False
    restart_at: float | None = None


@dataclass
class Supervisor:
    """Runs ``settings.workers`` worker processes on one port until a signal stops them."""

    settings: Settings
    slots: list[_Slot] = field(init=False)
    code: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.slots = [_Slot(index, Restarts()) for index in range(1, self.settings.workers + 1)]
        self._context = multiprocessing.get_context("spawn")
        self._signals: list[int] = []
        self._reloads = 0
        self._announced = False
        self._stop_deadline: float | None = None
        self._killed = False

    def run(self) -> int:
        """Start the workers, watch them until all have stopped, and return the exit code."""
        wake_read, wake_write = socket.socketpair()
        wake_read.setblocking(False)
        wake_write.setblocking(False)
        # A signal writes to the socket, so the wait below returns for it at once.
        previous_fd = signal.set_wakeup_fd(wake_write.fileno())
        previous = {signum: signal.signal(signum, self._on_signal) for signum in STOP_SIGNALS}
        previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, self._on_hangup)
        try:
            if not self._migrate():
                return self.code
            for slot in self.slots:
                self._start(slot)
            while not self._stopping or any(slot.process for slot in self.slots):
                self._step(wake_read)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            signal.set_wakeup_fd(previous_fd)
            wake_read.close()
            wake_write.close()
        return self.code

    def _migrate(self) -> bool:
        """Bring the session database up to date once, before any worker starts: workers that each
        migrated at start raced on a fresh database ("table sessions already exists"). False
        (with ``code`` 2) when it cannot be done."""
        url = self.settings.database()
        if not url or not self.settings.database_migrate:
            return True
        from service.db import migrate

        try:
            before, after = asyncio.run(migrate.upgrade_url(url))
        except Exception as error:  # noqa: BLE001 - any failure is told on one line, as a worker's is
            print(f"agentstream: cannot migrate the session database: {error}", file=sys.stderr)
            self.code = 2
            return False
        log.info(
            "session database migrated from %s to %s before starting the workers", before or "empty", after
        )
        return True

    @property
    def _stopping(self) -> bool:
        return self._stop_deadline is not None

    def _on_signal(self, signum: int, frame: object) -> None:
        # Only noted here: the loop forwards it, so no worker starting meanwhile is missed.
        self._signals.append(signum)

    def _on_hangup(self, signum: int, frame: object) -> None:
        # A reload of the agents file: forwarded to every worker by the loop, none stopped.
        self._reloads += 1

    def _step(self, wake: socket.socket) -> None:
        """Wait for a message, a death, a signal or a deadline, and act on it."""
        conns = {slot.conn: slot for slot in self.slots if slot.conn is not None}
        sentinels = {slot.process.sentinel: slot for slot in self.slots if slot.process is not None}
        ready = wait([wake, *conns, *sentinels], self._timeout())
        if wake in ready:
            with contextlib.suppress(BlockingIOError):
                wake.recv(4096)
        if self._reloads and not self._stopping and self.settings.agents_file:
            self._reloads = 0
            log.info("SIGHUP: %d workers reload the agents file", len(self.slots))
            for slot in self.slots:
                if slot.process is not None and slot.process.pid is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(slot.process.pid, signal.SIGHUP)
        while self._signals:
            signum = self._signals.pop(0)
            log.info("%s: stopping %d workers", signal.Signals(signum).name, len(self.slots))
            self._stop(signum)
        for ready_conn in ready:
            if ready_conn in conns:
                self._read(conns[ready_conn])
        for sentinel in ready:
            if sentinel in sentinels:
                self._reap(sentinels[sentinel])
        now = time.monotonic()
        for slot in self.slots:
            if slot.restart_at is not None and slot.restart_at <= now and not self._stopping:
                self._start(slot)
        if self._stop_deadline is not None and now >= self._stop_deadline and not self._killed:
            self._kill_stragglers()

    def _timeout(self) -> float | None:
        deadlines = [slot.restart_at for slot in self.slots if slot.restart_at is not None]
        if self._stop_deadline is not None and not self._killed:
            deadlines.append(self._stop_deadline)
        return max(0.0, min(deadlines) - time.monotonic()) if deadlines else None

    def _start(self, slot: _Slot) -> None:
        if slot.started_at:
            slot.generation += 1
        instance_id = worker_instance_id(self.settings.instance_id, slot.index, slot.generation)
        # The supervisor migrated the database before the first start (see _migrate).
        settings = self.settings.model_copy(update={"instance_id": instance_id, "database_migrate": False})
        ours, theirs = self._context.Pipe()
        process = self._context.Process(
            target=_worker, args=(settings, slot.index, theirs), name=f"agentstream-worker-{slot.index}"
        )
        process.start()
        theirs.close()  # the worker's end lives in the worker: its exit closes the pipe
        slot.process, slot.conn, slot.listening, slot.restart_at = process, ours, False, None
        slot.started_at = time.monotonic()

    def _read(self, slot: _Slot) -> None:
        assert slot.conn is not None
        try:
            message = slot.conn.recv()
        except (EOFError, OSError):
            slot.conn.close()
            slot.conn = None  # it died: its sentinel says so
            return
        slot.listening = True
        pid = slot.process.pid if slot.process else None
        log.info("worker %d (pid %s, instance %s) is listening", slot.index, pid, message["instance_id"])
        if not self._announced and all(s.listening for s in self.slots):
            self._announced = True
            text = banner(message["banner"], self.settings)
            print(text.replace(" ========", f" with {len(self.slots)} workers ========", 1), flush=True)

    def _reap(self, slot: _Slot) -> None:
        assert slot.process is not None
        slot.process.join()
        code, pid = slot.process.exitcode, slot.process.pid
        slot.process = None
        if slot.conn is not None:
            slot.conn.close()
            slot.conn = None
        if self._stopping:
            log.info("worker %d (pid %s) stopped with code %s", slot.index, pid, code)
            return
        if not self._announced:
            log.error(
                "worker %d (pid %s) exited with code %s before it listened; stopping", slot.index, pid, code
            )
            self.code = code if code is not None and code > 0 else 1
            self._stop(signal.SIGTERM)
            return
        delay = slot.restarts.after_death(time.monotonic() - slot.started_at)
        if delay is None:
            log.error(
                "worker %d (pid %s) exited with code %s, %d times in a row within %.0f s of starting; "
                "giving up and stopping",
                slot.index,
                pid,
                code,
                slot.restarts.fast_deaths,
                slot.restarts.fast_s,
            )
            self.code = 1
            self._stop(signal.SIGTERM)
            return
        log.warning(
            "worker %d (pid %s) exited with code %s; restarting it in %.1f s", slot.index, pid, code, delay
        )
        slot.restart_at = time.monotonic() + delay

    def _stop(self, signum: int) -> None:
        """Forward ``signum`` to every worker; no worker starts again from now on."""
        if self._stop_deadline is None:
            self._stop_deadline = time.monotonic() + self.settings.shutdown_timeout_s + STOP_GRACE_S
        for slot in self.slots:
            slot.restart_at = None
            if slot.process is not None and slot.process.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(slot.process.pid, signum)

    def _kill_stragglers(self) -> None:
        self._killed = True
        for slot in self.slots:
            if slot.process is not None:
                log.error("worker %d (pid %s) is still stopping; killing it", slot.index, slot.process.pid)
                slot.process.kill()
                self.code = self.code or 1


def _worker(settings: Settings, index: int, conn: Connection) -> None:
    """One worker process: serve on the shared port, say when it listens, stop with the supervisor."""
    os.setpgrp()  # a terminal's Ctrl-C reaches the supervisor only, which forwards it once
    # A reload forwarded before the app has its handler (see service.app) must not end the worker.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    configure_logging(settings.log_format, settings.log_level)
    threading.Thread(target=_follow_supervisor, args=(conn,), name="supervisor-pipe", daemon=True).start()

    def listening(app: web.Application, message: str) -> None:
        from service.app import SERVICES

        backend = app[SERVICES].backend
        conn.send({"banner": message, "instance_id": backend.instance_id if backend else ""})

    try:
        serve(settings, reuse_port=True, announce=listening)
    except AgentStreamError as error:
        print(f"agentstream: worker {index} cannot start: {error}", file=sys.stderr)
        raise SystemExit(2) from None


def _follow_supervisor(conn: Connection) -> None:
    """Drain (as on SIGTERM) once the supervisor's end of the pipe closes: it is gone."""
    with contextlib.suppress(EOFError, OSError):
        while True:
            conn.recv()
    log.warning("the supervisor is gone; stopping")
    os.kill(os.getpid(), signal.SIGTERM)
