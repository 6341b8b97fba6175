"""The one SSE write path: a face's :class:`Projector` turns log entries into frames, and
:func:`serve` does everything else.

:func:`serve` opens the response (aiohttp-sse's, with the service's ping interval, send timeout and
no-buffering headers; CORS comes from the edge's ``on_response_prepare``), writes the ``retry:``
hint and the projector's head, follows the log, and writes what the projector makes of each batch
in one write. While the client keeps up, live entries go out from the task that appends them
(write-through, see :data:`~service.core.log.Deliver`), a burst of tokens in one write. It also
ends every stream: at the run's end or where the projector stops it (``done``), when the log
closes under it (the session deleted, the server going away), when the reader fell behind the
purge horizon or the shared store went away (the projector says so in its dialect), when the
client goes away (aiohttp cancels the handler; the subscription ends with it), and at shutdown:
a stream that asked for it (``drain=True``) gets what its log holds and a ``retry:`` hint, so its
client reconnects elsewhere at once.

WebSocket and MCP clients follow several logs at once; they are fed by pumps and an outbox
(:mod:`service.transports.stream.pump`) instead.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web
from aiohttp_sse import sse_response

from service.core.events import TextDelta
from service.core.log import EventLog, LogEntry
from service.errors import EventsPurged, StoreUnavailable
from service.metrics import Tally
from service.transports.edge.auth import TOKEN_EXPIRED, at_expiry
from service.transports.edge.context import CONTEXT, Context, context_of
from service.transports.edge.middleware import OPEN_STREAM
from service.transports.stream.follow import Ending, Follower, Stop
from service.transports.stream.frames import SSE_SEP
from service.transports.stream.writes import BurstResponse, write_blocks, write_now

NO_BUFFERING = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class Projector:
    """How one SSE face shows a log: the frames of each entry, and how a stream of it ends.

    A subclass gives :meth:`frames`; the rest has defaults. A projector may keep state (the
    AI SDK's open text part, say): :func:`serve` hands it each entry once, in order.
    """

    __slots__ = ()  # one per open stream: its subclasses keep their state in slots too

    def head(self) -> str:
        """What the stream starts with, before any entry."""
        return ""

    def frames(self, entry: LogEntry) -> bytes:
        """The entry's SSE blocks (``b""`` when the dialect does not show it)."""
        raise NotImplementedError

    def batch(self, entries: list[LogEntry]) -> tuple[bytes, int]:
        """The blocks of several entries, and how many of them showed."""
        parts = [self.frames(entry) for entry in entries]
        return b"".join(parts), sum(1 for part in parts if part)

    def shared_batch(self, entries: list[LogEntry], shared: dict[Any, Any]) -> tuple[bytes, int]:
        """:meth:`batch` of entries handed to many streams at once (see
        :data:`~service.core.direct.DeliverMany`): a projector whose blocks depend on the entries
        alone keeps them in ``shared`` for the other streams of its dialect."""
        return self.batch(entries)

    def shared_texts(
        self,
        entries: list[LogEntry],
        shared: dict[Any, Any],
        block: str | None,
        merged: Callable[[list[LogEntry]], tuple[bytes, int]],
    ) -> tuple[bytes, int]:
        """:meth:`shared_batch` for a dialect whose text deltas inside an open ``block`` (its id;
        None: none is open) change no state: a window of them reads the same for every stream in
        that block, so ``merged`` makes its blocks once. Anything else is each stream's own."""
        if block is None:
            return self.batch(entries)
        key = (type(self), block, entries[0].id)
        made = shared.get(key)
        if made is None:  # False: not texts alone, each stream projects them itself
            made = shared[key] = all(type(entry.event) is TextDelta for entry in entries) and merged(entries)
        return made or self.batch(entries)  # type: ignore[no-any-return]

    def holds(self, entry: LogEntry) -> bool:
        """True for an entry after which :meth:`stops` may end the stream: it is never written
        through, so it reaches :meth:`stops` with its batch."""
        return False

    def stops(self, batch: list[LogEntry]) -> bytes | None:
        """The closing blocks when the stream ends after ``batch`` (before the run's end)."""
        return None

    def heartbeat(self, last_id: int) -> bytes:
        """What an idle stream sends (with ``idle_timeout``)."""
        return b""

    def end(self, ending: Ending | None) -> str:
        """The stream's last blocks: after the run's end, or an unclean ending (purged, store
        gone, log closed) to tell in the dialect; ``None`` when :meth:`stops` ended it."""
        return ""


@contextlib.asynccontextmanager
async def event_stream(
    request: web.Request, context: Context, *, headers: dict[str, str] | None = None, **kwargs: Any
) -> AsyncIterator[BurstResponse]:
    """aiohttp-sse's response with the service's ping interval, send timeout and no-buffering
    headers, registered as the request's open stream (see
    :data:`~service.transports.edge.middleware.OPEN_STREAM`)."""
    settings = context.settings
    async with sse_response(
        request,
        headers={**NO_BUFFERING, **(headers or {})},
        ping_interval=settings.sse_ping_interval_s,
        send_timeout=settings.sse_send_timeout_s,
        response_cls=BurstResponse,
        **kwargs,
    ) as response:
        request[OPEN_STREAM] = response
        yield response


async def serve(
    request: web.Request,
    projector: Projector,
    log: EventLog | None,
    after: int = 0,
    *,
    transport: str,
    stop: Stop = Stop.AT_TERMINAL,
    idle_timeout: float | None = None,
    retry: bool = False,
    drain: bool = False,
    headers: dict[str, str] | None = None,
    allow_all_methods: bool = False,
    sep: str | None = None,
) -> web.StreamResponse:
    """Stream ``log``'s entries after ``after`` through ``projector`` until the following ends.

    ``retry`` starts the stream with the reconnection delay a browser should use; ``idle_timeout``
    sends the projector's heartbeat when nothing came for that long; ``drain`` ends the stream
    at shutdown with what its log holds and a ``retry:`` hint. With ``log`` None the stream is
    its head alone. ``sep`` is the line separator of aiohttp-sse's own writes (its pings).
    """
    context = context_of(request)
    settings = context.settings
    options: dict[str, Any] = {"allow_all_methods": allow_all_methods}
    if sep is not None:
        options["sep"] = sep
    async with event_stream(request, context, headers=headers, **options) as response:
        writer = _Writer(request, response, context, projector, context.metrics.delivered(transport))
        if retry:
            writer.retry = f"retry: {settings.sse_retry_ms}{SSE_SEP}".encode()
        opening = projector.head()
        if opening:
            await writer.write(opening.encode())
        if log is not None:
            follower = Follower(
                log,
                after,
                stop=stop,
                idle_timeout=idle_timeout,
                deliver=writer.deliver,
                deliver_many=writer.deliver_many,
            )
            timer = at_expiry(request, writer.expiry(follower))
            try:
                if drain:
                    await writer.follow_drainable(follower)
                else:
                    await writer.follow(follower)
            finally:
                if timer is not None:
                    timer.cancel()
        elif writer.retry is not None:
            await writer.write(b"")
    return response


class _Writer:
    """One stream's writes: entries written through as they are appended, batches in one write,
    and the ending."""

    __slots__ = (
        "_frames",
        "_holds",
        "cancelled_to_expire",
        "delivered",
        "expired",
        "projector",
        "refused",
        "request",
        "response",
        "retry",
        "settings",
        "transport",
    )

    def __init__(
        self,
        request: web.Request,
        response: BurstResponse,
        context: Context,
        projector: Projector,
        delivered: Tally,
    ) -> None:
        self.request = request
        self.response = response
        # The connection's transport does not change (a closed one says so in is_closing).
        self.transport = request.transport
        self.settings = context.settings
        self.projector = projector
        self.delivered = delivered
        # Entries projected for a write the socket refused (the first's id, how many, their blocks
        # and how many showed): they come again as a batch, and the projector (which may keep
        # state) must not see them twice.
        self.refused: tuple[int, int, bytes, int] | None = None
        # The reconnection delay, to go with the stream's first frame.
        self.retry: bytes | None = None
        # The client's token has expired (see expiry).
        self.expired = False
        self.cancelled_to_expire = False
        # Looked up once: deliver runs per entry and per subscriber, on the appending task.
        self._frames = projector.frames
        self._holds = None if type(projector).holds is Projector.holds else projector.holds

    def deliver(self, entry: LogEntry) -> bool:
        """Write ``entry`` from the appending task if the socket can take it at once."""
        if self.retry is not None or self.expired or (self._holds is not None and self._holds(entry)):
            return False
        data = self._frames(entry)
        if not data:
            return True
        if not write_now(self.request, self.response, data):
            self.refused = (entry.id, 1, data, 1)
            return False
        self.delivered.inc()
        return True

    def deliver_many(self, entries: list[LogEntry], shared: dict[Any, Any]) -> bool:
        """Write ``entries`` (a coalescing window's) in one write from the appending side, if the
        socket can take it at once; their blocks are made once for every stream of the dialect."""
        if self.retry is not None or self.expired:
            return False
        holds = self._holds
        if holds is not None and any(holds(entry) for entry in entries):
            return False
        data, shown = self.projector.shared_batch(entries, shared)
        if not data:
            return True
        transport = self.transport
        if transport is not None and self.response.write_shared(transport, data, shared):
            self.delivered.inc(shown)
            return True
        if not write_now(self.request, self.response, data):
            self.refused = (entries[0].id, len(entries), data, shown)
            return False
        self.delivered.inc(shown)
        return True

    def _project(self, batch: list[LogEntry]) -> tuple[bytes, int]:
        refused = self.refused
        if refused is not None and refused[0] == batch[0].id:
            self.refused = None
            first_id, count, blocks, refused_shown = refused
            data, shown = self.projector.batch(batch[count:])
            return blocks + data, shown + refused_shown
        return self.projector.batch(batch)

    async def write(self, data: bytes) -> None:
        """Write ``data`` (whole blocks) from the handler's task, the ``retry:`` line in the first."""
        if self.retry is not None:
            end = data.find(SSE_SEP.encode() * 2)
            if end < 0:
                data = self.retry + SSE_SEP.encode() + data
            else:
                end += len(SSE_SEP)
                data = data[:end] + self.retry + data[end:]
            self.retry = None
        await write_blocks(self.request, self.response, data, self.settings.sse_send_timeout_s)

    def expiry(self, follower: Follower) -> Callable[[], None]:
        """What ends the stream when the client's token expires: at once if it waits for the log,
        else once the batch in hand is written."""
        task = asyncio.current_task()

        def expire() -> None:
            self.expired = True
            if follower.waiting and task is not None:
                self.cancelled_to_expire = True
                task.cancel(EXPIRED)

        return expire

    async def follow(self, follower: Follower) -> None:
        """Write what the follower reads until it ends, then the projector's end."""
        try:
            ending = await self._follow(follower)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not self.cancelled_to_expire or task is None:
                raise
            self.cancelled_to_expire = False
            task.uncancel()
            ending = self._expired(follower)
        tail = self.projector.end(ending)
        if tail:
            await self.write(tail.encode())

    def _expired(self, follower: Follower) -> Ending:
        return Ending("token_expired", follower.last_id, TOKEN_EXPIRED)

    async def _follow(self, follower: Follower) -> Ending | None:
        """The writes of one following; how it ended (None: the projector stopped it)."""
        projector = self.projector
        async with follower as batches:
            async for batch in batches:
                if not batch:
                    beat = projector.heartbeat(follower.last_id)
                    if beat:
                        await self.write(beat)
                    if self.expired:
                        return self._expired(follower)
                    continue
                rest = batch
                if self.retry is not None:
                    # The first frame goes with the retry hint, on its own: a lagging reader's
                    # batch is merged (see Projector.batch) only after it.
                    data, shown = self._project(batch[:1])
                    await self.write(data)
                    self.delivered.inc(shown)
                    rest = batch[1:]
                data, shown = self._project(rest) if rest else (b"", 0)
                closing = projector.stops(batch)
                if closing is not None:
                    data += closing
                if data:
                    await self.write(data)
                self.delivered.inc(shown)
                if closing is not None:
                    return None
                if self.expired:
                    return self._expired(follower)
        return follower.ending

    async def follow_drainable(self, follower: Follower) -> None:
        """:meth:`follow`, ended at shutdown (see :func:`_drain_streams`) while it waits for
        the log, with what the log holds for this reader and how soon to come back."""
        app = self.request.app
        streams = app[STREAMS]
        task = asyncio.current_task()
        if task is not None:
            streams[task] = follower
        try:
            await self.follow(follower)
        except asyncio.CancelledError:
            if task is None or task not in app[DRAINED]:
                raise  # the client went away
            task.uncancel()
            await self._drain(follower.log, follower.last_id)
        finally:
            streams.pop(task, None)

    async def _drain(self, log: EventLog, last_sent: int) -> None:
        settings = self.settings
        try:
            async with asyncio.timeout(settings.sse_send_timeout_s):
                backlog = await log.read(last_sent, strict=False)
                data = self.projector.batch(backlog)[0] if backlog else b""
                await self.response.write(
                    data + f": server shutting down\nretry: {settings.sse_retry_ms}\n\n".encode()
                )
        except (TimeoutError, ConnectionResetError, StoreUnavailable, EventsPurged):
            pass  # the reader resumes from its last id all the same


DRAIN = "drain"
EXPIRED = "token expired"
# The streams a shutdown ended (by the task, not by the cancellation's message: a library on the
# way, such as a Redis client interrupted mid-command, may raise a CancelledError of its own).
DRAINED = web.AppKey("drained_streams", set)
# The handler tasks of the open drainable streams, with their followers.
STREAMS = web.AppKey("drainable_streams", dict)


async def _drain_streams(app: web.Application) -> None:
    """On shutdown (after every run here wrote its terminal event): end each drainable stream
    that waits for events (a query running on another instance, or one whose end it has yet to
    read) with what its log holds and a ``retry:`` hint, so the client reconnects, elsewhere,
    at once. Only streams suspended waiting are cancelled, so none is cut mid-write."""
    tasks = [task for task, follower in app[STREAMS].items() if follower.waiting]
    for task in tasks:
        app[DRAINED].add(task)
        task.cancel(DRAIN)
    if tasks:
        await asyncio.wait(tasks, timeout=app[CONTEXT].settings.shutdown_timeout_s)


def setup(app: web.Application) -> None:
    """Keep track of the drainable streams, and end them at shutdown."""
    app[STREAMS] = {}
    app[DRAINED] = set()
    app.on_shutdown.append(_drain_streams)
