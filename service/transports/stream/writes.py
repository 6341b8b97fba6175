"""Writing to an SSE response from the task that appends to a log, and in batches from the
handler's own: without waiting while the socket can take the bytes, with aiohttp-sse's timeout
once it cannot, and during a :class:`~service.core.burst.Burst` one write for all its tokens."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from aiohttp import web
from aiohttp_sse import EventSourceResponse

from service.core.burst import Burst, current_burst


class Pings:
    """The keep-alive pings of every open SSE stream of an app, from one timer.

    aiohttp-sse pings from a task of each stream's own, sleeping between pings: with ten thousand
    idle streams, ten thousand tasks, each with its coroutine, its future and its timer, for a
    line every few seconds (measured: docs/benchmarks.md, section Ten thousand viewers). Here one
    timer writes each stream's ping as :func:`write_now` writes an event; a stream whose socket
    has a backlog skips it (it is not idle), and a peer that stops acknowledging is still cut by
    the kernel's ``TCP_USER_TIMEOUT`` that aiohttp-sse sets.
    """

    __slots__ = ("_handle", "_interval", "_streams")

    def __init__(self, interval: float) -> None:
        self._interval = interval
        self._streams: dict[BurstResponse, web.Request] = {}
        self._handle: asyncio.TimerHandle | None = None

    def add(self, response: BurstResponse, request: web.Request) -> None:
        self._streams[response] = request
        if self._handle is None:
            self._handle = asyncio.get_running_loop().call_later(self._interval, self._ping)

    def discard(self, response: BurstResponse) -> None:
        self._streams.pop(response, None)
        if not self._streams and self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _ping(self) -> None:
        self._handle = None
        for response, request in list(self._streams.items()):
            write_now(request, response, response.ping_line)
        if self._streams:
            self._handle = asyncio.get_running_loop().call_later(self._interval, self._ping)


PINGS = web.AppKey("sse_pings", dict)  # ping interval -> the app's Pings for it


class BurstResponse(EventSourceResponse):
    """aiohttp-sse's response, able to hold what :func:`write_now` writes during a
    :class:`~service.core.burst.Burst` (the tokens of one upstream read) and send it in one write
    when the burst ends. Any other write sends what is held first, so the order stays whoever
    writes next (the handler's own task, a ping). Its pings come from the app's :class:`Pings`
    rather than from a task of its own."""

    _held: list[bytes] | None = None
    held_size = 0
    _pings: Pings | None = None
    _streaming = False
    # The headers are out and the body is chunked and not compressed, until the end is written:
    # a chunk can go straight to the transport (see write_chunk).
    _chunks_direct = False

    async def prepare(self, request: web.BaseRequest) -> Any:
        """aiohttp-sse's prepare, without its ping task."""
        if self.prepared:
            return await super().prepare(request)  # aiohttp-sse's check that the client is there
        if not self._allow_all_methods and request.method != "GET":
            raise web.HTTPMethodNotAllowed(request.method, ("GET",))
        self._set_tcp_user_timeout(request)
        writer = await web.StreamResponse.prepare(self, request)
        self.enable_chunked_encoding()
        # A StreamResponse's prepare sends the headers (aiohttp buffers them only for a Response).
        self._chunks_direct = bool(getattr(writer, "chunked", False)) and not self.compression
        pings = request.app.get(PINGS)
        if pings is not None:  # the app registered the key (service.app); else no pings
            self._pings = pings.get(self._ping_interval) or pings.setdefault(
                self._ping_interval, Pings(self._ping_interval)
            )
            self._pings.add(self, request)  # type: ignore[arg-type]
        self._streaming = True
        return writer

    @property
    def ping_line(self) -> bytes:
        return f": ping{self._sep}{self._sep}".encode()

    def is_connected(self) -> bool:
        return self.prepared and self._streaming

    def stop_streaming(self) -> None:
        self._streaming = False
        if self._pings is not None:
            self._pings.discard(self)

    async def wait(self) -> None:
        """Nothing to wait for: no ping task (aiohttp-sse's context awaits it at its end)."""

    def hold(self, request: web.Request, payload: bytes, burst: Burst) -> None:
        """Keep ``payload`` until ``burst`` ends (or the next write, if that comes first)."""
        held = self._held
        if held is None:
            held = self._held = []
        if not held:
            burst.on_end(lambda: self._flush_held(request))
        held.append(payload)
        self.held_size += len(payload)

    def _take_held(self) -> bytes:
        held = self._held or []
        data = held[0] if len(held) == 1 else b"".join(held)
        held.clear()
        self.held_size = 0
        return data

    def _flush_held(self, request: web.Request) -> None:
        if self._held:
            transport = request.transport
            if transport is None or transport.is_closing():  # the client is gone
                self._take_held()
            elif not self.write_chunk(transport, b""):
                _hand_over(self, self._take_held())

    def write(self, data: bytes) -> Coroutine[Any, Any, None]:  # type: ignore[override]
        # aiohttp's own coroutine, not one more around it: this is per token.
        if self._held:
            data = self._take_held() + data
        return super().write(data)

    def write_chunk(self, transport: asyncio.Transport, data: bytes) -> bool:
        """Hand ``data`` to ``transport`` as one chunk of the body, what is held first; False
        when the response cannot take it that way (it was not prepared so, or it has ended).

        aiohttp's ``write`` does the same through a coroutine and three calls that count the
        bytes for its own drain, which :func:`write_now` does not need (it writes only into a
        buffer with room): with ten thousand streams written several times a second, those
        calls were a third of the service's time in Python (measured: docs/benchmarks.md,
        section Ten thousand viewers).
        """
        if not self._chunks_direct:
            return False
        if self._held:
            data = self._take_held() + data
        if data:
            transport.write(_chunk(data))
        return True

    def write_shared(self, transport: asyncio.Transport, data: bytes, shared: dict[Any, Any]) -> bool:
        """:meth:`write_chunk` for the bytes of a coalescing window (``shared``, see
        :data:`~service.core.direct.DeliverMany`): the chunk is framed once for every stream
        given the same bytes. False, having written nothing, unless the socket can take it at
        once and nothing is held (then :func:`write_now` decides).

        A window hands the same bytes to each of thousands of streams, and this is each one's
        whole write: framing the chunk and the calls of :func:`write_now` for each were a fifth
        of the service's CPU at 10,000 viewers (docs/benchmarks.md, section Ten thousand viewers).
        """
        if not self._chunks_direct or self._held or not takes_at_once(transport, len(data)):
            return False
        key = (_chunk, data)  # the same object for every stream: hashed once
        chunk = shared.get(key)
        if chunk is None:
            chunk = shared[key] = _chunk(data)
        transport.write(chunk)
        return True

    async def write_eof(self, data: bytes = b"") -> None:
        self._chunks_direct = False
        if self._held:
            data = self._take_held() + data
        await super().write_eof(data)


UNTIMED_WRITE_BYTES = 32 * 1024


def takes_at_once(transport: asyncio.WriteTransport, size: int) -> bool:
    """True when ``transport`` is open and ``size`` more bytes keep its buffer under
    :data:`UNTIMED_WRITE_BYTES`: a write of them is handed over without waiting."""
    return not transport.is_closing() and transport.get_write_buffer_size() + size < UNTIMED_WRITE_BYTES


def _chunk(data: bytes) -> bytes:
    """``data`` as one chunk of a chunked HTTP/1.1 body."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def _cannot_wait(request: web.Request, size: int) -> bool:
    """True when writing ``size`` bytes cannot wait for the socket: its buffer, with them, stays
    under :data:`UNTIMED_WRITE_BYTES`."""
    transport = request.transport
    return transport is not None and transport.get_write_buffer_size() + size < UNTIMED_WRITE_BYTES


def write_now(request: web.Request, response: web.StreamResponse, payload: bytes) -> bool:
    """Write ``payload`` at once, without waiting, if the socket can take it: False if not.

    This is what a :data:`~service.core.log.Deliver` writes with, on the task that appends. With
    the socket's buffer under :data:`UNTIMED_WRITE_BYTES` (half the transport's high-water mark)
    aiohttp's ``write`` hands the bytes to the transport and returns without suspending, so it
    is run to its end here rather than awaited. During a :class:`~service.core.burst.Burst` (the
    tokens of one upstream read) a :class:`BurstResponse` holds the bytes instead and writes them
    all when the burst ends. A write refused (a closing socket, a backlog) writes nothing: the
    handler's own task then writes it, with the timeout and errors of :func:`write_blocks`.
    """
    transport = request.transport
    if transport is None or transport.is_closing():
        return False
    room = UNTIMED_WRITE_BYTES - transport.get_write_buffer_size() - len(payload)
    burst = current_burst()
    if burst is not None and isinstance(response, BurstResponse):
        if response.held_size >= room:
            return False
        response.hold(request, payload, burst)
        return True
    if room <= 0:
        return False
    if isinstance(response, BurstResponse) and response.write_chunk(transport, payload):
        return True
    return _hand_over(response, payload)


def _hand_over(response: web.StreamResponse, payload: bytes) -> bool:
    """Hand ``payload`` to an open transport without waiting (see :func:`write_now`); False if
    nothing was written."""
    write = response.write(payload)
    try:
        write.send(None)
    except StopIteration:
        return True
    except Exception:
        return False  # nothing was written (the response ended, say): the handler meets it too
    # It stopped to wait for the socket to drain, after handing the bytes over: they are out, and
    # the handler's next write waits for the drain instead.
    write.close()
    return True


async def write_blocks(
    request: web.Request, response: EventSourceResponse, payload: bytes, timeout: float
) -> None:
    """Write several SSE blocks at once, with aiohttp-sse's rules for a client that stalls.

    One write per batch of events instead of one per event: a batch costs a subscriber one
    syscall at most, which is what lets one process feed thousands of them. While the socket's
    buffer is nearly empty the write cannot wait (asyncio pauses a writer only past its buffer's
    high-water mark, 64 KiB), so no timer is armed; a client that stops reading fills the buffer
    and then meets the timeout.
    """
    if _cannot_wait(request, len(payload)):
        await response.write(payload)
        return
    try:
        async with asyncio.timeout(timeout):
            await response.write(payload)
    except ConnectionResetError:
        response.stop_streaming()
        raise
    except TimeoutError:
        # A stalled peer never drains the buffer; abort rather than wait on a graceful close.
        response.stop_streaming()
        if request.transport is not None:
            request.transport.abort()
        raise
