"""``--baseline GIT_REF``: the trees a benchmark compares, and the ratios it prints between them.

A benchmark given ``--baseline REF`` runs every round against the service of this tree
(``current``) and against the service as of REF (``baseline``, a temporary worktree from
:func:`benchlib.stack.baseline_tree`), one after the other, on the same machine in the same run.

Every ratio is oriented the same way, so that it reads alike whatever it measures: **above 1 the
current tree is better**. For a cost (CPU time, latency) the *speed ratio* is baseline / current;
for a rate (events per second) it is current / baseline; for memory the *memory ratio* is
baseline bytes / current bytes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from benchlib import ROOT
from benchlib.stack import baseline_tree

CURRENT, BASELINE = "current", "baseline"
SPEED_RATIO = (
    "speed ratio = baseline cost / current cost (for a rate such as events/s: current / baseline); "
    "> 1: the current tree is cheaper or faster, < 1: slower"
)
MEMORY_RATIO = "memory ratio = baseline bytes / current bytes; > 1: the current tree uses less memory"


def trees(exits: contextlib.ExitStack, ref: str | None) -> dict[str, Path]:
    """``{"current": this checkout}``, and ``"baseline"``: ``ref`` checked out (removed when
    ``exits`` closes) when a ref is given."""
    sources = {CURRENT: ROOT}
    if ref:
        sources[BASELINE] = exits.enter_context(baseline_tree(ref))
    return sources


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not a or not b or a != a or b != b:
        return None
    return round(a / b, 3)


def speed_ratio(current: float | None, baseline: float | None, *, rate: bool = False) -> float | None:
    """Above 1 when current is better: baseline / current for a cost, current / baseline for a rate."""
    return _ratio(current, baseline) if rate else _ratio(baseline, current)


def versus(
    current: dict[str, Any],
    baseline: dict[str, Any],
    *,
    costs: Iterable[str] = (),
    rates: Iterable[str] = (),
    memory: Iterable[str] = (),
) -> dict[str, dict[str, Any]]:
    """Per figure (a key of both dicts): both values, the ratio, above 1 when current is better
    (``speed_ratio`` for ``costs`` and ``rates``, ``memory_ratio`` for ``memory``), and
    ``ratio_is``, how it was taken."""
    out: dict[str, dict[str, Any]] = {}
    kinds = [(key, "cost") for key in costs] + [(key, "rate") for key in rates]
    kinds += [(key, "memory") for key in memory]
    for key, kind in kinds:
        now, then = current.get(key), baseline.get(key)
        row: dict[str, Any] = {CURRENT: now, BASELINE: then}
        if kind == "memory":
            row["memory_ratio"] = _ratio(then, now)
        else:
            row["speed_ratio"] = speed_ratio(now, then, rate=kind == "rate")
        row["ratio_is"] = "current/baseline" if kind == "rate" else "baseline/current"
        out[key] = row
    return out


def legend(ref: str) -> dict[str, str]:
    """What a JSON result says about its comparison."""
    return {"ref": ref, "speed_ratio": SPEED_RATIO, "memory_ratio": MEMORY_RATIO}


def print_versus(comparison: dict[str, dict[str, Any]], ref: str, indent: str = "  ") -> None:
    """The figures of :func:`versus`, one a line, for people."""
    print(f"{indent}current vs baseline {ref} (every ratio > 1: current better):")
    width = max((len(key) for key in comparison), default=0)
    for key, row in comparison.items():
        if "memory_ratio" in row:
            name, value = "memory ratio (baseline bytes / current bytes)", row["memory_ratio"]
        elif row["ratio_is"] == "current/baseline":
            name, value = "speed ratio (current rate / baseline rate)", row["speed_ratio"]
        else:
            name, value = "speed ratio (baseline cost / current cost)", row["speed_ratio"]
        shown = "n/a" if value is None else f"{value:.3f}"
        print(
            f"{indent}  {key:<{width}}  current {_fmt(row[CURRENT])}, baseline {_fmt(row[BASELINE])}; "
            f"{name}: {shown}"
        )


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 10_000 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)
