"""A pool of worker processes that run picklable functions under a time and a memory limit.

:class:`WorkerPool` is generic: ``await pool.call(func, *args, timeout=...)`` runs ``func(*args)``
in another process and returns its result or raises its exception (or one of
:mod:`service.sandbox.errors`). Nothing a job does can cost the service more than that worker:
a job that allocates too much gets a MemoryError in the worker (``RLIMIT_AS``), and a job that
overruns gets its worker killed and replaced. The worker's own side is
:mod:`service.sandbox.worker`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
import multiprocessing
import signal
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from service.errors import describe_exception
from service.sandbox.errors import (
    WorkerCrashed,
    WorkerError,
    WorkerMemoryError,
    WorkerPoolClosed,
    WorkerTimeout,
)
from service.sandbox.worker import run_worker

logger = logging.getLogger(__name__)

__all__ = ["WorkerPool"]

# A worker that does not report ready within this many seconds is killed (a wedged start).
_WORKER_START_TIMEOUT_S = 30.0


class _Worker:
    """One worker process and the parent's end of its pipe."""

    __slots__ = ("process", "conn")

    def __init__(self, process: Any, conn: Any) -> None:
        self.process = process
        self.conn = conn

    def alive(self) -> bool:
        try:
            return self.process.exitcode is None
        except ValueError:  # the process object is closed
            return False

    def exit_description(self) -> str:
        try:
            code = self.process.exitcode
        except ValueError:
            code = None
        if code is None:
            return "it closed its pipe"
        if code < 0:
            try:
                return f"it was ended by {signal.Signals(-code).name}"
            except ValueError:
                return f"it was ended by signal {-code}"
        return f"it exited with code {code}"

    def kill(self) -> None:
        """End the process at once (SIGKILL) and close the pipe; safe to call more than once.

        Only for a worker whose pipe no caller is waiting on: a closed descriptor would never
        wake the event loop's reader. Stop a busy worker with :meth:`kill_process`.
        """
        self.kill_process()
        self.close_pipe()

    def kill_process(self) -> None:
        """SIGKILL the process; a caller waiting for its reply wakes up to the end of the pipe."""
        try:
            if self.process.exitcode is None:
                self.process.kill()
        except (OSError, ValueError, AttributeError):
            pass

    def stop(self) -> None:
        """Ask an idle worker to exit on its own."""
        try:
            self.conn.send(None)
        except (OSError, ValueError):
            pass
        self.close_pipe()

    def close_pipe(self) -> None:
        try:
            self.conn.close()
        except OSError:
            pass

    def reap(self, timeout: float) -> None:
        """Wait (blocking) for the process to end, killing it if it does not; free its resources."""
        try:
            self.process.join(timeout)
            if self.process.exitcode is None:
                self.process.kill()
                self.process.join(5.0)
            self.process.close()
        except (OSError, ValueError, AssertionError):
            pass


def _kill_all(workers: set[_Worker]) -> None:
    """The finalizer of a pool dropped without close(): its processes must not outlive it."""
    for worker in list(workers):
        worker.kill()


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class WorkerPool:
    """A few worker processes that run picklable functions with a time and a memory limit.

    Workers are started in a thread (process start-up blocks) from multiprocessing's
    ``forkserver`` (``spawn`` where there is none): a clean single-threaded server process that
    has imported the worker's code and the ``preload`` modules (those of the functions the pool
    will run) once, so a worker is up in milliseconds and ready for its first job, and no worker
    inherits the service's threads or sockets. Each worker applies ``RLIMIT_AS`` of ``memory_mb`` to itself
    before taking jobs, so a job that allocates too much gets a MemoryError there
    (:class:`WorkerMemoryError` here; the worker is replaced). A job that overruns its timeout gets
    its worker killed (:class:`WorkerTimeout`); later jobs get other or fresh workers, so nothing
    stays wedged. At most ``max_workers`` run at once; more calls wait their turn, and a caller
    takes whichever worker is free first, the one already running or one just started.

    The event loop never blocks: a job is sent (a small message), and the reply is awaited with
    the loop's reader on the pipe. Results should be small (a number as text). Use the pool from
    one event loop at a time; :meth:`close` stops every worker.
    """

    def __init__(
        self,
        *,
        max_workers: int = 2,
        memory_mb: int = 256,
        name: str = "worker",
        start_method: str | None = None,
        preload: Sequence[str] = (),
    ) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be positive, got {max_workers!r}")
        if memory_mb < 1:
            raise ValueError(f"memory_mb must be positive, got {memory_mb!r}")
        self.max_workers = max_workers
        self.memory_mb = memory_mb
        self.name = name
        if start_method is None:
            start_method = (
                "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
            )
        self._context = multiprocessing.get_context(start_method)
        if start_method == "forkserver":
            # The server imports the worker's code and the jobs' modules once and forks workers
            # from it (no main module: the service's own start-up does not run again in the
            # server). Takes effect when the server starts, i.e. with the first worker of any
            # pool in this process.
            self._context.set_forkserver_preload([run_worker.__module__, *preload])
        self._workers: set[_Worker] = set()  # every live worker, idle or busy
        self._idle: list[_Worker] = []
        self._starting: set[asyncio.Future[_Worker]] = set()
        self._waiters: collections.deque[asyncio.Future[_Worker | None]] = collections.deque()
        self._dying: list[_Worker] = []  # killed or stopped, not yet reaped
        self._closed = False
        self.started = 0  # workers started so far
        self._finalizer = weakref.finalize(self, _kill_all, self._workers)

    @property
    def size(self) -> int:
        """Worker processes alive now (idle or busy)."""
        return len(self._workers)

    async def call(self, func: Callable[..., Any], *args: Any, timeout: float) -> Any:
        """Run ``func(*args)`` in a worker; return its result or raise its exception.

        Raises :class:`WorkerTimeout`, :class:`WorkerMemoryError`, :class:`WorkerCrashed` or
        :class:`WorkerPoolClosed` when the job could not finish; cancellation kills the worker.
        ``timeout`` counts from the moment a worker has the job, not the wait for a worker.
        """
        if not timeout > 0:
            raise ValueError(f"timeout must be positive, got {timeout!r}")
        worker = await self._acquire()
        keep = False
        try:
            kind, value = await self._exchange(worker, func, args, timeout)
            keep = kind in ("ok", "error")
        except WorkerCrashed:
            if self._closed:
                raise WorkerPoolClosed(f"the {self.name} pool is shut down") from None
            raise
        finally:
            if keep:
                self._release(worker)
            else:
                self._discard(worker)
        if kind == "ok":
            return value
        if kind == "error":
            if isinstance(value, BaseException):
                raise value
            raise WorkerError(f"the worker sent an unreadable error: {value!r}")
        if kind == "memory":
            raise WorkerMemoryError(f"the job needed more than {self.memory_mb} MB of memory")
        raise WorkerError(f"unexpected reply {kind!r} from a worker")

    async def warm(self, count: int = 1) -> None:
        """Have ``count`` workers (at most ``max_workers``) alive: start the missing ones, and wait.

        A worker that cannot start is logged, not raised: calls will report it.
        """
        if self._closed:
            return
        while len(self._workers) + len(self._starting) < min(count, self.max_workers):
            self._start_one()
        for starting in list(self._starting):
            with contextlib.suppress(Exception):  # logged by _started; the calls that need a worker report it
                await asyncio.shield(starting)
            # A start that was already done when awaited has its done-callback still to come:
            # taken in here, so the workers are counted when this returns.
            self._started(starting)

    async def close(self, timeout: float = 5.0) -> None:
        """Stop every worker: idle ones are asked to exit, busy ones are killed; then reap them."""
        self._closed = True
        closed = WorkerPoolClosed(f"the {self.name} pool is shut down")
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(closed)
        for starting in list(self._starting):
            # Let it come up: its done-callback sees the pool closed and stops it.
            with contextlib.suppress(Exception):
                await asyncio.shield(starting)
        idle = set(self._idle)
        self._idle.clear()
        workers = list(self._workers)
        self._workers.clear()
        for worker in workers:
            if worker in idle:
                worker.stop()
            else:
                # Its caller sees the pipe end, raises WorkerPoolClosed and closes the pipe.
                worker.kill_process()
        dying = workers + self._dying
        self._dying = []
        if dying:
            await asyncio.to_thread(_reap_all, dying, timeout)

    # -- internals ---------------------------------------------------------------------------

    async def _acquire(self) -> _Worker:
        """An idle worker, or the first to become free (starting one if there is room)."""
        loop = asyncio.get_running_loop()
        while True:
            if self._closed:
                raise WorkerPoolClosed(f"the {self.name} pool is shut down")
            while self._idle:
                worker = self._idle.pop()
                if worker.alive():
                    return worker
                self._discard(worker)
            if len(self._workers) + len(self._starting) < self.max_workers:
                self._start_one()
            waiter: asyncio.Future[_Worker | None] = loop.create_future()
            self._waiters.append(waiter)
            try:
                handed = await waiter
            except asyncio.CancelledError:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
                elif waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                    # A worker (or a turn) was handed over just as we left: pass it on.
                    passed = waiter.result()
                    if passed is not None:
                        self._release(passed)
                    else:
                        self._wake_one()
                raise
            if handed is not None:
                if handed.alive():
                    return handed
                self._discard(handed)
            # None: a worker went away; look again (there may be room to start one now).

    def _start_one(self) -> None:
        """Start a worker in a thread; when it is up, it goes to a waiting caller or the idle ones."""
        # Workers killed earlier are collected in that thread too (already dead: no wait).
        dying, self._dying = self._dying, []
        starting = asyncio.get_running_loop().run_in_executor(None, self._spawn, dying)
        self._starting.add(starting)
        starting.add_done_callback(self._started)

    def _started(self, starting: asyncio.Future[_Worker]) -> None:
        if starting not in self._starting:
            return  # taken in already (by warm, or by this callback)
        self._starting.discard(starting)
        if starting.cancelled():
            self._wake_one()
            return
        error = starting.exception()
        if error is None:
            worker = starting.result()
            self._workers.add(worker)
            self.started += 1
            self._release(worker)
            return
        if not isinstance(error, WorkerError):
            error = WorkerError(f"could not start a worker process: {describe_exception(error)}")
        logger.warning("%s worker could not start: %s", self.name, error)
        if not self._workers and not self._starting:
            # Nothing else will serve the callers waiting: they fail with the reason.
            while self._waiters:
                waiter = self._waiters.popleft()
                if not waiter.done():
                    waiter.set_exception(error)

    def _spawn(self, dying: Sequence[_Worker] = ()) -> _Worker:
        """Start a worker and wait for it to report ready (blocking: runs in a thread)."""
        _reap_all(dying, 1.0)
        parent_end, child_end = self._context.Pipe(duplex=True)
        process = self._context.Process(
            target=run_worker,
            args=(child_end, self.memory_mb << 20),
            name=f"{self.name}-worker",
            daemon=True,  # never outlives the service
        )
        try:
            process.start()
        finally:
            child_end.close()
        worker = _Worker(process, parent_end)
        try:
            if not parent_end.poll(_WORKER_START_TIMEOUT_S):
                raise WorkerError(f"a worker did not start within {_WORKER_START_TIMEOUT_S:g} s")
            status, detail = parent_end.recv()
        except EOFError:
            worker.kill()
            worker.reap(1.0)
            logger.warning(
                "a %s worker ended while starting; a script that starts the service must do so "
                "under `if __name__ == '__main__':` (workers import the main module)",
                self.name,
            )
            raise WorkerError(f"a worker process ended while starting: {worker.exit_description()}") from None
        except BaseException:
            worker.kill()
            worker.reap(1.0)
            raise
        if status != "ready":
            worker.kill()
            worker.reap(1.0)
            raise WorkerError(str(detail))
        if detail is None:
            logger.warning("%s worker runs without a memory limit on this platform", self.name)
        return worker

    def _wake_one(self) -> None:
        """Tell the first waiting caller to look again (a worker went away: room to start one)."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _release(self, worker: _Worker) -> None:
        """A worker is free: hand it to the first waiting caller, or keep it idle."""
        if not self._closed:
            while self._waiters:
                waiter = self._waiters.popleft()
                if not waiter.done():
                    waiter.set_result(worker)
                    return
            if len(self._idle) < self.max_workers:
                self._idle.append(worker)
                return
        self._workers.discard(worker)
        worker.stop()
        self._dying.append(worker)

    def _discard(self, worker: _Worker) -> None:
        """Kill a worker that cannot be trusted with another job; a waiting caller may start one."""
        worker.kill()
        self._workers.discard(worker)
        if worker in self._idle:
            self._idle.remove(worker)
        self._dying.append(worker)
        if not self._closed:
            self._wake_one()

    async def _exchange(
        self, worker: _Worker, func: Callable[..., Any], args: tuple[Any, ...], timeout: float
    ) -> tuple[str, Any]:
        """Send one job and wait for its reply; raise WorkerTimeout or WorkerCrashed."""
        loop = asyncio.get_running_loop()
        try:
            # Small, and the worker is waiting for it: the pipe takes it without blocking.
            worker.conn.send((func, args, math.ceil(timeout) + 1))
        except (OSError, EOFError) as exc:
            raise WorkerCrashed(f"the worker process is gone ({describe_exception(exc)})") from None
        readable: asyncio.Future[None] = loop.create_future()
        fd = worker.conn.fileno()
        loop.add_reader(fd, _wake, readable)
        try:
            async with asyncio.timeout(timeout):
                await readable
        except TimeoutError:
            raise WorkerTimeout(f"the job took longer than {timeout:g} s") from None
        finally:
            loop.remove_reader(fd)
        try:
            reply = worker.conn.recv()
        except (EOFError, OSError):
            # The pipe ends as the process exits: give it a moment to, for its exit status.
            with contextlib.suppress(Exception):
                await asyncio.to_thread(worker.process.join, 1.0)
            raise WorkerCrashed(
                f"the worker process stopped unexpectedly: {worker.exit_description()}"
            ) from None
        except Exception as exc:  # noqa: BLE001 - e.g. an exception that cannot be unpickled
            return ("error", WorkerError(f"unreadable reply: {describe_exception(exc)}"))
        if not (isinstance(reply, tuple) and len(reply) == 2):
            raise WorkerCrashed(f"the worker sent an unexpected message: {reply!r:.80}")
        return reply


def _reap_all(workers: Sequence[_Worker], timeout: float) -> None:
    """Wait for stopped or killed workers to end, sharing one deadline (blocking)."""
    deadline = time.monotonic() + timeout
    for worker in workers:
        worker.reap(max(0.0, deadline - time.monotonic()))
