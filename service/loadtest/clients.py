"""The kinds of load client, each a loop of queries until the run's budget is spent.

- ``sse``: a session per client: ``POST /sessions``, then per query ``POST /sessions/{id}/messages``
  and ``GET /sessions/{id}/events`` from the ``after_id`` it returned, read until ``done``/``error``.
- ``ws``: one ``GET /ws`` socket per client: ``subscribe`` from id 0, then a ``message`` per query,
  frames until ``done``/``error``.
- ``agent``: ``POST /agent/stream`` per query.

The session kinds move to a fresh session every ``queries_per_session`` queries, and after a
failure, and delete the ones they made.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

import aiohttp

from service.loadtest.checks import IdCheck, QueryFailed, error_kind, http_error
from service.loadtest.run import JSON_HEADERS, Run
from service.loadtest.sse import SSEParser
from service.loadtest.stats import Probe, now


async def sse_client(run: Run) -> None:
    """Queries on a session, each read from ``GET /sessions/{id}/events``."""
    session_id: str | None = None
    used = 0
    stats = run.stats
    try:
        while run.take():
            if session_id is not None and used >= run.config.queries_per_session:
                await run.delete_session(session_id)
                session_id = None
            probe: Probe | None = None
            ids: IdCheck | None = None
            run.active += 1
            try:
                async with asyncio.timeout(run.config.timeout):
                    if session_id is None:
                        session_id, used = await run.create_session(), 0
                    used += 1
                    probe = Probe(stats)
                    where = f"{run.base}/sessions/{session_id}"
                    async with run.http.post(
                        where + "/messages", data=run.query_body, headers=JSON_HEADERS
                    ) as response:
                        if response.status != 202:
                            raise http_error(response.status, "POST /sessions/{id}/messages")
                        after = int((await response.json())["after_id"])
                    ids = IdCheck(after)
                    async with run.http.get(
                        where + "/events", headers={"Last-Event-ID": str(after)}
                    ) as response:
                        if response.status != 200:
                            raise http_error(response.status, "GET /sessions/{id}/events")
                        await _read_session_sse(run, response, probe, ids)
                failure = None
            except Exception as exc:
                failure = exc
                if session_id is not None:  # start over on a fresh session
                    await run.delete_session(session_id)
                    session_id = None
            finally:
                run.active -= 1
            run.record("sse", probe or Probe(stats), failure, ids)
    finally:
        if session_id is not None:
            await run.delete_session(session_id)


async def _read_session_sse(run: Run, response: aiohttp.ClientResponse, probe: Probe, ids: IdCheck) -> None:
    stats = run.stats
    parser = SSEParser()
    async for chunk in response.content.iter_any():
        at = now()
        events = parser.feed(chunk)
        if not events:
            continue
        counted = 0
        for name, event_id, data in events:
            if name == "heartbeat":
                stats.heartbeats += 1
                continue
            counted += 1
            if event_id is not None:
                last = int(event_id)
                first = last
                if name == "assistant_text" and '"first_id"' in data:
                    first = int(json.loads(data)["first_id"])
                ids.feed(first, last)
            if name == "assistant_text":
                probe.text(at)
            elif name == "done":
                stats.count_events(counted, at)
                probe.end = at
                return
            elif name == "error":
                stats.count_events(counted, at)
                raise QueryFailed(f"error event ({json.loads(data).get('code')})")
        stats.count_events(counted, at)
    raise QueryFailed("stream ended before done")


async def agent_client(run: Run) -> None:
    """Queries through ``POST /agent/stream``, each its own short-lived session."""
    stats = run.stats
    while run.take():
        probe = Probe(stats)
        run.active += 1
        try:
            async with asyncio.timeout(run.config.timeout):
                async with run.http.post(
                    run.base + "/agent/stream", data=run.agent_body, headers=JSON_HEADERS
                ) as response:
                    if response.status != 200:
                        raise http_error(response.status, "POST /agent/stream")
                    await _read_agent_sse(run, response, probe)
            failure = None
        except Exception as exc:
            failure = exc
        finally:
            run.active -= 1
        run.record("agent", probe, failure, None)


async def _read_agent_sse(run: Run, response: aiohttp.ClientResponse, probe: Probe) -> None:
    stats = run.stats
    parser = SSEParser()
    async for chunk in response.content.iter_any():
        at = now()
        events = parser.feed(chunk)
        if not events:
            continue
        stats.count_events(len(events), at)
        for _, _, data in events:
            if data.startswith('{"type":"text_delta"'):  # the common case, without parsing
                probe.text(at)
                continue
            kind = json.loads(data).get("type")
            if kind == "text_delta":
                probe.text(at)
            elif kind == "done":
                probe.end = at
                return
            elif kind == "error":
                raise QueryFailed(f"error event ({json.loads(data).get('code')})")
    raise QueryFailed("stream ended before done")


async def ws_client(run: Run) -> None:
    """Queries on a session over one WebSocket, subscribed from the session's first event."""
    stats = run.stats
    ws: aiohttp.ClientWebSocketResponse | None = None
    session_id: str | None = None
    ids: IdCheck | None = None
    used = 0
    try:
        while run.take():
            if session_id is not None and used >= run.config.queries_per_session:
                if ws is not None and not ws.closed:
                    await ws.send_str(json.dumps({"type": "unsubscribe", "session_id": session_id}))
                await run.delete_session(session_id)
                session_id = None
            probe: Probe | None = None
            run.active += 1
            try:
                async with asyncio.timeout(run.config.timeout):
                    if ws is None or ws.closed:
                        ws = await run.http.ws_connect(run.base + "/ws", max_msg_size=0, autoping=True)
                    if session_id is None:
                        session_id, used = await run.create_session(), 0
                        await ws.send_str(
                            json.dumps({"type": "subscribe", "session_id": session_id, "last_event_id": 0})
                        )
                        ids = IdCheck(0)
                    used += 1
                    probe = Probe(stats)
                    await ws.send_str(
                        json.dumps(
                            {"type": "message", "session_id": session_id, "content": run.config.message}
                        )
                    )
                    assert ids is not None
                    await _read_ws(run, ws, session_id, probe, ids)
                failure = None
            except Exception as exc:
                failure = exc
                if ws is not None:
                    await ws.close()
                    ws = None
                if session_id is not None:
                    await run.delete_session(session_id)
                    session_id = None
            finally:
                run.active -= 1
            run.record("ws", probe or Probe(stats), failure, ids)
    finally:
        if ws is not None:
            await ws.close()
        if session_id is not None:
            await run.delete_session(session_id)


async def _read_ws(
    run: Run, ws: aiohttp.ClientWebSocketResponse, session_id: str, probe: Probe, ids: IdCheck
) -> None:
    stats = run.stats
    loads = json.loads
    while True:
        message = await ws.receive()
        at = now()
        if message.type is not aiohttp.WSMsgType.TEXT:
            code = ws.close_code if message.type is not aiohttp.WSMsgType.ERROR else "error"
            raise QueryFailed(f"websocket closed ({code})")
        frame = loads(message.data)
        if frame.get("session_id") != session_id:
            continue
        kind = frame.get("type")
        event_id = frame.get("id")
        if event_id is None:  # subscribed, accepted, unsubscribed, or a refused command
            if kind == "error":
                raise QueryFailed(f"websocket error ({frame.get('code')})")
            continue
        stats.count_events(1, at)
        ids.feed(frame.get("first_id", event_id), event_id)
        if kind == "assistant_text":
            probe.text(at)
        elif kind == "done":
            probe.end = at
            return
        elif kind == "error":
            raise QueryFailed(f"error event ({frame.get('code')})")


KINDS: dict[str, Callable[[Run], Awaitable[None]]] = {
    "sse": sse_client,
    "ws": ws_client,
    "agent": agent_client,
}


async def client(run: Run, index: int, mode: str) -> None:
    """Client number ``index`` of the run, of kind ``mode``, started at its place in the ramp-up."""
    config = run.config
    if config.ramp_up > 0 and config.clients > 1:
        # Clients start spread evenly over the ramp-up.
        await asyncio.sleep(config.ramp_up * index / config.clients)
    try:
        await KINDS[mode](run)
    except Exception as exc:  # a client's own failure outside a query (should not happen)
        run.stats.errors[error_kind(exc)] += 1
