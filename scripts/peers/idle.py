"""Scenario 5: 10,000 idle SSE and 10,000 idle WebSocket connections, server memory per connection
(the service, bare aiohttp-sse, FastAPI, websockets; a fresh process per round)."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from typing import Any

from benchlib.api import client_session, new_session
from benchlib.procs import rss_bytes, wait_until_up
from benchlib.stats import median, ratio
from benchlib.streams import open_idle_sse, open_idle_ws

from peers.config import (
    BARE,
    FASTAPI,
    SERVICE,
    WEBSOCKETS,
    Config,
    installed,
    peer_process,
    service_stack,
    write_json,
)


async def idle_round(cfg: Config, target: str, directory: str) -> int:
    """A fresh server, ``cfg.idle_connections`` idle connections: its RSS growth per connection."""
    n = cfg.idle_connections
    async with contextlib.AsyncExitStack() as stack:
        http = await stack.enter_async_context(client_session())
        if target.startswith(SERVICE):
            service = await stack.enter_async_context(service_stack(cfg))
            pid = service.pid
            if target.endswith("sse"):
                sessions = [
                    await new_session(http, service.url, f"wait {i} [emu:ttft=600000]") for i in range(10)
                ]
                urls = [service.url + f"/sessions/{s}/events" for s in sessions]
            else:
                ws_session = await new_session(http, service.url)
                ws_url = service.url + "/ws"
        else:
            kind = {BARE: "aiohttp", FASTAPI: "fastapi", WEBSOCKETS: "websockets"}[target]
            peer_file = write_json(directory, "peer.json", {})
            url, pid = stack.enter_context(peer_process(cfg, kind, peer_file))
            await wait_until_up(url if kind == "websockets" else url + "/healthz")
            urls, ws_url, ws_session = [url + "/idle"], url, "idle"
        await asyncio.sleep(0.5)
        before = rss_bytes(pid)
        if target in (WEBSOCKETS, SERVICE + " ws"):
            sockets = await open_idle_ws(http, ws_url, ws_session, n)
            streams = []
        else:
            sockets, streams = [], await open_idle_sse(http, urls, n)
        await asyncio.sleep(0.5)
        after = rss_bytes(pid)
        for ws in sockets:
            await ws.close()
        for response in streams:
            response.close()
    return round((after - before) / n)


async def scenario_idle(cfg: Config) -> dict[str, Any]:
    """10,000 idle SSE and 10,000 idle WebSocket connections: server RSS per connection."""
    targets = {
        "sse": [SERVICE + " sse", BARE] + [FASTAPI] * installed("fastapi"),
        "ws": [SERVICE + " ws"] + [WEBSOCKETS] * installed("websockets"),
    }
    result: dict[str, Any] = {"connections": cfg.idle_connections, "rounds": cfg.rounds, "sse": {}, "ws": {}}
    per: dict[str, list[int]] = {t: [] for ts in targets.values() for t in ts}
    with tempfile.TemporaryDirectory() as directory:
        for _ in range(cfg.rounds):
            for transport_targets in targets.values():
                for target in transport_targets:
                    per[target].append(await idle_round(cfg, target, directory))
    for transport, names in targets.items():
        for target in names:
            name = SERVICE if target.startswith(SERVICE) else target
            result[transport][name] = {
                "rss_bytes_per_connection": round(median(per[target])),
                "rounds": per[target],
            }
    if not installed("fastapi"):
        result["sse"][FASTAPI] = "not installed"
    if not installed("websockets"):
        result["ws"][WEBSOCKETS] = "not installed"
    sse = {k: v for k, v in result["sse"].items() if isinstance(v, dict)}
    ws = {k: v for k, v in result["ws"].items() if isinstance(v, dict)}
    result["ratios"] = {
        "sse service/bare": ratio(
            sse[SERVICE]["rss_bytes_per_connection"], sse[BARE]["rss_bytes_per_connection"]
        ),
        "sse service/fastapi": ratio(
            sse[SERVICE]["rss_bytes_per_connection"], sse.get(FASTAPI, {}).get("rss_bytes_per_connection", 0)
        ),
        "ws service/websockets": ratio(
            ws[SERVICE]["rss_bytes_per_connection"], ws.get(WEBSOCKETS, {}).get("rss_bytes_per_connection", 0)
        ),
    }
    return result
