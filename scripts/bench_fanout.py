"""Benchmark: one session to many SSE subscribers — live latency, idle memory, replay throughput.

    python scripts/bench_fanout.py                    # all three scenarios
    python scripts/bench_fanout.py --only replay --json
    python scripts/bench_fanout.py --baseline main    # each scenario against the service as of main

Processes as in production: the emulator, the service (pointed at the emulator as at Bedrock)
and this client; each scenario starts a fresh service.

- live: 1,000 SSE subscribers on one session while the emulator streams 500 tokens at 50/s.
  Delivery latency = the client's clock at read minus the event's ``ts`` (when the service logged
  it; one clock on one machine). To keep the client from being the bottleneck on two cores, every
  tenth subscriber (100 of them, spread over the connection order) parses every event and the
  others read and discard the bytes.
- idle: 10,000 SSE connections on sessions whose query waits for its first token; the service's
  resident memory per connection.
- replay: a log of about 1,000 events replayed from the start to 100 subscribers, against a bare
  aiohttp-sse handler that sends the same events from a list in another process (the
  framework's ceiling); alternating rounds, medians, and the ratio.

``--baseline GIT_REF`` runs each scenario against the service of this tree (``current``) and the
service as of GIT_REF (``baseline``: a temporary ``git worktree``, the same venv, the same
emulator), one after the other in each of ``--rounds`` rounds, and adds the baseline's figures and,
per figure, a ratio that is above 1 when the current tree is better (``benchlib.baseline``):
the *speed ratio* baseline / current for a cost (latency, CPU), current / baseline for a rate
(events/s), and the *memory ratio* baseline / current bytes per idle connection. With it, live and
idle (once each by default) run ``--rounds`` times per tree, each time on a fresh service, and the
medians are given; replay keeps both services up and adds the baseline to its alternation (each
replays a log filled by its own query, checked against its own event count).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import ROOT  # noqa: E402
from benchlib.api import client_session, fill_session, new_session, poll_all  # noqa: E402
from benchlib.baseline import BASELINE, CURRENT, legend, print_versus, trees, versus  # noqa: E402
from benchlib.procs import Meter, free_port, process, raise_open_file_limit, rss_bytes, wait_until_up  # noqa: E402
from benchlib.stack import ServiceStack  # noqa: E402
from benchlib.stats import median, spread  # noqa: E402
from benchlib.streams import count_id_lines, open_idle_sse, sse_replay  # noqa: E402

from service.loadtest.sse import read_batches  # noqa: E402

# Each scenario's service: room for the idle sessions, every event sent as it is (no merging).
ENV = {"AGENT_MAX_SESSIONS": "100000", "AGENT_MERGE_DELTAS_AFTER": "1000000"}


# -- live ---------------------------------------------------------------------------------------


async def live(args: argparse.Namespace, source: Path = ROOT) -> dict[str, Any]:
    """1,000 subscribers on one paced answer: append-to-client latency (the service from ``source``)."""
    raise_open_file_limit(args.subscribers * 2 + 1024)
    async with ServiceStack(ENV, source=source) as stack:
        async with client_session(total=600) as http:
            session_id = await new_session(
                http, stack.url, f"live [emu:tokens={args.tokens}] [emu:tps={args.tps}] [emu:ttft=3000]"
            )
            latencies: list[float] = []

            async def parse(index: int) -> int:
                count = 0
                async with http.get(stack.url + f"/sessions/{session_id}/events") as response:
                    # Every k-th subscriber parses, so the sample spans the whole connection
                    # order: the service writes an event to its subscribers one after another.
                    if index % max(1, args.subscribers // args.parsed):
                        while await response.content.readany():
                            pass
                        return 0
                    async for batch in read_batches(response.content):
                        now = time.time()
                        for name, _, data in batch:
                            if name == "assistant_text":
                                latencies.append((now - json.loads(data)["ts"]) * 1000)
                                count += 1
                return count

            with Meter(stack.pid) as meter:
                counts = await asyncio.gather(*(parse(i) for i in range(args.subscribers)))
    return {
        "subscribers": args.subscribers,
        "parsed_subscribers": args.parsed,
        "tokens": args.tokens,
        "tokens_per_second": args.tps,
        "text_events_read_by_parsers": sum(counts),
        "latency_ms": spread(latencies),
        "server_cpu_s": round(meter.server_cpu, 2),
    }


# -- idle ---------------------------------------------------------------------------------------


async def idle(args: argparse.Namespace, source: Path = ROOT) -> dict[str, Any]:
    """Many SSE connections waiting for a first token: memory per connection (the service from ``source``)."""
    raise_open_file_limit(args.idle * 2 + 1024)
    async with ServiceStack(ENV, source=source) as stack:
        async with client_session() as http:
            sessions = [
                await new_session(http, stack.url, f"wait {n} [emu:ttft=600000]")
                for n in range(args.idle_sessions)
            ]
            before = rss_bytes(stack.pid)
            urls = [stack.url + f"/sessions/{session_id}/events" for session_id in sessions]
            responses = await open_idle_sse(http, urls, args.idle)
            after = rss_bytes(stack.pid)
            for response in responses:
                response.close()
    return {
        "connections": len(responses),
        "rss_per_connection_bytes": round((after - before) / len(responses)),
    }


# -- replay -------------------------------------------------------------------------------------


def serve_ceiling(port: int, path: str) -> None:
    """A bare aiohttp-sse handler replaying a fixed list of events (run in its own process)."""
    from aiohttp import web
    from aiohttp_sse import sse_response

    events = json.loads(Path(path).read_text())

    async def replay(request: web.Request) -> web.StreamResponse:
        async with sse_response(request) as response:
            for event_id, name, data in events:
                await response.send(data, id=str(event_id), event=name)
        return response

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/replay", replay)
    app.router.add_get("/healthz", health)
    web.run_app(
        app, host="127.0.0.1", port=port, print=lambda *_: None, access_log=None, handler_cancellation=True
    )


async def replay(args: argparse.Namespace, baseline: Path | None = None) -> dict[str, Any]:
    """Replay of ~1,000 events to 100 subscribers: the service against the bare ceiling (and
    against the service from ``baseline``, when given, up beside it)."""
    async with contextlib.AsyncExitStack() as exits:
        stack = await exits.enter_async_context(ServiceStack(ENV))
        http = await exits.enter_async_context(client_session())
        session_id, _ = await fill_session(http, stack.url, args.replay_tokens)
        polled = await poll_all(http, stack.url, session_id)
        events = [(e["id"], e["type"], json.dumps(e, separators=(",", ":"))) for e in polled]
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
            json.dump(events, handle)
        exits.callback(os.unlink, handle.name)
        # name -> (url, headers, server pid, events each subscriber must get)
        targets = {
            "service": (
                stack.url + f"/sessions/{session_id}/events",
                {"Last-Event-ID": "0"},
                stack.pid,
                len(events),
            )
        }
        if baseline is not None:
            # Its own log, from the same query: the baseline may log a query in other events.
            base = await exits.enter_async_context(ServiceStack(ENV, source=baseline))
            base_session, base_last = await fill_session(http, base.url, args.replay_tokens)
            targets[BASELINE] = (
                base.url + f"/sessions/{base_session}/events",
                {"Last-Event-ID": "0"},
                base.pid,
                base_last,
            )
        ceiling_port = free_port()
        ceiling_cmd = [sys.executable, __file__, "--serve-ceiling", str(ceiling_port), handle.name]
        ceiling = exits.enter_context(process(ceiling_cmd))
        await wait_until_up(f"http://127.0.0.1:{ceiling_port}/healthz", child=ceiling)
        targets["bare_aiohttp_sse"] = (
            f"http://127.0.0.1:{ceiling_port}/replay",
            {},
            ceiling.pid,
            len(events),
        )
        rates: dict[str, list[tuple[float, float]]] = {name: [] for name in targets}
        for _ in range(args.rounds):
            for name, (url, headers, pid, expected) in targets.items():
                with Meter(pid) as meter:
                    counts = await asyncio.gather(
                        *(
                            sse_replay(http, url, headers, count_id_lines)
                            for _ in range(args.replay_subscribers)
                        )
                    )
                delivered = sum(counts)
                if delivered != expected * args.replay_subscribers:
                    raise RuntimeError(
                        f"{name}: {delivered} events, expected {expected * args.replay_subscribers}"
                    )
                rates[name].append((delivered / meter.wall, meter.server_cpu / delivered * 1e6))
    result: dict[str, Any] = {
        "events_in_log": len(events),
        "subscribers": args.replay_subscribers,
        "rounds": args.rounds,
    }
    for name, runs in rates.items():
        result[name] = {
            "events_per_s": round(statistics.median(rate for rate, _ in runs)),
            "cpu_us_per_event": round(statistics.median(cost for _, cost in runs), 2),
        }
    result["service_over_ceiling"] = round(
        result["service"]["events_per_s"] / result["bare_aiohttp_sse"]["events_per_s"], 2
    )
    if baseline is not None:
        result[BASELINE]["events_in_log"] = targets[BASELINE][3]
        result["vs_baseline"] = versus(
            result["service"], result[BASELINE], costs=["cpu_us_per_event"], rates=["events_per_s"]
        )
    return result


# -- against a baseline -------------------------------------------------------------------------


def live_figures(run: dict[str, Any]) -> dict[str, Any]:
    """One live run's figures, flat, for the medians over rounds and the comparison."""
    latency = run["latency_ms"]
    return {
        "latency_p50_ms": latency["p50"],
        "latency_p99_ms": latency["p99"],
        "latency_max_ms": latency["max"],
        "server_cpu_s": run["server_cpu_s"],
    }


def medians_of(runs: list[dict[str, Any]], keys: list[str]) -> dict[str, Any]:
    """The median of each figure over rounds."""
    return {key: round(median([run[key] for run in runs if run.get(key) is not None]), 2) for key in keys}


def with_baseline(args: argparse.Namespace, names: list[str], sources: dict[str, Path]) -> dict[str, Any]:
    """Each scenario against the current tree and the baseline, one after the other, per round."""
    result: dict[str, Any] = {}
    for name in names:
        if name == "replay":  # both services up, in the one alternation
            result[name] = asyncio.run(replay(args, sources[BASELINE]))
            continue
        scenario = live if name == "live" else idle
        runs: dict[str, list[dict[str, Any]]] = {tree: [] for tree in sources}
        for _ in range(args.rounds):
            for tree, source in sources.items():
                runs[tree].append(asyncio.run(scenario(args, source)))
        if name == "live":
            keys = ["latency_p50_ms", "latency_p99_ms", "latency_max_ms", "server_cpu_s"]
            figures = {
                tree: medians_of([live_figures(r) for r in rounds], keys) for tree, rounds in runs.items()
            }
            current = runs[CURRENT][0]
            result[name] = {
                **{
                    key: current[key]
                    for key in ("subscribers", "parsed_subscribers", "tokens", "tokens_per_second")
                },
                "rounds": args.rounds,
                "text_events_read_by_parsers": [r["text_events_read_by_parsers"] for r in runs[CURRENT]],
                "latency_ms": {
                    "p50": figures[CURRENT]["latency_p50_ms"],
                    "p99": figures[CURRENT]["latency_p99_ms"],
                    "max": figures[CURRENT]["latency_max_ms"],
                },
                "server_cpu_s": figures[CURRENT]["server_cpu_s"],
                "per_round": runs[CURRENT],
                BASELINE: {**figures[BASELINE], "per_round": runs[BASELINE]},
                "vs_baseline": versus(figures[CURRENT], figures[BASELINE], costs=keys),
            }
        else:
            key = "rss_per_connection_bytes"
            figures = {tree: {key: round(median([r[key] for r in rounds]))} for tree, rounds in runs.items()}
            result[name] = {
                "connections": runs[CURRENT][0]["connections"],
                "rounds": args.rounds,
                key: figures[CURRENT][key],
                "per_round": [r[key] for r in runs[CURRENT]],
                BASELINE: {key: figures[BASELINE][key], "per_round": [r[key] for r in runs[BASELINE]]},
                "vs_baseline": versus(figures[CURRENT], figures[BASELINE], memory=[key]),
            }
    return result


def main() -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", choices=["live", "idle", "replay"], action="append")
    parser.add_argument("--subscribers", type=int, default=1000)
    parser.add_argument(
        "--parsed", type=int, default=100, help="live subscribers that parse every event (spread evenly)"
    )
    parser.add_argument("--tokens", type=int, default=500)
    parser.add_argument("--tps", type=float, default=50.0)
    parser.add_argument("--idle", type=int, default=10_000)
    parser.add_argument("--idle-sessions", type=int, default=10)
    parser.add_argument("--replay-tokens", type=int, default=990)
    parser.add_argument("--replay-subscribers", type=int, default=100)
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="replay's alternating rounds (with --baseline: every scenario's)",
    )
    parser.add_argument(
        "--baseline", metavar="GIT_REF", help="also run every scenario against the service as of this ref"
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--serve-ceiling", nargs=2, metavar=("PORT", "FILE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_ceiling:
        serve_ceiling(int(args.serve_ceiling[0]), args.serve_ceiling[1])
        return
    scenarios = {"live": live, "idle": idle, "replay": replay}
    names = args.only or list(scenarios)
    if args.baseline:
        with contextlib.ExitStack() as exits:
            result = with_baseline(args, names, trees(exits, args.baseline))
        result[BASELINE] = legend(args.baseline)
    else:
        result = {name: asyncio.run(scenarios[name](args)) for name in names}
    if args.json:
        print(json.dumps(result))
        return
    if "live" in result:
        r = result["live"]
        lat = r["latency_ms"]
        print(f"live: {r['subscribers']} SSE subscribers, {r['tokens']} tokens at {r['tokens_per_second']}/s")
        print(f"  append-to-client latency: p50 {lat['p50']} ms, p99 {lat['p99']} ms, max {lat['max']} ms")
        if "vs_baseline" in r:
            print(f"  (medians of {r['rounds']} rounds; service CPU {r['server_cpu_s']} s per round)")
            print_versus(r["vs_baseline"], args.baseline)
    if "idle" in result:
        r = result["idle"]
        print(
            f"idle: {r['connections']:,} SSE connections, {r['rss_per_connection_bytes']:,} bytes of server RSS each"
        )
        if "vs_baseline" in r:
            print(f"  (median of {r['rounds']} rounds, a fresh service each)")
            print_versus(r["vs_baseline"], args.baseline)
    if "replay" in result:
        r = result["replay"]
        print(
            f"replay: {r['events_in_log']} events to {r['subscribers']} subscribers, median of {r['rounds']} rounds"
        )
        for name in ("service", BASELINE, "bare_aiohttp_sse"):
            if name in r:
                label = f"baseline {args.baseline}" if name == BASELINE else name
                print(
                    f"  {label:17} {r[name]['events_per_s']:>9,} events/s, "
                    f"{r[name]['cpu_us_per_event']} us CPU per event"
                )
        print(f"  service / bare aiohttp-sse: {r['service_over_ceiling']}")
        if "vs_baseline" in r:
            print_versus(r["vs_baseline"], args.baseline)


if __name__ == "__main__":
    main()
