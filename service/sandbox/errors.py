"""What a job in the sandbox can end with besides its own result or exception.

::

    WorkerError             a job could not be run to completion in a worker process
     ├── WorkerTimeout      it overran its time limit (its worker was killed)
     ├── WorkerMemoryError  it hit the worker's memory limit (its worker was retired)
     ├── WorkerCrashed      its worker process died
     └── WorkerPoolClosed   the pool is shut down
"""

from __future__ import annotations

__all__ = ["WorkerCrashed", "WorkerError", "WorkerMemoryError", "WorkerPoolClosed", "WorkerTimeout"]


class WorkerError(RuntimeError):
    """A job could not be run to completion in a worker process."""


class WorkerTimeout(WorkerError):
    """The job overran its time limit; its worker was killed."""


class WorkerMemoryError(WorkerError):
    """The job hit the worker's memory limit; the worker was retired."""


class WorkerCrashed(WorkerError):
    """The worker process died while running the job."""


class WorkerPoolClosed(WorkerError):
    """The pool is shut down."""
