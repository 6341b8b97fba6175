"""Event-loop lag: how late the loop wakes a task that asked to sleep a fixed interval.

A blocking call on the loop shows up here at once, so the service reports it in ``/healthz``
and the benchmarks read it from there.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable


class LoopLagMonitor:
    """Samples the loop's lag every ``interval`` seconds and keeps the last ``window`` samples."""

    def __init__(
        self, interval: float = 0.02, window: int = 3000, on_sample: Callable[[float], None] | None = None
    ) -> None:
        self.interval = interval
        self.on_sample = on_sample  # called with each lag in seconds (the metrics' histogram)
        # (when, lag) pairs; ``when`` is time.monotonic(), comparable across processes on Linux.
        self._samples: collections.deque[tuple[float, float]] = collections.deque(maxlen=window)
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

    async def _sample(self) -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(self.interval)
            now = time.monotonic()
            lag = max(0.0, now - before - self.interval)
            self._samples.append((now, lag))
            if self.on_sample is not None:
                self.on_sample(lag)

    def summary(self, since: float | None = None) -> dict[str, float]:
        """p50, p99 and max lag in ms over the window (or since a monotonic time), and the count."""
        samples = sorted(lag for when, lag in self._samples if since is None or when >= since)
        if not samples:
            return {"p50": 0.0, "p99": 0.0, "max": 0.0, "samples": 0}

        def pick(q: float) -> float:
            return round(samples[min(len(samples) - 1, int(q * len(samples)))] * 1000, 3)

        return {
            "p50": pick(0.5),
            "p99": pick(0.99),
            "max": round(samples[-1] * 1000, 3),
            "samples": len(samples),
        }
