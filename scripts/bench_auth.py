"""Benchmark: what a signed-in user's JWT costs the service per request, against an API key.

    python scripts/bench_auth.py                       # 5,000 requests a credential, 5 rounds
    python scripts/bench_auth.py --requests 1000 --rounds 7 --json

The emulator and the service in their own processes (``benchlib.stack``), the service with
``AGENT_API_KEYS`` and ``AGENT_JWT_SECRET`` both set. Per round, ``--requests`` requests
(``GET /sessions/{id}`` of a session the caller owns: authenticated, then one store read), 10 at
a time, with each credential in turn:

- ``key``: the API key as ``Authorization: Bearer``;
- ``jwt``: one HS256 token for one user, the same on every request (as a browser or an app
  sends it): verified once, then found in the verified tokens the service keeps until expiry;
- ``jwt_fresh``: a new token on every request (every one verified: signature, claims), to show
  what that keeping saves.

The figure is the service's CPU per request (its CPU over the requests, from ``/proc``), medians
over rounds, and each credential's ratio to the key. ``/proc`` counts CPU in 10 ms ticks, 10 µs a
request at 1,000 requests: the default of 5,000 makes a tick 2 µs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import jwt

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib.procs import Meter  # noqa: E402
from benchlib.stack import ServiceStack  # noqa: E402

KEY = "bench-key"
SECRET = "a benchmark secret of at least thirty-two bytes"
CONCURRENCY = 10


def token(sub: str, n: int = 0) -> str:
    claims = {"sub": sub, "exp": int(time.time()) + 3600, "jti": str(n)}
    return jwt.encode(claims, SECRET, algorithm="HS256")


async def owned_session(http: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> str:
    async with http.post(url + "/sessions", json={}, headers=headers) as response:
        assert response.status == 201, await response.text()
        return str((await response.json())["id"])


async def run(http: aiohttp.ClientSession, url: str, headers: list[dict[str, str]]) -> None:
    """One request per entry of ``headers``, ``CONCURRENCY`` at a time; each must be a 200."""
    queue: asyncio.Queue[dict[str, str]] = asyncio.Queue()
    for each in headers:
        queue.put_nowait(each)

    async def worker() -> None:
        while not queue.empty():
            each = queue.get_nowait()
            async with http.get(url, headers=each) as response:
                assert response.status == 200, await response.text()
                await response.read()

    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    env = {"AGENT_API_KEYS": KEY, "AGENT_JWT_SECRET": SECRET, "AGENT_DATABASE_URL": ""}
    figures: dict[str, list[float]] = {"key": [], "jwt": [], "jwt_fresh": []}
    async with ServiceStack(env) as stack, aiohttp.ClientSession() as http:
        keyed = {"Authorization": f"Bearer {KEY}"}
        user = {"Authorization": f"Bearer {token('alice')}"}
        urls = {
            "key": stack.url + "/sessions/" + await owned_session(http, stack.url, keyed),
            "jwt": stack.url + "/sessions/" + await owned_session(http, stack.url, user),
        }
        urls["jwt_fresh"] = urls["jwt"]
        for _ in range(args.rounds):
            for name in figures:
                if name == "key":
                    headers = [keyed] * args.requests
                elif name == "jwt":
                    headers = [user] * args.requests
                else:  # made before the meter starts: only the service's work is counted
                    headers = [{"Authorization": f"Bearer {token('alice', n)}"} for n in range(args.requests)]
                await run(http, urls[name], headers[:50])  # warm: connections, the first verification
                with Meter(stack.pid) as meter:
                    await run(http, urls[name], headers)
                figures[name].append(meter.server_cpu * 1e6 / args.requests)
    medians = {name: round(statistics.median(values), 1) for name, values in figures.items()}
    return {
        "requests": args.requests,
        "rounds": args.rounds,
        "cpu_us_per_request": medians,
        "ratio_to_key": {name: round(value / medians["key"], 3) for name, value in medians.items()},
        "per_round": figures,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = asyncio.run(measure(args))
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print(f"{args.requests} requests a credential, {CONCURRENCY} at a time; medians of {args.rounds} rounds")
    for name, value in result["cpu_us_per_request"].items():
        print(
            f"  {name:<10} {value:8.1f} us of service CPU per request   {result['ratio_to_key'][name]:.2f}x the key"
        )


if __name__ == "__main__":
    main()
