"""What the load tool shows: the progress line while it runs, the summary table, the latency plot."""

from __future__ import annotations

import asyncio
from typing import Any, TextIO

from service.loadtest.run import Run
from service.loadtest.stats import Stats, now


async def progress(run: Run, out: TextIO) -> None:
    """Redraw one line on ``out`` four times a second until cancelled, then clear it."""
    config = run.config
    stats = run.stats
    width = 24
    try:
        while True:
            elapsed = now() - stats.start
            events_rate = stats.events / elapsed if elapsed > 0 else 0.0
            if config.duration is not None:
                done_share = min(1.0, elapsed / config.duration)
                total = f"{stats.finished} done"
            else:
                target = config.count or 1
                done_share = stats.finished / target
                total = f"{stats.finished}/{target}"
            filled = int(done_share * width)
            failed = stats.finished - stats.ok
            out.write(
                f"\r[{'#' * filled}{'.' * (width - filled)}] {total} queries, {run.active} running, "
                f"{failed} failed, {events_rate:,.0f} ev/s, {elapsed:.1f} s   "
            )
            out.flush()
            await asyncio.sleep(0.25)
    except asyncio.CancelledError:
        out.write("\r" + " " * 100 + "\r")
        out.flush()
        raise


def format_report(report: dict[str, Any]) -> str:
    """The summary table."""
    queries = report["queries"]
    out = [
        f"agentstream load: {report['mode']} against {report['url']}, {report['clients']} clients, "
        f"ramp-up {report['ramp_up_s']:g} s, {report['duration_s']:.1f} s",
        f"queries     {queries['finished']} finished of {queries['started']} started: "
        f"{queries['ok']} ok, {queries['failed']} failed"
        + (
            " ("
            + ", ".join(
                f"{m} {c.get('ok', 0)}/{c.get('ok', 0) + c.get('failed', 0)}"
                for m, c in report["by_mode"].items()
            )
            + ")"
            if len(report["by_mode"]) > 1
            else ""
        ),
        f"{'':12}{'n':>8}{'p50':>10}{'p90':>10}{'p99':>10}{'max':>10}",
    ]
    for name, key in (("TTFT ms", "ttft_ms"), ("gap ms", "gap_ms"), ("e2e ms", "e2e_ms")):
        row = report[key]
        cells = "".join(
            f"{'-' if row[q] is None else format(row[q], '.1f'):>10}" for q in ("p50", "p90", "p99", "max")
        )
        out.append(f"{name:12}{row['n']:>8}{cells}")
    out.append(
        f"events      {report['events']:,} ({report['events_per_s']:,.0f}/s), heartbeats {report['heartbeats']}"
    )
    ids = report["ids"]
    out.append(f"ids         lost {ids['lost']}, repeated {ids['repeated']}")
    errors = report["errors"]
    out.append(
        "errors      " + ("none" if not errors else ", ".join(f"{kind}: {n}" for kind, n in errors.items()))
    )
    cpu = report["client_cpu"]
    per_event = f", {cpu['us_per_event']:.0f} us/event" if cpu["us_per_event"] else ""
    lag = cpu["loop_lag_ms"]
    lag_text = f", loop lag p99 {lag['p99']:.1f} ms, max {lag['max']:.1f} ms" if lag["n"] else ""
    out.append(
        f"client CPU  {cpu['seconds']:.2f} s ({cpu['share_of_one_core']:.0%} of one core{per_event}{lag_text})"
    )
    if "plot" in report:
        out.append(f"plot        {report['plot']}")
    out.append("result      " + ("clean" if report["clean"] else "NOT CLEAN"))
    return "\n".join(out)


def plot(stats: Stats, path: str) -> str:
    """Latency over the run to ``path`` (PNG); matplotlib is imported only here."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return (
            "not written: --plot needs matplotlib (pip install 'agentstream[plot]' or pip install matplotlib)"
        )
    figure, (latency, rate) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    ok = [t for t in stats.timeline if t[3]]
    failed = [t for t in stats.timeline if not t[3]]
    latency.scatter([t[0] for t in ok], [t[2] * 1000 for t in ok], s=6, label="end to end")
    with_ttft = [t for t in stats.timeline if t[1] is not None]
    latency.scatter([t[0] for t in with_ttft], [t[1] * 1000 for t in with_ttft], s=6, label="TTFT")
    if failed:
        top = max((t[2] or 0) * 1000 for t in ok) if ok else 1.0
        latency.scatter([t[0] for t in failed], [top] * len(failed), marker="x", color="red", label="failed")
    latency.set_ylabel("ms")
    latency.set_title("latency by the time the query was sent")
    latency.legend()
    rate.step(range(len(stats.event_bins)), stats.event_bins, where="post")
    rate.set_ylabel("events/s")
    rate.set_xlabel("s since the start")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
