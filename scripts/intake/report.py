"""``bench_concurrency.py --paced``'s table, from its result (the ``--json`` output)."""

from __future__ import annotations

from typing import Any

from benchlib.procs import CLIENT_CPU, SERVER_CPU, can_pin
from peers.report import fmt, table

HEADERS = [
    "runs target",
    "done",
    "1st token added ms p50/p99",
    "to upstream ms p50/p99",
    "jitter p99 ms",
    "last token late p99 ms",
    "loop lag p99 ms",
    "CPU us/token",
    "threads max",
    "busy svc/emu/client",
    "wall s",
]
SHORT = {
    "first_token_added_ms p50": "1st p50",
    "first_token_added_ms p99": "1st p99",
    "upstream_request_ms p99": "upstream p99",
    "jitter_ms p99": "jitter p99",
    "loop_lag_ms p99": "lag p99",
    "cpu_us_per_token": "CPU/token",
    "threads_max": "threads",
}


def row(n: str, name: str, v: dict[str, Any]) -> list[Any]:
    """One target's line."""
    added = v["first_token_added_ms"]
    upstream = v.get("upstream_request_ms") or {"p50": None, "p99": None}
    return [
        f"{int(n):,} {name}",
        f"{v['done']}/{v['runs']}",
        f"{fmt(added['p50'], 2)}/{fmt(added['p99'])}",
        f"{fmt(upstream['p50'])}/{fmt(upstream['p99'])}",
        v["jitter_ms"]["p99"],
        v["last_token_late_ms"]["p99"],
        v["loop_lag_ms"]["p99"],
        v["cpu_us_per_token"],
        v["threads_max"],
        f"{v['server_busy'] * 100:.0f}/{v['emulator_busy'] * 100:.0f}/{v['client_busy'] * 100:.0f}%",
        v["wall_s"],
    ]


def report(result: dict[str, Any]) -> None:
    """Print the table, the ratios under it, and the notes."""
    c = result["config"]
    pin = (
        f"servers on CPU {SERVER_CPU}, client and emulators on CPU {CLIENT_CPU}"
        if can_pin()
        else "NOT pinned (fewer than 2 CPUs)"
    )
    print(
        f"paced concurrent runs (POST /agent/stream, one SSE subscriber each): {c['tokens_per_run']} tokens, "
        f"first token {c['ttft_ms'][0]}-{c['ttft_ms'][1]} ms, {c['tokens_per_second'][0]}-"
        f"{c['tokens_per_second'][1]} tokens/s, drawn per run; {c['provider']} wire"
    )
    print(f"  {pin}; medians of {c['rounds']} alternating round(s)")
    for note in result["notes"]:
        print(f"  {note}")
    rows = [
        row(n, name, v)
        for n, targets in result["sizes"].items()
        for name, v in targets.items()
        if name != "ratios"
    ]
    table(HEADERS, rows)
    for n, targets in result["sizes"].items():
        for pair, values in targets["ratios"].items():
            shown = ", ".join(f"{SHORT[k]} {fmt(v, 2)}" for k, v in values.items())
            print(f"  {int(n):,} {pair}: {shown}")
