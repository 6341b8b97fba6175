"""Event-loop lag: how late the loop wakes a task that asked to sleep a fixed interval.

A blocking call on the loop shows up here at once, so the service reports it in ``/healthz``
and the benchmarks read it from there.
"""

from __future__ import annotations

import asyncio
import collections
import time


class LoopLagMonitor:
    """Samples the loop's lag every ``interval`` seconds and keeps the last ``window`` samples."""

    def __init__(self, interval: float = 0.02, window: int = 3000) -> None:
        self.interval = interval
        self._samples: collections.deque[float] = collections.deque(maxlen=window)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Begin sampling on the running loop."""
        if self._task is None:
            self._task = asyncio.create_task(self._sample(), name="loop-lag-monitor")

    async def stop(self) -> None:
        """Stop sampling."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def reset(self) -> None:
        """Forget the samples so far (benchmarks measure one phase at a time)."""
        self._samples.clear()

    async def _sample(self) -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(self.interval)
            self._samples.append(max(0.0, time.perf_counter() - before - self.interval))

    def summary(self) -> dict[str, float]:
        """p50, p99 and max lag in milliseconds over the window, and the sample count."""
        samples = sorted(self._samples)
        if not samples:
            return {"p50": 0.0, "p99": 0.0, "max": 0.0, "samples": 0}

        def pick(q: float) -> float:
            return round(samples[min(len(samples) - 1, int(q * len(samples)))] * 1000, 3)

        return {"p50": pick(0.5), "p99": pick(0.99), "max": round(samples[-1] * 1000, 3), "samples": len(samples)}
