"""``--baseline``'s ratios read alike whatever they measure: above 1, the current tree is better."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from benchlib import ROOT  # noqa: E402
from benchlib.baseline import BASELINE, CURRENT, speed_ratio, trees, versus  # noqa: E402


def test_a_cost_that_fell_and_a_rate_that_rose_are_both_above_one() -> None:
    assert speed_ratio(5.0, 10.0) == 2.0  # CPU per event halved
    assert speed_ratio(200.0, 100.0, rate=True) == 2.0  # events/s doubled
    assert speed_ratio(10.0, 5.0) == 0.5


def test_a_missing_or_zero_figure_has_no_ratio() -> None:
    assert speed_ratio(None, 1.0) is None
    assert speed_ratio(0.0, 1.0) is None
    assert speed_ratio(float("nan"), 1.0) is None


def test_versus_gives_both_values_the_ratio_and_how_it_was_taken() -> None:
    current = {"cpu_us": 2.0, "events_per_s": 300.0, "rss": 1000}
    baseline = {"cpu_us": 3.0, "events_per_s": 200.0, "rss": 1500}
    rows = versus(current, baseline, costs=["cpu_us"], rates=["events_per_s"], memory=["rss"])
    assert rows["cpu_us"] == {CURRENT: 2.0, BASELINE: 3.0, "speed_ratio": 1.5, "ratio_is": "baseline/current"}
    assert rows["events_per_s"]["speed_ratio"] == 1.5
    assert rows["events_per_s"]["ratio_is"] == "current/baseline"
    assert rows["rss"]["memory_ratio"] == 1.5
    assert "speed_ratio" not in rows["rss"]


def test_without_a_ref_only_the_current_tree() -> None:
    with contextlib.ExitStack() as exits:
        assert trees(exits, None) == {CURRENT: ROOT}
