"""The two scenarios, run on the same processes: throughput and fan-out."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import aiohttp
from benchlib.api import create_session, post_message, wait_idle
from benchlib.stats import spread

from scaleout.cluster import Cluster, ClusterMeter, Redis
from scaleout.readers import costs, ending, gated, refusals, setup_gate, subscribe, text_events


async def throughput(
    args: argparse.Namespace, cluster: Cluster, redis: Redis | None, http: aiohttp.ClientSession
) -> dict[str, Any]:
    """Many sessions, one unpaced query and one subscriber each, homed and read across instances."""
    urls, count = cluster.urls, len(cluster.urls)
    home = [i % count for i in range(args.sessions)]
    away = [(i + 1) % count for i in range(args.sessions)]
    gate = setup_gate(args)
    ids = await asyncio.gather(
        *(gated(gate, create_session(http, urls[home[i]])) for i in range(args.sessions))
    )
    content = f"[emu:tokens={args.tokens}] [emu:tps=0] [emu:ttft={args.ttft_ms}]"
    with ClusterMeter(cluster, redis) as measured:
        afters = await asyncio.gather(
            *(
                gated(gate, post_message(http, urls[home[i]], ids[i], f"throughput {i} {content}"))
                for i in range(args.sessions)
            )
        )
        readings = await asyncio.gather(
            *(subscribe(http, urls[away[i]], ids[i], afters[i], False, gate) for i in range(args.sessions))
        )
    lasts = await asyncio.gather(*(wait_idle(http, urls[home[i]], ids[i]) for i in range(args.sessions)))
    expected = sum(last - after for last, after in zip(lasts, afters, strict=True))
    endings: dict[str, int] = {}
    for end in await asyncio.gather(
        *(ending(http, urls[home[i]], ids[i], lasts[i]) for i in range(args.sessions))
    ):
        endings[end] = endings.get(end, 0) + 1
    delivered = sum(r.events for r in readings)
    starts = [r.first_text for r in readings if r.first_text is not None]
    ends = [r.last_read for r in readings if r.last_read is not None]
    window = max(ends) - min(starts) if starts and ends else float("nan")
    connected = [r.connected for r in readings if r.connected is not None]
    return {
        "sessions": args.sessions,
        "tokens": args.tokens,
        "events_delivered": delivered,
        "events_expected": expected,
        "query_endings": endings,
        **refusals(readings),
        "subscribers_connected_after_first_token": sum(1 for t in connected if starts and t > min(starts)),
        "window_s": round(window, 3),
        "events_per_s": round(delivered / window) if window > 0 else 0,
        **costs(measured, delivered),
    }


async def fanout(
    args: argparse.Namespace, cluster: Cluster, redis: Redis | None, http: aiohttp.ClientSession
) -> dict[str, Any]:
    """One paced query to many subscribers round-robin over the instances: append-to-read latency."""
    urls, count = cluster.urls, len(cluster.urls)
    session_id = await create_session(http, urls[0])
    step = max(1, args.subscribers // max(1, args.parsed))
    # Subscriber i reads from instance i % count; every step-th on each instance parses.
    plan = [(i % count, (i // count) % step == 0) for i in range(args.subscribers)]
    content = (
        f"fanout [emu:tokens={args.fanout_tokens}] [emu:tps={args.tps}] [emu:ttft={args.fanout_ttft_ms}]"
    )
    with ClusterMeter(cluster, redis) as measured:
        after = await post_message(http, urls[0], session_id, content)
        gate = setup_gate(args)
        readings = await asyncio.gather(
            *(subscribe(http, urls[n], session_id, None, parse, gate) for n, parse in plan)
        )
    last = await wait_idle(http, urls[0], session_id)
    texts = await text_events(http, urls[0], session_id, after)
    end = await ending(http, urls[0], session_id, last)
    parsers = [(n, r) for (n, parse), r in zip(plan, readings, strict=True) if parse]
    latencies = [ms for _, r in parsers for ms in r.latencies]
    first_ts = min((r.first_text for _, r in parsers if r.first_text), default=None)
    connected = [r.connected for r in readings if r.connected is not None]

    def summary(values: list[float]) -> dict[str, float | None] | None:
        return spread(values) if values else None

    delivered = sum(r.events for r in readings)
    result: dict[str, Any] = {
        "subscribers": args.subscribers,
        "parsed": len(parsers),
        "tokens": args.fanout_tokens,
        "tokens_per_second": args.tps,
        "text_events_logged": texts,
        "query_ending": end,
        "events_logged": last - after,
        "events_delivered": delivered,
        **refusals(readings),
        "incomplete_parsers": sum(1 for _, r in parsers if r.texts != texts),
        "subscribers_connected_after_first_token": sum(1 for t in connected if first_ts and t > first_ts),
        "latency_ms": summary(latencies),
        **costs(measured, delivered),
    }
    if count > 1:
        result["latency_ms_by_instance"] = {
            ("run_instance" if n == 0 else f"instance_{n}"): summary(
                [ms for m, r in parsers if m == n for ms in r.latencies]
            )
            for n in range(count)
        }
    return result
