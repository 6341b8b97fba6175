"""What the load tool measures while it runs, and the percentiles it reports."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

now = time.perf_counter


class Stats:
    """Everything measured during a run; the hot path only appends floats and bumps counters."""

    def __init__(self) -> None:
        self.start = now()
        self.started = 0
        self.finished = 0
        self.ok = 0
        self.events = 0
        self.heartbeats = 0
        self.lost = 0
        self.repeated = 0
        self.ttft: list[float] = []
        self.gaps: list[float] = []
        self.e2e: list[float] = []
        self.errors: Counter[str] = Counter()
        self.by_mode: dict[str, Counter[str]] = {}
        self.timeline: list[tuple[float, float | None, float | None, bool]] = []
        self.event_bins: list[int] = []  # events received in each second of the run

    def count_events(self, n: int, at: float) -> None:
        """Count ``n`` events received at ``at``."""
        self.events += n
        second = int(at - self.start)
        bins = self.event_bins
        if second >= len(bins):
            bins.extend([0] * (second + 1 - len(bins)))
        bins[second] += n


class Probe:
    """One query's timings."""

    __slots__ = ("stats", "t0", "ttft", "last_text", "end")

    def __init__(self, stats: Stats) -> None:
        self.stats = stats
        self.t0 = now()
        self.ttft: float | None = None
        self.last_text: float | None = None
        self.end: float | None = None  # when `done` arrived

    def text(self, at: float) -> None:
        """A text event arrived at ``at``: the first one's time, or the gap since the last."""
        if self.last_text is None:
            self.ttft = at - self.t0
        else:
            self.stats.gaps.append(at - self.last_text)
        self.last_text = at


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def median(values: list[float]) -> float:
    """The median by nearest rank."""
    return pct(values, 0.5)


def summary(values: list[float]) -> dict[str, Any]:
    """n, p50, p90, p99, max in milliseconds."""
    if not values:
        return {"n": 0, "p50": None, "p90": None, "p99": None, "max": None}
    ordered = sorted(values)
    last = len(ordered) - 1

    def at(q: float) -> float:
        return round(ordered[min(last, int(q * len(ordered)))] * 1000, 3)

    return {
        "n": len(ordered),
        "p50": at(0.5),
        "p90": at(0.9),
        "p99": at(0.99),
        "max": round(ordered[-1] * 1000, 3),
    }
