"""Run a function in a bounded worker process: a hard memory limit, a hard time limit.

:class:`WorkerPool` (in :mod:`service.sandbox.pool`) keeps a few worker processes forked from a
clean ``forkserver``; each caps its own memory with ``RLIMIT_AS`` before taking jobs (see
:mod:`service.sandbox.worker`), and a job that overruns its timeout gets its worker killed and
replaced, so a job that slips past its caller's own checks costs one worker process, never the
service. The exceptions a call can end with are in :mod:`service.sandbox.errors`.

Nothing here knows what the jobs are: the calculator tool (:mod:`service.agent.calculator`) is
one user.
"""

from service.sandbox.errors import (
    WorkerCrashed,
    WorkerError,
    WorkerMemoryError,
    WorkerPoolClosed,
    WorkerTimeout,
)
from service.sandbox.pool import WorkerPool

__all__ = [
    "WorkerCrashed",
    "WorkerError",
    "WorkerMemoryError",
    "WorkerPool",
    "WorkerPoolClosed",
    "WorkerTimeout",
]
