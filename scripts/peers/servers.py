"""The peers ``bench_peers.py`` measures the service against, each run in a process of its own
(``bench_peers.py --serve-peer KIND PORT FILE``): bare aiohttp-sse, FastAPI + sse-starlette on
uvicorn, and a bare websockets server."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import time
from pathlib import Path
from typing import Any

# When each event of the last broadcast was produced (``time.monotonic()``), for ``GET /times``:
# the live scenario's latency runs from there, as it runs from the emulator's for the service.
PRODUCED: list[float] = []


async def broadcast(
    queues: set[asyncio.Queue[tuple[str, str, str] | None]],
    data: dict[str, Any],
    events: int,
    interval: float,
) -> None:
    """Every ``interval`` seconds one text event, stamped with ``ts``, to every subscriber; then done.

    The k-th event's text is ``data["texts"][k]`` when given (the service's answer, token by
    token), else the template's.
    """
    loop = asyncio.get_running_loop()
    template = data["template"]
    texts = data.get("texts") or [template.get("text", "")] * events
    PRODUCED.clear()
    started = loop.time()
    for k in range(1, events + 1):
        delay = started + (k - 1) * interval - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        PRODUCED.append(time.monotonic())
        payload = {**template, "text": texts[(k - 1) % len(texts)], "id": k, "ts": round(time.time(), 6)}
        item = (str(k), "assistant_text", json.dumps(payload, separators=(",", ":"), ensure_ascii=False))
        for queue in queues:
            queue.put_nowait(item)
    done = json.dumps({"type": "done", "id": events + 1, "ts": round(time.time(), 6)}, separators=(",", ":"))
    for queue in queues:
        queue.put_nowait((str(events + 1), "done", done))
        queue.put_nowait(None)


IDLE_STATUS = json.dumps({"type": "status_change", "status": "running"}, separators=(",", ":"))


def serve_aiohttp(port: int, data: dict[str, Any]) -> None:
    """Bare aiohttp-sse: a broadcast from a queue per subscriber (live) and idle streams."""
    from aiohttp import web
    from aiohttp_sse import sse_response

    subscribers: set[asyncio.Queue[tuple[str, str, str] | None]] = set()
    tasks: set[asyncio.Task[None]] = set()

    async def live(request: web.Request) -> web.StreamResponse:
        queue: asyncio.Queue[tuple[str, str, str] | None] = asyncio.Queue()
        subscribers.add(queue)
        try:
            async with sse_response(request, ping_interval=3600) as response:
                while (item := await queue.get()) is not None:
                    await response.send(item[2], id=item[0], event=item[1])
        finally:
            subscribers.discard(queue)
        return response

    async def idle(request: web.Request) -> web.StreamResponse:
        async with sse_response(request, ping_interval=3600) as response:
            await response.send(IDLE_STATUS, event="status_change")
            await asyncio.get_running_loop().create_future()
        return response

    async def start(request: web.Request) -> web.Response:
        task = asyncio.create_task(
            broadcast(
                subscribers,
                data,
                int(request.query["events"]),
                float(request.query["interval_ms"]) / 1000,
            )
        )
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        return web.json_response({"subscribers": len(subscribers)})

    async def count(request: web.Request) -> web.Response:
        return web.json_response({"subscribers": len(subscribers)})

    async def times(request: web.Request) -> web.Response:
        return web.json_response(PRODUCED)

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/live", live)
    app.router.add_get("/idle", idle)
    app.router.add_post("/start", start)
    app.router.add_get("/count", count)
    app.router.add_get("/times", times)
    app.router.add_get("/healthz", health)
    web.run_app(
        app,
        host="127.0.0.1",
        port=port,
        print=lambda *_: None,
        access_log=None,
        handler_cancellation=True,
        shutdown_timeout=1,
    )


def serve_fastapi(port: int, data: dict[str, Any]) -> None:
    """FastAPI + sse-starlette on uvicorn: replay from a list, live broadcast, idle streams."""
    import uvicorn
    from fastapi import FastAPI
    from fastapi.responses import PlainTextResponse
    from sse_starlette import EventSourceResponse, ServerSentEvent

    events = data.get("events", [])
    subscribers: set[asyncio.Queue[tuple[str, str, str] | None]] = set()
    tasks: set[asyncio.Task[None]] = set()
    app = FastAPI()

    @app.get("/replay")
    async def replay():
        async def stream():
            for event_id, name, payload in events:
                yield ServerSentEvent(data=payload, id=str(event_id), event=name)

        return EventSourceResponse(stream(), ping=3600)

    @app.get("/live")
    async def live():
        queue: asyncio.Queue[tuple[str, str, str] | None] = asyncio.Queue()
        subscribers.add(queue)

        async def stream():
            try:
                while (item := await queue.get()) is not None:
                    yield ServerSentEvent(data=item[2], id=item[0], event=item[1])
            finally:
                subscribers.discard(queue)

        return EventSourceResponse(stream(), ping=3600)

    @app.get("/idle")
    async def idle():
        async def stream():
            yield ServerSentEvent(data=IDLE_STATUS, event="status_change")
            await asyncio.get_running_loop().create_future()

        return EventSourceResponse(stream(), ping=3600)

    @app.post("/start")
    async def start(events: int, interval_ms: float):
        task = asyncio.create_task(broadcast(subscribers, data, events, interval_ms / 1000))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        return {"subscribers": len(subscribers)}

    @app.get("/count")
    async def count():
        return {"subscribers": len(subscribers)}

    @app.get("/times")
    async def times():
        return PRODUCED

    @app.get("/healthz", response_class=PlainTextResponse)
    async def health():
        return "ok"

    http = "httptools" if importlib.util.find_spec("httptools") else "h11"
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        loop="asyncio",  # the same event loop as the service and aiohttp
        http=http,
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=1,
    )


def serve_websockets(port: int, data: dict[str, Any]) -> None:
    """A bare websockets server: the service's replay frames verbatim, or an idle subscription."""
    from websockets.asyncio.server import ServerConnection, serve

    frames: list[str] = data.get("ws_frames", [])

    async def handler(ws: ServerConnection) -> None:
        request = json.loads(await ws.recv())
        if request.get("last_event_id") is None:  # idle: the acknowledgement and the status
            session_id = request.get("session_id")
            await ws.send(json.dumps({"type": "subscribed", "session_id": session_id}, separators=(",", ":")))
            await ws.send(
                json.dumps({"session_id": session_id, **json.loads(IDLE_STATUS)}, separators=(",", ":"))
            )
        else:
            for frame in frames:
                await ws.send(frame)
        await ws.wait_closed()

    async def main() -> None:
        async with serve(handler, "127.0.0.1", port, compression=None, max_size=2**20) as server:
            await server.serve_forever()

    asyncio.run(main())


def serve_peer(kind: str, port: int, path: str) -> None:
    """Run one peer server until terminated."""
    data = json.loads(Path(path).read_text())
    {"aiohttp": serve_aiohttp, "fastapi": serve_fastapi, "websockets": serve_websockets}[kind](port, data)
