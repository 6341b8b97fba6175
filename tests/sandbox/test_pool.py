"""Tests for the worker-process pool: its memory limit, crashes, and workers that must not outlive it.

The calculator's tests (tests/agent/test_calculator.py) run calculations in the pool too: time
limits, closing, concurrency.
"""

from __future__ import annotations

import asyncio
import gc
import os
import resource
from typing import Any

import pytest

from service.sandbox import WorkerCrashed, WorkerMemoryError, WorkerPool


async def test_worker_has_the_memory_limit(pools: Any) -> None:
    pool = pools(WorkerPool(max_workers=1, memory_mb=100))
    limit = await pool.call(resource.getrlimit, resource.RLIMIT_AS, timeout=5)
    assert limit == (100 << 20, 100 << 20)


async def test_allocation_past_the_memory_limit_is_stopped_and_the_worker_replaced(pools: Any) -> None:
    pool = pools(WorkerPool(max_workers=1, memory_mb=64))
    with pytest.raises(WorkerMemoryError, match="needed more than 64 MB"):
        await pool.call(bytearray, 1 << 30, timeout=30)
    assert await pool.call(abs, -3, timeout=5) == 3
    assert pool.started == 2  # the worker that ran out of memory was retired


async def test_a_crashed_worker_is_an_error_and_is_replaced(pools: Any) -> None:
    pool = pools(WorkerPool(max_workers=1))
    with pytest.raises(WorkerCrashed, match="exited with code 3"):
        await pool.call(os._exit, 3, timeout=5)
    assert await pool.call(abs, -1, timeout=5) == 1


async def test_a_pool_dropped_without_close_kills_its_workers() -> None:
    pool = WorkerPool(max_workers=1)
    await pool.call(abs, 1, timeout=5)
    (worker,) = pool._workers
    process = worker.process
    del pool, worker
    gc.collect()
    await asyncio.to_thread(process.join, 10)
    assert process.exitcode == -9


def test_pool_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="max_workers"):
        WorkerPool(max_workers=0)
    with pytest.raises(ValueError, match="memory_mb"):
        WorkerPool(memory_mb=0)
