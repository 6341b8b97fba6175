"""``bench_peers.py``'s tables, from its result (the ``--json`` output)."""

from __future__ import annotations

from typing import Any

from benchlib.procs import CLIENT_CPU, SERVER_CPU, can_pin

from peers.config import Config


def fmt(value: Any, digits: int = 1) -> str:
    """A number for the table."""
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, int) or (isinstance(value, float) and abs(value) >= 1000):
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def table(headers: list[str], rows: list[list[Any]]) -> None:
    """Print rows under headers, columns aligned (the first left, the rest right)."""
    cells = [headers] + [
        [row[0]] + [fmt(c) if not isinstance(c, str) else c for c in row[1:]] for row in rows
    ]
    widths = [max(len(str(r[i])) for r in cells) for i in range(len(headers))]
    for r in cells:
        print(
            "  "
            + "  ".join(
                str(c).ljust(w) if i == 0 else str(c).rjust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=True))
            )
        )


def print_ratios(ratios: dict[str, Any]) -> None:
    """The ratios line."""
    shown = [f"{k} {fmt(v, 2)}" for k, v in ratios.items()]
    if shown:
        print("  ratios: " + ", ".join(shown))


def throughput_rows(targets: dict[str, Any]) -> list[list[Any]]:
    """Rows of a replay table."""
    rows = []
    for name, v in targets.items():
        if isinstance(v, str):
            rows.append([name, v, "", "", ""])
        else:
            rounds = " ".join(f"{x:,}" for x in v["rounds_events_per_s"])
            rows.append(
                [name, v["events_per_s"], v["cpu_us_per_event"], f"{v['client_busy'] * 100:.0f}%", rounds]
            )
    return rows


def report(result: dict[str, Any], cfg: Config) -> None:
    """Print the tables."""
    pin = (
        f"servers on CPU {SERVER_CPU}, client on CPU {CLIENT_CPU}"
        if can_pin()
        else "NOT pinned (fewer than 2 CPUs)"
    )
    print(
        f"bench_peers: {pin}, emulator on CPU {cfg.emulator_cpu}; medians of {cfg.rounds} alternating round(s)"
    )
    for note in cfg.notes:
        print(f"  {note}")
    if "replay" in result:
        r = result["replay"]
        print(
            f"\n1. replay fan-out: {r['events_in_log']} events x {r['subscribers']} SSE subscribers from Last-Event-ID 0"
        )
        table(
            ["target", "events/s", "CPU us/event", "client busy", "events/s by round"],
            throughput_rows(r["targets"]),
        )
        print_ratios(r["ratios"])
    if "ws" in result:
        r = result["ws"]
        print(f"\n2. replay over WebSocket: {r['events_in_log']} events x {r['subscribers']} subscribers")
        table(
            ["target", "events/s", "CPU us/event", "client busy", "events/s by round"],
            throughput_rows(r["targets"]),
        )
        print_ratios(r["ratios"])
    if "live" in result:
        live_table(result["live"])
    if "concurrency" in result:
        r = result["concurrency"]
        print(
            f"\n4. concurrent runs (POST /agent/stream, {r['tokens_per_run']} tokens, ttft 600-1200 ms, "
            "50-150 tokens/s each; service only: no peer runs an agent)"
        )
        rows = []
        for n, v in r["sizes"].items():

            def three(d: dict[str, Any]) -> str:
                return "/".join(fmt(d[q]) for q in ("p50", "p99", "max"))

            rows.append(
                [
                    f"{int(n):,} runs",
                    f"{v['done']}/{n}",
                    three(v["gap_minus_paced_ms"]),
                    three(v["late_vs_schedule_ms"]),
                    three(v["ttft_added_ms"]),
                    three(v["post_to_upstream_request_ms"]),
                    three(v["emulator_first_token_to_client_ms"]),
                    three(v["loop_lag_ms"]),
                    v["service_cpu_us_per_token"],
                    f"{v['service_busy'] * 100:.0f}/{v['emulator_busy'] * 100:.0f}/{v['client_busy'] * 100:.0f}%",
                ]
            )
        table(
            [
                "batch",
                "done",
                "gap-1/tps ms p50/p99/max",
                "late vs schedule ms",
                "TTFT added ms",
                "POST->emulator ms",
                "emu 1st token->client ms",
                "loop lag ms",
                "CPU us/token",
                "busy svc/emu/client",
            ],
            rows,
        )
    if "idle" in result:
        r = result["idle"]
        print(
            f"\n5. idle: {r['connections']:,} connections, server RSS bytes per connection (fresh process per round)"
        )
        rows = []
        for transport in ("sse", "ws"):
            for name, v in r[transport].items():
                rows.append(
                    [f"{transport.upper()} {name}"]
                    + (
                        [v, ""]
                        if isinstance(v, str)
                        else [v["rss_bytes_per_connection"], " ".join(f"{x:,}" for x in v["rounds"])]
                    )
                )
        table(["target", "bytes/conn", "by round"], rows)
        print_ratios(r["ratios"])
    if "slow" in result:
        r = result["slow"]
        print(
            f"\n6. slow reader: {r['subscribers']} SSE subscribers ({r['parsed_subscribers']} parse) + 1 that never "
            f"reads, {r['tokens']:,} unpaced tokens, delta merging off; a fresh service per round"
        )
        rows = [
            [
                f"{name} slow reader",
                v["events_in_log"],
                v["p50_ms"],
                v["p99_ms"],
                v["max_ms"],
                v["answer_s"],
                v["rss_growth_bytes"] / 2**20,
                v["rss_peak_growth_bytes"] / 2**20,
                v["cpu_us_per_delivery"],
                f"{v['server_busy'] * 100:.0f}%",
                f"{v['client_busy'] * 100:.0f}%",
                v["streams_open_after"],
            ]
            for name, v in ((k, r[k]) for k in ("without", "with"))
        ]
        table(
            [
                "round",
                "events",
                "p50 ms",
                "p99 ms",
                "max ms",
                "answer s",
                "RSS growth MiB",
                "peak growth MiB",
                "CPU us/deliv",
                "server busy",
                "client busy",
                "streams held after",
            ],
            rows,
        )
        print_ratios(r["ratios"])


def live_table(r: dict[str, Any]) -> None:
    """The live scenario's table, and the CPU of every client process (and worker, and Redis)."""
    workers = f", the service as {r['workers']} workers on Redis" if r["workers"] else ""
    print(
        f"\n3. live fan-out over {r['dialect']}{workers}: {r['tokens']} tokens at {r['tokens_per_second']:g}/s; "
        "latency = subscriber's read - the token's production, every token at every subscriber; "
        "a delivery = a token at a subscriber; busy = CPU s / (first token produced -> last subscriber's end)"
    )
    for name in r["not_installed"]:
        print(f"  {name}: not installed")
    rows, details = [], []
    for n, summary in r["sizes"].items():
        for name, v in summary.items():
            if name == "ratios":
                continue
            rows.append(
                [
                    f"{int(n):,} {name}",
                    v["p50_ms"],
                    v["p99_ms"],
                    v["max_ms"],
                    f"{v['deliveries']:,}/{v['expected']:,}",
                    f"{v['complete_subscribers']:,}",
                    f"{v['answer_s']:.1f}/{v['paced_s']:.0f}",
                    v["cpu_us_per_delivery"],
                    f"{v['server_busy'] * 100:.0f}%",
                    f"{sum(v['client_busy']) * 100:.0f}%",
                    v["text_parts_per_subscriber"],
                    "yes" if v["all_delivered"] and v["kept_pace"] and v["p99_under_250"] else "NO",
                ]
            )
            busy = " ".join(f"{b * 100:.0f}%" for b in v["client_busy"])
            line = f"  {int(n):,} {name}: client processes {busy} ({v['client_system_share'] * 100:.0f}% in the kernel)"
            if v["workers_busy"]:
                busiest = sorted(v["workers_busy"], reverse=True)[: r["workers"] + 1]
                line += "; service's busiest processes " + " ".join(f"{b * 100:.0f}%" for b in busiest)
            if v["emulator_busy"] is not None:
                line += f"; emulator {v['emulator_busy'] * 100:.0f}%"
            line += f"; last token produced at {v['produced_s']:.2f} s"
            if v.get("after_ts_p50_ms") is not None:
                line += f"; from ts (3 subscribers a process) p50/p99 {v['after_ts_p50_ms']}/{v['after_ts_p99_ms']} ms"
            if v["redis_busy"] is not None:
                line += f"; Redis {v['redis_busy'] * 100:.0f}%"
            line += "; cores busy (softirq) " + " ".join(
                f"{c} {b * 100:.0f}% ({v['cores_softirq'][c] * 100:.0f}%)" for c, b in v["cores_busy"].items()
            )
            if not v["connected_before_first_token"]:
                line += "; NOT all connected before the first token"
            line += f"; p99 by round {v['rounds_p99_ms']}"
            details.append(line)
    table(
        [
            "subscribers target",
            "p50 ms",
            "p99 ms",
            "max ms",
            "tokens delivered",
            "complete subs",
            "answer/paced s",
            "CPU us/deliv",
            "server busy",
            "clients busy",
            "parts/sub",
            "met",
        ],
        rows,
    )
    print("  met: every token to every subscriber, p99 < 250 ms, the answer within paced + 1 s, every round")
    for line in details:
        print(line)
    for n, summary in r["sizes"].items():
        if summary["ratios"]:
            print(f"  {int(n):,}:", end="")
            print_ratios(summary["ratios"])
