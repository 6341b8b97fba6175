"""The benchmarks' arithmetic: percentiles, medians over rounds, ratios."""

from __future__ import annotations

import statistics
from typing import Any


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def spread(values: list[float]) -> dict[str, float | None]:
    """p50, p99 and max, rounded (None for nothing)."""
    if not values:
        return {"p50": None, "p99": None, "max": None}
    return {
        "p50": round(percentile(values, 0.5), 2),
        "p99": round(percentile(values, 0.99), 2),
        "max": round(max(values), 2),
    }


def median(values: list[float]) -> float:
    """The median, or NaN for nothing."""
    return statistics.median(values) if values else float("nan")


def med(rounds: list[dict[str, Any]], key: str) -> float:
    """The median of one figure over rounds."""
    return median([r[key] for r in rounds if r.get(key) is not None])


def ratio(a: float, b: float) -> float | None:
    """a / b, or None when either is missing."""
    if not a or not b or a != a or b != b:
        return None
    return round(a / b, 2)
