"""The worker process's side of the sandbox: limit itself, say it is ready, then run jobs.

:func:`run_worker` is the target of every worker process the pool starts. Before it takes a
job it caps its own memory (``RLIMIT_AS``, or ``RLIMIT_DATA`` where that cannot be set) and turns
off core files; with each job, ``(func, args, cpu_seconds)``, it sets a CPU-time backstop
(``None`` instead of a job tells it to exit). A job's reply is ``("ok", result)``,
``("error", exception)`` or ``("memory", None)``; after a MemoryError the worker ends, so the pool
replaces it with a fresh one.
"""

from __future__ import annotations

import contextlib
import math
import signal
from typing import Any

from service.errors import describe_exception
from service.sandbox.errors import WorkerError

try:
    import resource
except ImportError:  # not on Windows: workers then run without a memory limit
    resource = None  # type: ignore[assignment]

__all__ = ["run_worker"]


def _limit_memory(limit_bytes: int) -> str | None:
    """Cap this process's memory; return the name of the limit applied, or None if none could be."""
    if resource is None:
        return None
    # RLIMIT_AS bounds every mapping, so a huge allocation fails at once with MemoryError;
    # RLIMIT_DATA is the fallback where the address-space limit cannot be set (macOS).
    for name in ("RLIMIT_AS", "RLIMIT_DATA"):
        which = getattr(resource, name, None)
        if which is None:
            continue
        try:
            _, hard = resource.getrlimit(which)
            value = limit_bytes if hard == resource.RLIM_INFINITY else min(limit_bytes, hard)
            # The hard limit too: nothing in this process may raise it again.
            resource.setrlimit(which, (value, value))
            return name
        except (ValueError, OSError):
            continue
    return None


def _limit_cpu(seconds: int) -> None:
    """A backstop for the parent's timer: SIGXCPU ends this process after ``seconds`` more CPU.

    The parent kills an overrunning worker long before; this only matters if the parent cannot
    (it was killed, or its event loop is stuck), so an orphaned job cannot compute forever.
    """
    if resource is None:
        return
    try:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        soft = math.ceil(usage.ru_utime + usage.ru_stime) + seconds
        _, hard = resource.getrlimit(resource.RLIMIT_CPU)
        if hard != resource.RLIM_INFINITY:
            soft = min(soft, hard)
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
    except (ValueError, OSError):
        pass


def _send_reply(conn: Any, reply: tuple[str, Any]) -> bool:
    """Send a job's reply; False when the parent is gone."""
    try:
        conn.send(reply)
        return True
    except (EOFError, OSError):
        return False
    except MemoryError:
        reply = ("memory", None)
    except Exception as exc:  # noqa: BLE001 - the result (or exception) could not be pickled
        reply = ("error", WorkerError(f"the result could not be sent back: {describe_exception(exc)}"))
    try:
        conn.send(reply)
        return True
    except Exception:  # noqa: BLE001 - nothing more can be told; the parent sees the worker end
        return False


def run_worker(conn: Any, memory_bytes: int) -> None:
    """A worker process: apply the limits, report ready, then run jobs until told to stop."""
    # Ctrl-C reaches the whole process group; the parent decides when workers end.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    applied = _limit_memory(memory_bytes)
    if resource is not None:
        try:
            # A worker stopped by SIGXCPU must not write a core file the size of its memory.
            resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
        except (ValueError, OSError):
            pass
    try:
        probe = bytearray(4 << 20)  # a worker that cannot compute anything is useless: say so
        del probe
    except MemoryError:
        with contextlib.suppress(Exception):
            conn.send(("failed", f"a memory limit of {memory_bytes >> 20} MB is too low for a worker"))
        return
    conn.send(("ready", applied))
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return  # the parent went away
        except MemoryError:
            _send_reply(conn, ("memory", None))
            return
        if job is None:
            return
        func, args, cpu_seconds = job
        _limit_cpu(cpu_seconds)
        try:
            reply: tuple[str, Any] = ("ok", func(*args))
        except MemoryError:
            reply = ("memory", None)
        except BaseException as exc:  # noqa: BLE001 - every failure goes back to the caller
            reply = ("error", exc)
        del job, func, args
        if not _send_reply(conn, reply) or reply[0] == "memory":
            # After a MemoryError the heap may be fragmented or half-built: start afresh.
            return
