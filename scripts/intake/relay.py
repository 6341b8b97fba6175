"""The floor of ``bench_concurrency.py --paced``: a bare aiohttp relay, frames in, SSE out, nothing else.

    python scripts/intake/relay.py --port 8090 --upstream http://127.0.0.1:8081

For each ``POST /agent/stream`` (``{"message": ...}``) it opens the upstream's Bedrock
ConverseStream over HTTP with plain aiohttp (no botocore client, no signing, no retries), cuts the
event stream into frames with botocore's ``EventStreamBuffer`` (the decoder the service's Bedrock
path uses too) and writes one SSE ``data:`` event per text delta, in the service's own agent
dialect (``{"type":"text_delta","text":...}``, then ``{"type":"done"}``), so that the client reads
the same bytes from both. The frames of one network read go out in one write. No session, no log,
no agent loop: what is left is what aiohttp and the event-stream decoding cost.

``GET /healthz?lag_since=`` reports its event-loop lag with the service's own monitor, so that the
benchmark measures both the same way.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import aiohttp
from aiohttp import web
from botocore.eventstream import EventStreamBuffer

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(1, str(ROOT))
from service.monitor import LoopLagMonitor  # noqa: E402
from service.workers import LISTEN_BACKLOG  # noqa: E402

UPSTREAM = web.AppKey("upstream", str)
HTTP = web.AppKey("http", aiohttp.ClientSession)
MONITOR = web.AppKey("monitor", LoopLagMonitor)
DONE = b'data: {"type":"done"}\n\n'


def sse(payload: dict[str, object]) -> bytes:
    """One SSE event carrying ``payload`` as compact JSON."""
    return b"data: " + json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


async def agent_stream(request: web.Request) -> web.StreamResponse:
    """``POST /agent/stream``: the upstream's text deltas as SSE, then ``done``."""
    message = (await request.json())["message"]
    body = {"messages": [{"role": "user", "content": [{"text": message}]}]}
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    url = request.app[UPSTREAM] + "/model/relay/converse-stream"
    async with request.app[HTTP].post(url, json=body) as upstream:
        if upstream.status != 200:
            await response.write(sse({"type": "error", "status": upstream.status}))
            return response
        frames = EventStreamBuffer()
        async for chunk in upstream.content.iter_any():
            frames.add_data(chunk)
            out = []
            for frame in frames:
                headers = frame.headers
                if headers.get(":message-type") == "exception":
                    out.append(sse({"type": "error", "error": headers.get(":exception-type")}))
                    await response.write(b"".join(out))
                    return response
                if headers.get(":event-type") == "contentBlockDelta":
                    text = json.loads(frame.payload)["delta"].get("text")
                    if text is not None:
                        out.append(sse({"type": "text_delta", "text": text}))
            if out:
                await response.write(b"".join(out))
    await response.write(DONE)
    await response.write_eof()
    return response


async def healthz(request: web.Request) -> web.Response:
    """``GET /healthz``: the loop lag (since ``lag_since``, a ``time.monotonic()`` reading)."""
    since = float(request.query["lag_since"]) if "lag_since" in request.query else None
    return web.json_response({"status": "ok", "loop_lag_ms": request.app[MONITOR].summary(since)})


async def start(app: web.Application) -> None:
    """Open the upstream connection pool and start the lag monitor.

    No limit, and idle connections kept (aiohttp's default drops one idle for 15 s), as the
    service's pool keeps them a minute: between its batches the relay waits while the other
    targets run.
    """
    app[HTTP] = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=3600),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
    )
    app[MONITOR].start()


async def stop(app: web.Application) -> None:
    """Close what :func:`start` opened."""
    await app[MONITOR].stop()
    await app[HTTP].close()


def main() -> None:
    """Serve until terminated."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="the emulator's base URL")
    args = parser.parse_args()
    app = web.Application()
    app[UPSTREAM] = args.upstream.rstrip("/")
    app[MONITOR] = LoopLagMonitor()
    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    app.router.add_post("/agent/stream", agent_stream)
    app.router.add_get("/healthz", healthz)
    web.run_app(
        app,
        host="127.0.0.1",
        port=args.port,
        backlog=LISTEN_BACKLOG,  # the service's own: a burst of connections is not dropped
        # One line once the socket listens (what a test waits for), flushed into a pipe.
        print=lambda message: print(message.splitlines()[0].strip("= "), flush=True),
        access_log=None,
        handler_cancellation=True,
        shutdown_timeout=1,
    )


if __name__ == "__main__":
    main()
