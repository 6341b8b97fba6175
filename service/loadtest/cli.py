"""``agentstream-load`` (``python scripts/loadtest.py``): drive many concurrent clients at a service.

    agentstream-load --clients 100 --count 1000 --mode sse
    agentstream-load --url https://agents.example --api-key KEY --clients 500 --duration 60 --ramp-up 10 --mode mixed
    agentstream-load --mode ws --clients 50 --duration 30 --json > result.json
    agentstream-load --clients 200 --count 2000 --plot latency.png     # pip install 'agentstream[plot]'
    agentstream-load --selftest --selftest-idle-ms 65000                 # does the path buffer, compress, cut?

Modes: ``sse`` (a session per client: ``POST /sessions``, then per query ``POST /sessions/{id}/messages``
and ``GET /sessions/{id}/events`` from the ``after_id`` it returned, read until ``done``/``error``),
``ws`` (one ``GET /ws`` socket per client: ``subscribe`` from id 0, then a ``message`` per query,
frames until ``done``/``error``), ``agent`` (``POST /agent/stream`` per query) and ``mixed`` (the
clients take the three in turn). A client moves to a fresh session every ``--queries-per-session``
queries and deletes the ones it made.

Per query it measures the time to the first text event (TTFT), the gaps between text events and
the time to ``done`` (end to end), from the moment the query is sent; it counts errors by kind
(HTTP status, connection errors, timeouts, ``error`` events by ``code``) and, on the session
streams, event ids lost or repeated (ids must be contiguous; a merged ``assistant_text`` covers
``first_id``..``id``; ``heartbeat`` events have none). The exit status is 0 for a clean run, 1 if
anything failed or an id was lost or repeated.

The answer's pacing is the service's: on the embedded emulator ``AGENT_EMULATOR_TTFT_MS`` and
``AGENT_EMULATOR_TOKENS_PER_SECOND``, or directives in ``--message`` (``[emu:tokens=N]``,
``[emu:ttft=MS]``, ``[emu:tps=N]``).

Before a load run (unless ``--no-selftest``), and alone with ``--selftest``, it reads
``GET /selftest/stream``: timestamped ticks then an idle pause, and says whether something
between it and the service buffers the stream, compresses it or cuts idle streams.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

from service.loadtest.load import run, run_selftest
from service.loadtest.report import format_report
from service.loadtest.run import DEFAULT_MESSAGE, DEFAULT_URL, MODES, Config


def parse_args(argv: list[str] | None = None) -> Config:
    """The command line as a :class:`Config`."""
    parser = argparse.ArgumentParser(
        prog="agentstream-load", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", default=DEFAULT_URL, help=f"the service's base URL (default {DEFAULT_URL})")
    parser.add_argument(
        "--api-key",
        default=os.environ.get("AGENTSTREAM_API_KEY"),
        help="sent as Authorization: Bearer (default $AGENTSTREAM_API_KEY)",
    )
    parser.add_argument(
        "--mode", choices=[*MODES, "mixed"], default="sse", help="what each client does (default sse)"
    )
    parser.add_argument("--clients", type=int, default=10, help="concurrent clients (default 10)")
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument(
        "--count", type=int, help="total queries, shared by the clients (default: one per client)"
    )
    budget.add_argument(
        "--duration", type=float, help="seconds during which each client keeps sending queries"
    )
    parser.add_argument(
        "--ramp-up", type=float, default=0.0, help="seconds over which the clients start (default 0)"
    )
    parser.add_argument("--message", default=DEFAULT_MESSAGE, help=f"the query (default {DEFAULT_MESSAGE!r})")
    parser.add_argument(
        "--timeout", type=float, default=120.0, help="seconds one query may take (default 120)"
    )
    parser.add_argument(
        "--queries-per-session",
        type=int,
        default=10,
        help="sse/ws: queries before a client takes a fresh session (default 10)",
    )
    parser.add_argument("--selftest", action="store_true", help="only check the streaming path, no load")
    parser.add_argument("--no-selftest", action="store_true", help="skip the path check before the load")
    parser.add_argument("--selftest-ticks", type=int, default=20, help="ticks of the path check (default 20)")
    parser.add_argument("--selftest-interval-ms", type=int, default=50, help="ms between ticks (default 50)")
    parser.add_argument(
        "--selftest-idle-ms",
        type=int,
        default=2000,
        help="pause before the last tick, to catch idle cuts (default 2000)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress line")
    parser.add_argument("--json", action="store_true", help="print the report as JSON instead of the table")
    parser.add_argument("--plot", metavar="FILE.png", help="latency over time as a PNG (needs matplotlib)")
    args = parser.parse_args(argv)
    if args.clients < 1:
        parser.error("--clients must be at least 1")
    if args.count is not None and args.count < 0:
        parser.error("--count must not be negative")
    if args.duration is not None and args.duration <= 0:
        parser.error("--duration must be positive")
    if args.queries_per_session < 1:
        parser.error("--queries-per-session must be at least 1")
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            parser.error(
                "--plot needs matplotlib: pip install 'agentstream[plot]' (or pip install matplotlib)"
            )
    return Config(
        url=args.url,
        api_key=args.api_key,
        mode=args.mode,
        clients=args.clients,
        count=args.count,
        duration=args.duration,
        ramp_up=args.ramp_up,
        message=args.message,
        timeout=args.timeout,
        queries_per_session=args.queries_per_session,
        selftest=not args.no_selftest,
        selftest_only=args.selftest,
        selftest_ticks=args.selftest_ticks,
        selftest_interval_ms=args.selftest_interval_ms,
        selftest_idle_ms=args.selftest_idle_ms,
        progress=not args.quiet and sys.stderr.isatty(),
        json=args.json,
        plot=args.plot,
    )


def main(argv: list[str] | None = None) -> int:
    """Command line entry point: 0 for a clean run (or a clean path), 1 otherwise."""
    config = parse_args(argv)
    if config.selftest_only:
        result = asyncio.run(run_selftest(config))
        print(json.dumps(result, indent=2) if config.json else "\n".join(result["lines"]))
        return 1 if result["problems"] else 0
    try:
        report = asyncio.run(run(config))
    except KeyboardInterrupt:
        return 130
    print(json.dumps(report, indent=2) if config.json else format_report(report))
    return 0 if report["clean"] else 1
