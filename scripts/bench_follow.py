"""Benchmark: what the one subscription path (the Follower) costs per wake-up, against reading the
log's subscription directly as the SSE handler did before it.

    python scripts/bench_follow.py                    # 1,000 subscribers x 200 events, 5 rounds
    python scripts/bench_follow.py --subscribers 5000 --json

In one process, on one core when there is one to pin to: N subscribers follow one in-memory log
while 200 events are appended one by one, each subscriber woken for each event (as in a live
answer). The CPU time per delivery (``time.process_time``) of a subscriber loop that reads
``log.subscribe`` itself, marking itself waiting around each read as the SSE handler's drain
needs, is compared with the same loop over a ``Follower`` (``Stop.AT_REST``, the session stream's
mode). Rounds alternate; medians and the ratio are printed. It measures the path's overhead
alone: no writes, no sockets.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service.core.events import TextDelta  # noqa: E402
from service.core.log import MemoryEventLog  # noqa: E402
from service.transports.stream.follow import Follower, Stop  # noqa: E402

Subscriber = Callable[[MemoryEventLog, int, set[asyncio.Task[None]]], Awaitable[int]]


async def direct(log: MemoryEventLog, events: int, waiting: set[asyncio.Task[None]]) -> int:
    """The loop before the Follower: the log's subscription, read in place."""
    task = asyncio.current_task()
    assert task is not None
    seen = 0
    subscription = log.subscribe(0)
    try:
        while seen < events:
            waiting.add(task)
            try:
                batch = await anext(subscription)
            finally:
                waiting.discard(task)
            seen += len(batch)
    finally:
        await subscription.aclose()
    return seen


async def followed(log: MemoryEventLog, events: int, waiting: set[asyncio.Task[None]]) -> int:
    """The same loop through the Follower."""
    seen = 0
    async with Follower(log, 0, stop=Stop.AT_REST) as batches:
        async for batch in batches:
            seen += len(batch)
            if seen >= events:
                break
    return seen


async def one_round(subscriber: Subscriber, subscribers: int, events: int) -> float:
    """µs of CPU per delivery for one round."""
    log = MemoryEventLog(1024 * 1024 * 1024)
    waiting: set[asyncio.Task[None]] = set()
    tasks = [asyncio.create_task(subscriber(log, events, waiting)) for _ in range(subscribers)]
    await asyncio.sleep(0)  # every subscriber waits on the log
    started = time.process_time()
    for _ in range(events):
        await log.append(TextDelta(text="x"))
        await asyncio.sleep(0)  # each subscriber runs once per event
        await asyncio.sleep(0)
    delivered = sum(await asyncio.gather(*tasks))
    return (time.process_time() - started) / delivered * 1e6


async def run(subscribers: int, events: int, rounds: int) -> dict[str, object]:
    """Alternating rounds of both loops; medians and their ratio."""
    results: dict[str, list[float]] = {"direct": [], "follower": []}
    for _ in range(rounds):
        results["direct"].append(await one_round(direct, subscribers, events))
        results["follower"].append(await one_round(followed, subscribers, events))
    medians = {name: statistics.median(values) for name, values in results.items()}
    return {
        "subscribers": subscribers,
        "events": events,
        "rounds": rounds,
        "us_per_delivery": {name: round(value, 3) for name, value in medians.items()},
        "by_round": {name: [round(v, 3) for v in values] for name, values in results.items()},
        "follower/direct": round(medians["follower"] / medians["direct"], 3),
    }


def main() -> None:
    """Parse the arguments, pin to one core, run, print."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--subscribers", type=int, default=1000)
    parser.add_argument("--events", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) > 1:
        os.sched_setaffinity(0, {cpus[-1]})
    result = asyncio.run(run(args.subscribers, args.events, args.rounds))
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"bench_follow: {result['subscribers']:,} subscribers x {result['events']} events, "
        f"medians of {result['rounds']} alternating rounds, CPU µs per delivery"
    )
    for name, value in result["us_per_delivery"].items():  # type: ignore[union-attr]
        print(f"  {name:<9} {value:>7.3f}   by round {result['by_round'][name]}")  # type: ignore[index]
    print(f"  follower/direct {result['follower/direct']}")


if __name__ == "__main__":
    main()
