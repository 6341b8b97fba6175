"""The whole path through a real service process: its CPU time per token delivered.

The emulator runs in a process of its own (paced like a model), so the service's CPU (from
/proc, every thread) is the service's alone: the model stream's read and decode, the parser,
the run, the log, the projection and the write to one SSE subscriber per session.
"""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path
from typing import Any

from benchlib.api import client_session, create_session, post_message
from benchlib.procs import Meter
from benchlib.stack import ServiceStack
from benchlib.streams import count_frames


async def _one(http: Any, url: str, tokens: int) -> int:
    session_id = await create_session(http, url)
    after = await post_message(http, url, session_id, f"budget [emu:tokens={tokens}]")
    async with http.get(
        url + f"/sessions/{session_id}/events", headers={"Last-Event-ID": str(after)}
    ) as response:
        if response.status != 200:
            raise RuntimeError(f"GET /sessions/{{id}}/events: HTTP {response.status}")
        return await count_frames(response.content)


async def end_to_end(
    source: Path,
    *,
    store: str,
    provider: str,
    sessions: int,
    tokens: int,
    tps: float,
    ttft_ms: float,
    redis_url: str | None,
) -> dict[str, Any]:
    """One round: ``sessions`` queries of ``tokens`` paced tokens at once, each followed by one SSE
    subscriber, on a fresh service from ``source``; the service's CPU µs per token."""
    env = {"AGENT_PROVIDER": provider}
    prefix = ""
    if store == "redis":
        prefix = f"bench-tokens-e2e-{secrets.token_hex(4)}"
        env |= {"AGENT_REDIS_URL": redis_url or "", "AGENT_REDIS_PREFIX": prefix}
    emulator_args = ["--ttft-ms", str(ttft_ms), "--tokens-per-second", str(tps)]
    try:
        async with ServiceStack(env, source=source, emulator_args=emulator_args) as stack:
            async with client_session(total=300) as http:
                await _one(http, stack.url, 5)  # warm: the model client, the code paths
                with Meter(stack.pid) as meter:
                    events = await asyncio.gather(*(_one(http, stack.url, tokens) for _ in range(sessions)))
    finally:
        if prefix:
            await _delete_prefix(redis_url or "", prefix)
    delivered = sum(events)
    return {
        "us_per_token": round(meter.server_cpu * 1e6 / (sessions * tokens), 2),
        "events_delivered": delivered,
        "wall_s": round(meter.wall, 2),
    }


async def _delete_prefix(url: str, prefix: str) -> None:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(url)
    async with client:
        keys = [key async for key in client.scan_iter(match=f"{prefix}*", count=500)]
        if keys:
            await client.unlink(*keys)
