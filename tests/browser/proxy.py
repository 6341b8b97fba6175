"""A small reverse proxy between the browser and the service, on a real port, that can misbehave.

It forwards plain HTTP (streaming the answers through chunk by chunk, so an event stream stays
live) and WebSockets (frame by frame, logging what the page sends). A test can

* ``cut()`` the streams and sockets in flight: their browser-side TCP connections are dropped
  without a goodbye, as when a load balancer or a restarting ingress loses them;
* ``outage(kind, attempts)``: answer 503 to the next ``attempts`` connection attempts of a kind
  (``"events"``: an EventSource opening ``/sessions/{id}/events``; ``"ws"``: a WebSocket
  upgrade), and to any other request to the same place meanwhile (a probe with ``fetch``).
  The attempt after them ends the outage; the proxy holds it (``held`` is set) until the test
  calls ``release()``, so the test can look at the page while it waits for that connection,
  sure that nothing reached it since the cut, however slow the machine is.

Every attempt is logged with the time the proxy saw it, so a test can measure the pauses
between them; ``attempted`` and ``held`` are events a test waits on instead of sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

# Headers that describe one hop, not the message (RFC 9110 7.6.1), and the ones aiohttp sets.
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
}
WS_HANDSHAKE = {"sec-websocket-key", "sec-websocket-version", "sec-websocket-extensions"}
ARRIVED = web.RequestKey("arrived", float)


@dataclass
class Attempt:
    """One connection attempt of a watched kind, as the proxy saw it."""

    kind: str  # "events" (an EventSource request) or "ws" (a WebSocket upgrade)
    at: float  # time.monotonic() when it arrived
    status: int  # 503 if refused, else the service's answer (101 for a socket)
    path_qs: str
    last_event_id_header: str | None = None


@dataclass
class Outage:
    kind: str
    attempts: int
    refused: int = 0


@dataclass
class Proxy:
    upstream: str  # the service's base URL, "http://127.0.0.1:PORT"
    attempts: list[Attempt] = field(default_factory=list)
    probes: list[tuple[str, int]] = field(default_factory=list)  # other requests to an events URL
    ws_sent: list[dict[str, Any]] = field(default_factory=list)  # JSON the page sent on sockets
    attempted: asyncio.Event = field(default_factory=asyncio.Event)  # set on every attempt
    held: asyncio.Event = field(default_factory=asyncio.Event)  # the attempt after an outage came
    _release: asyncio.Event = field(default_factory=asyncio.Event)
    _outage: Outage | None = None
    _live: set[asyncio.Transport] = field(default_factory=set)
    _upstreams: set[Any] = field(default_factory=set)
    _client: aiohttp.ClientSession | None = None

    # -- what a test does ------------------------------------------------------------------

    def outage(self, kind: str, attempts: int) -> None:
        """Refuse the next ``attempts`` connection attempts of ``kind`` with 503, then hold the
        one after them until ``release()``."""
        assert kind in {"events", "ws"}
        self._outage = Outage(kind, attempts)
        self.held.clear()
        self._release.clear()

    def release(self) -> None:
        """Let the attempt held after an outage through."""
        self._release.set()

    async def cut(self) -> int:
        """Drop every proxied stream and socket in flight; returns how many were dropped."""
        dropped = len(self._live)
        for transport in list(self._live):
            transport.abort()
        self._live.clear()
        for upstream in list(self._upstreams):
            with contextlib.suppress(Exception):
                if isinstance(upstream, aiohttp.ClientWebSocketResponse):
                    await upstream.close()
                else:
                    upstream.close()
        return dropped

    async def wait_for_attempts(self, kind: str, count: int) -> list[Attempt]:
        """Wait until ``count`` attempts of ``kind`` were logged (no polling with sleep)."""
        while len(self.of(kind)) < count:
            self.attempted.clear()
            await self.attempted.wait()
        return self.of(kind)

    def of(self, kind: str) -> list[Attempt]:
        return [attempt for attempt in self.attempts if attempt.kind == kind]

    # -- the proxy -------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        app.on_startup.append(self._start)
        app.on_shutdown.append(self._shutdown)  # before aiohttp waits for the handlers to end
        app.on_cleanup.append(self._stop)
        return app

    async def _start(self, _: web.Application) -> None:
        self._client = aiohttp.ClientSession(auto_decompress=False)

    async def _shutdown(self, _: web.Application) -> None:
        self._release.set()
        await self.cut()

    async def _stop(self, _: web.Application) -> None:
        if self._client is not None:
            await self._client.close()

    def _kind(self, request: web.Request) -> str | None:
        if request.headers.get("Upgrade", "").lower() == "websocket":
            return "ws"
        if (
            request.method == "GET"
            and request.path.startswith("/sessions/")
            and request.path.endswith("/events")
        ):
            return "events"
        return None

    def _refuse(self, request: web.Request, kind: str | None) -> bool | None:
        """True: the request meets the outage; None: it ends it (hold it); False: pass it on."""
        outage = self._outage
        attempt = kind == "ws" or (
            kind == "events" and "text/event-stream" in request.headers.get("Accept", "")
        )
        if outage is None or kind != outage.kind:
            return False
        if not attempt:
            return True  # a probe of the place that is down meets the same outage
        if outage.refused < outage.attempts:
            outage.refused += 1
            return True
        self._outage = None
        return None

    def _log(self, request: web.Request, kind: str | None, status: int) -> None:
        if kind == "events" and "text/event-stream" not in request.headers.get("Accept", ""):
            self.probes.append((request.path_qs, status))
            return
        if kind is None:
            return
        self.attempts.append(
            Attempt(kind, request[ARRIVED], status, request.path_qs, request.headers.get("Last-Event-ID"))
        )
        self.attempted.set()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        request[ARRIVED] = time.monotonic()
        kind = self._kind(request)
        verdict = self._refuse(request, kind)
        if verdict:
            self._log(request, kind, 503)
            return web.Response(status=503, text="upstream unavailable (test proxy)\n")
        if verdict is None:
            self.held.set()
            await self._release.wait()
        if kind == "ws":
            return await self._websocket(request)
        return await self._http(request, kind)

    def _forward_headers(self, request: web.Request, drop: set[str] = frozenset()) -> dict[str, str]:
        # The Host stays the browser's, as a reverse proxy keeps it, so same-origin checks hold.
        return {
            name: value
            for name, value in request.headers.items()
            if name.lower() not in HOP_BY_HOP and name.lower() not in drop
        }

    async def _http(self, request: web.Request, kind: str | None) -> web.StreamResponse:
        assert self._client is not None
        body = await request.read()
        async with self._client.request(
            request.method,
            self.upstream + request.path_qs,
            headers=self._forward_headers(request),
            data=body or None,
            allow_redirects=False,
        ) as upstream:
            self._log(request, kind, upstream.status)
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for name, value in upstream.headers.items():
                if name.lower() not in HOP_BY_HOP:
                    response.headers.add(name, value)
            await response.prepare(request)
            transport = request.transport
            if transport is not None:
                self._live.add(transport)
            self._upstreams.add(upstream)
            try:
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
            except (aiohttp.ClientError, ConnectionError):
                pass  # cut, or the browser went away
            finally:
                self._upstreams.discard(upstream)
                if transport is not None:
                    self._live.discard(transport)
            return response

    async def _websocket(self, request: web.Request) -> web.StreamResponse:
        assert self._client is not None
        headers = self._forward_headers(request, WS_HANDSHAKE)
        try:
            upstream = await self._client.ws_connect(
                self.upstream.replace("http", "ws", 1) + request.path_qs, headers=headers, autoping=False
            )
        except aiohttp.WSServerHandshakeError as exc:
            self._log(request, "ws", exc.status)
            return web.Response(status=exc.status)
        self._log(request, "ws", 101)
        downstream = web.WebSocketResponse(autoping=False)
        await downstream.prepare(request)
        transport = request.transport
        if transport is not None:
            self._live.add(transport)
        self._upstreams.add(upstream)

        async def browser_to_service() -> None:
            async for message in downstream:
                if message.type == aiohttp.WSMsgType.TEXT:
                    with contextlib.suppress(ValueError):
                        self.ws_sent.append(json.loads(message.data))
                    await upstream.send_str(message.data)
                elif message.type == aiohttp.WSMsgType.BINARY:
                    await upstream.send_bytes(message.data)
                elif message.type == aiohttp.WSMsgType.PING:
                    await upstream.ping(message.data)
                elif message.type == aiohttp.WSMsgType.PONG:
                    await upstream.pong(message.data)

        async def service_to_browser() -> None:
            async for message in upstream:
                if message.type == aiohttp.WSMsgType.TEXT:
                    await downstream.send_str(message.data)
                elif message.type == aiohttp.WSMsgType.BINARY:
                    await downstream.send_bytes(message.data)
                elif message.type == aiohttp.WSMsgType.PING:
                    await downstream.ping(message.data)
                elif message.type == aiohttp.WSMsgType.PONG:
                    await downstream.pong(message.data)
            # The service closed the socket: pass its close code on to the browser.
            await downstream.close(code=upstream.close_code or aiohttp.WSCloseCode.OK)

        pumps = [asyncio.create_task(browser_to_service()), asyncio.create_task(service_to_browser())]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            self._upstreams.discard(upstream)
            if transport is not None:
                self._live.discard(transport)
            await upstream.close()
            if not downstream.closed:
                with contextlib.suppress(Exception):
                    await downstream.close()
        return downstream
