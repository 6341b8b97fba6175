"""Scenarios 1 and 2: a finished query's log replayed from the start to many subscribers at once,
over SSE (the service, its baseline, bare aiohttp-sse, FastAPI) and over WebSocket (the service,
bare websockets)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

from benchlib.api import client_session, fill_session, poll_all
from benchlib.procs import Meter, wait_until_up
from benchlib.stats import med, ratio
from benchlib.streams import sse_replay, ws_replay

from peers.config import (
    BARE,
    BASELINE,
    FASTAPI,
    NO_MERGE,
    SCRIPTS,
    SERVICE,
    WEBSOCKETS,
    Config,
    installed,
    peer_process,
    server_process,
    service_stack,
    write_json,
)


async def replay_throughput(
    cfg: Config, targets: dict[str, tuple[int, int, Callable[[], Awaitable[int]]]], subscribers: int
) -> dict[str, Any]:
    """Alternating rounds of ``subscribers`` concurrent replays per target.

    ``targets``: name -> (server pid, events expected per subscriber, one replay). A round is as
    many waves of ``subscribers`` replays as fill ``cfg.replay_min_s`` (CPU time is read in 10 ms
    ticks, and one wave of a fast server lasts a fraction of a second).
    """
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in targets}
    for _pid, _expected, one in targets.values():  # warm-up, not measured: first-request costs
        await asyncio.gather(*(one() for _ in range(min(10, subscribers))))
    for _ in range(cfg.rounds):
        for name, (pid, expected, one) in targets.items():
            delivered = waves = 0
            with Meter(pid) as meter:
                started = time.monotonic()
                while waves == 0 or time.monotonic() - started < cfg.replay_min_s:
                    counts = await asyncio.gather(*(one() for _ in range(subscribers)))
                    if sum(counts) != expected * subscribers:
                        raise RuntimeError(
                            f"{name}: {sum(counts)} events delivered, expected {expected * subscribers}"
                        )
                    delivered += sum(counts)
                    waves += 1
            runs[name].append(
                {
                    "events_per_s": delivered / meter.wall,
                    "cpu_us_per_event": meter.server_cpu / delivered * 1e6,
                    "client_busy": meter.client_cpu / meter.wall,
                    "waves": waves,
                }
            )
    return {
        name: {
            "events_per_subscriber": targets[name][1],
            "events_per_s": round(med(r, "events_per_s")),
            "cpu_us_per_event": round(med(r, "cpu_us_per_event"), 2),
            "client_busy": round(med(r, "client_busy"), 2),
            "rounds_events_per_s": [round(x["events_per_s"]) for x in r],
            "rounds_waves": [x["waves"] for x in r],
        }
        for name, r in runs.items()
    }


async def scenario_replay(cfg: Config) -> dict[str, Any]:
    """Replay of ~1,000 events to 100 SSE subscribers: service, baseline, bare aiohttp-sse, FastAPI."""
    result: dict[str, Any] = {"subscribers": cfg.replay_subscribers, "rounds": cfg.rounds, "targets": {}}
    async with contextlib.AsyncExitStack() as stack:
        service = await stack.enter_async_context(service_stack(cfg, NO_MERGE))
        http = await stack.enter_async_context(client_session())
        directory = stack.enter_context(tempfile.TemporaryDirectory())
        session_id, last_id = await fill_session(http, service.url, cfg.replay_tokens)
        events = [
            (e["id"], e["type"], json.dumps(e, separators=(",", ":"), ensure_ascii=False))
            for e in await poll_all(http, service.url, session_id)
        ]
        if len(events) != last_id:
            raise RuntimeError(f"polled {len(events)} events, the log's last id is {last_id}")
        result["events_in_log"] = last_id
        events_file = write_json(directory, "events.json", events)
        peer_file = write_json(directory, "peer.json", {"events": events})
        headers = {"Last-Event-ID": "0"}

        def sse_target(pid: int, expected: int, url: str) -> tuple[int, int, Callable[[], Awaitable[int]]]:
            return pid, expected, lambda: sse_replay(http, url, headers)

        targets = {SERVICE: sse_target(service.pid, last_id, service.url + f"/sessions/{session_id}/events")}
        if cfg.baseline is not None:
            base = await stack.enter_async_context(service_stack(cfg, NO_MERGE, source=cfg.baseline))
            base_session, base_last = await fill_session(http, base.url, cfg.replay_tokens)
            targets[BASELINE] = sse_target(base.pid, base_last, base.url + f"/sessions/{base_session}/events")
        url, pid = stack.enter_context(
            server_process(
                cfg,
                "ceiling",
                lambda port: [
                    sys.executable,
                    str(SCRIPTS / "bench_fanout.py"),
                    "--serve-ceiling",
                    str(port),
                    events_file,
                ],
            )
        )
        await wait_until_up(url + "/healthz")
        targets[BARE] = sse_target(pid, last_id, url + "/replay")
        if installed("fastapi"):
            url, pid = stack.enter_context(peer_process(cfg, "fastapi", peer_file))
            await wait_until_up(url + "/healthz")
            targets[FASTAPI] = sse_target(pid, last_id, url + "/replay")
        result["targets"] = await replay_throughput(cfg, targets, cfg.replay_subscribers)
        if not installed("fastapi"):
            result["targets"][FASTAPI] = "not installed"
    t = result["targets"]
    rate = {name: v["events_per_s"] for name, v in t.items() if isinstance(v, dict)}
    result["ratios"] = {
        "service/bare": ratio(rate.get(SERVICE, 0), rate.get(BARE, 0)),
        "service/fastapi": ratio(rate.get(SERVICE, 0), rate.get(FASTAPI, 0)),
    }
    if BASELINE in rate:
        result["ratios"]["current/baseline"] = ratio(rate[SERVICE], rate[BASELINE])
        result["ratios"]["current/baseline cpu_us_per_event"] = ratio(
            t[SERVICE]["cpu_us_per_event"], t[BASELINE]["cpu_us_per_event"]
        )
    return result


async def scenario_ws(cfg: Config) -> dict[str, Any]:
    """The same replay over the service's /ws and over a bare websockets server."""
    result: dict[str, Any] = {"subscribers": cfg.replay_subscribers, "rounds": cfg.rounds, "targets": {}}
    async with contextlib.AsyncExitStack() as stack:
        service = await stack.enter_async_context(service_stack(cfg, NO_MERGE))
        http = await stack.enter_async_context(client_session())
        directory = stack.enter_context(tempfile.TemporaryDirectory())
        session_id, last_id = await fill_session(http, service.url, cfg.replay_tokens)
        result["events_in_log"] = last_id
        # The service's own frames for this replay, for the peer to send verbatim.
        frames: list[str] = []
        async with http.ws_connect(service.url + "/ws", heartbeat=None) as ws:
            await ws.send_str(json.dumps({"type": "subscribe", "session_id": session_id, "last_event_id": 0}))
            async for message in ws:
                frames.append(message.data)
                if '"type":"done"' in message.data:
                    break
        targets: dict[str, tuple[int, int, Callable[[], Awaitable[int]]]] = {
            SERVICE: (service.pid, last_id, lambda: ws_replay(http, service.url + "/ws", session_id))
        }
        if cfg.baseline is not None:
            base = await stack.enter_async_context(service_stack(cfg, NO_MERGE, source=cfg.baseline))
            base_session, base_last = await fill_session(http, base.url, cfg.replay_tokens)
            targets[BASELINE] = (base.pid, base_last, lambda: ws_replay(http, base.url + "/ws", base_session))
        if installed("websockets"):
            peer_file = write_json(directory, "peer.json", {"ws_frames": frames})
            url, pid = stack.enter_context(peer_process(cfg, "websockets", peer_file))
            await wait_until_up(url)
            targets[WEBSOCKETS] = (pid, last_id, lambda: ws_replay(http, url, session_id))
        result["targets"] = await replay_throughput(cfg, targets, cfg.replay_subscribers)
        if not installed("websockets"):
            result["targets"][WEBSOCKETS] = "not installed"
    t = result["targets"]
    rate = {name: v["events_per_s"] for name, v in t.items() if isinstance(v, dict)}
    result["ratios"] = {"service/websockets": ratio(rate.get(SERVICE, 0), rate.get(WEBSOCKETS, 0))}
    if BASELINE in rate:
        result["ratios"]["current/baseline"] = ratio(rate[SERVICE], rate[BASELINE])
        result["ratios"]["current/baseline cpu_us_per_event"] = ratio(
            t[SERVICE]["cpu_us_per_event"], t[BASELINE]["cpu_us_per_event"]
        )
    return result
