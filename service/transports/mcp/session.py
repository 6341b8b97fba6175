"""MCP sessions: one per MCP client, with its protocol connection (the SDK's ``ServerRunner``),
the agent sessions it follows, its log level, and the GET stream that carries their events.

The stream is fed like a WebSocket (``transports/stream/pump.py``): a pump per followed session's log,
one outbox, one writer (the GET handler). A position older than the log keeps is reported as an
``error`` notification and skipped: the stream goes on from the oldest event kept.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import mcp_types as types
from aiohttp import web
from mcp.server.connection import Connection
from mcp.server.lowlevel import Server
from mcp.server.runner import ServerRunner, aclose_shielded
from mcp.shared.dispatcher import CallOptions
from mcp.shared.exceptions import NoBackChannelError
from mcp.shared.jsonrpc_dispatcher import progress_token_from_params
from mcp.shared.message import ServerMessageMetadata
from mcp.shared.transport_context import TransportContext

from service import jsonsafe
from service.core.log import LogEntry
from service.core.sessions import Session
from service.errors import SessionLimitReached, SessionNotFound, StoreUnavailable
from service.transports.edge.context import Context
from service.transports.mcp.notifications import (
    event_level,
    format_cursor,
    level_rank,
    log_message,
    notification_data,
)
from service.transports.mcp.tools import build_server
from service.transports.stream.follow import Ending
from service.transports.stream.frames import sse_block
from service.transports.stream.pump import Outbox, Pumps, TooSlow, pump

log = logging.getLogger(__name__)

MAX_FOLLOWED = 32  # agent sessions one MCP session follows; the least recently messaged goes first
QUEUE_BATCHES = 16


# --- the SDK's two channels: a request's exchange, and the connection's standalone stream ---


class _NoRequests:
    """The server sends the client no requests (no sampling, elicitation or roots)."""

    async def send_raw_request(
        self, method: str, params: Mapping[str, Any] | None, opts: CallOptions | None = None
    ) -> dict[str, Any]:
        raise NoBackChannelError(method)


class Exchange(_NoRequests):
    """One POST's channel back to the client (the SDK's ``DispatchContext``).

    In JSON mode nothing but the reply can go back, so notifications are dropped; in SSE mode
    they are written ahead of the reply. The server never sends requests to the client.
    """

    can_send_request = False

    def __init__(
        self, request: web.Request, request_id: types.RequestId | None, params: Mapping[str, Any] | None
    ):
        self.transport = TransportContext(
            kind="streamable-http", can_send_request=False, headers=request.headers
        )
        self.request_id = request_id
        self.message_metadata = ServerMessageMetadata(request_context=request, can_send_request=False)
        self.progress_token = progress_token_from_params(params)
        self.cancel_requested = anyio.Event()
        self.sink: Callable[[str], Awaitable[None]] | None = None

    async def notify(
        self, method: str, params: Mapping[str, Any] | None, opts: CallOptions | None = None
    ) -> None:
        if self.sink is not None:
            message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
            if params is not None:
                message["params"] = dict(params)
            await self.sink(jsonsafe.dumps(message))

    async def progress(self, progress: float, total: float | None = None, message: str | None = None) -> None:
        if self.progress_token is None:
            return
        params: dict[str, Any] = {"progressToken": self.progress_token, "progress": progress}
        if total is not None:
            params["total"] = total
        if message is not None:
            params["message"] = message
        await self.notify("notifications/progress", params)


class StandaloneChannel(_NoRequests):
    """The connection's own outbound channel, which the SDK would use for messages not tied to a
    request. Nothing here sends any (session events go on the stream with log ids), so a message
    that came this way would have no id to resume by: it is refused rather than sent unresumable."""

    async def notify(
        self, method: str, params: Mapping[str, Any] | None, opts: CallOptions | None = None
    ) -> None:
        log.debug("dropped %s: no request to answer it on", method)


# --- MCP sessions ---


@dataclass(eq=False)
class McpSession:
    """One MCP client's state: protocol connection, log level, followed agent sessions."""

    id: str
    owner: str
    context: Context
    server: Server[Any]
    level: str | None = None
    followed: dict[str, int] = field(default_factory=dict)  # agent session -> last id sent
    stream: McpStream | None = None
    last_seen: float = field(default_factory=time.monotonic)
    resumed: int = 0  # GET streams opened with a Last-Event-ID

    def __post_init__(self) -> None:
        self.connection = Connection.for_loop(StandaloneChannel(), session_id=self.id)
        self.runner = ServerRunner(self.server, self.connection, None)
        self.in_flight: dict[types.RequestId, asyncio.Task[Any]] = {}

    def follow(self, session: Session, after: int) -> None:
        """Send this agent session's events after ``after`` on the stream (kept if already followed)."""
        if session.id in self.followed:
            self.followed[session.id] = self.followed.pop(session.id)  # most recent last
        else:
            while len(self.followed) >= MAX_FOLLOWED:
                dropped = next(iter(self.followed))
                self.unfollow(dropped)
            self.followed[session.id] = after
        if self.stream is not None:
            self.stream.start(session.id)

    def unfollow(self, session_id: str) -> None:
        self.followed.pop(session_id, None)
        if self.stream is not None:
            self.stream.stop(session_id)

    def set_level(self, level: str) -> None:
        """``logging/setLevel``: from now on, events at ``level`` and above are sent."""
        self.level = level
        if self.stream is not None:
            self.stream.start_all()

    def wants(self, level: str) -> bool:
        return self.level is not None and level_rank(level) >= level_rank(self.level)

    def attach(self, stream: McpStream) -> None:
        """A new GET stream takes over from the previous one (a client reconnecting)."""
        if self.stream is not None:
            self.stream.close()
        self.stream = stream

    def detach(self, stream: McpStream) -> None:
        if self.stream is stream:
            self.stream = None
        self.last_seen = time.monotonic()

    async def close(self) -> None:
        if self.stream is not None:
            self.stream.close()
        for task in list(self.in_flight.values()):
            task.cancel()
        await aclose_shielded(self.connection)


class McpSessions:
    """This instance's MCP sessions, bounded in number and idle time."""

    def __init__(self, context: Context) -> None:
        self.context = context
        settings = context.settings
        self.max_sessions = settings.mcp_max_sessions
        self.ttl_s = settings.mcp_session_ttl_s
        self.server = build_server(
            session_of=lambda request: request[MCP_SESSION],
            exchange_of=lambda r: r[EXCHANGE],
            tracer=context.tracer,
        )
        self._sessions: dict[str, McpSession] = {}
        self._next_sweep = time.monotonic() + self.ttl_s / 4

    def __len__(self) -> int:
        return len(self._sessions)

    def create(self, owner: str) -> McpSession:
        if len(self._sessions) >= self.max_sessions or time.monotonic() >= self._next_sweep:
            self.expire()
            if len(self._sessions) >= self.max_sessions:
                raise SessionLimitReached("MCP sessions")
        session = McpSession(secrets.token_urlsafe(24), owner, self.context, self.server)
        self._sessions[session.id] = session
        return session

    def get(self, session_id: str, owner: str) -> McpSession | None:
        session = self._sessions.get(session_id)
        if session is None or session.owner != owner:
            return None
        if self._expired(session, time.monotonic()):
            self._drop(session)
            return None
        session.last_seen = time.monotonic()
        return session

    def _expired(self, session: McpSession, now: float) -> bool:
        return session.stream is None and now - session.last_seen > self.ttl_s

    def expire(self) -> None:
        """Drop the sessions idle (with no stream open) for longer than the TTL."""
        now = time.monotonic()
        self._next_sweep = now + self.ttl_s / 4
        for session in [s for s in self._sessions.values() if self._expired(s, now)]:
            self._drop(session)

    def _drop(self, session: McpSession) -> None:
        self._sessions.pop(session.id, None)
        asyncio.get_running_loop().create_task(session.close())

    async def remove(self, session: McpSession) -> None:
        self._sessions.pop(session.id, None)
        await session.close()

    async def close_all(self) -> None:
        sessions, self._sessions = list(self._sessions.values()), {}
        await asyncio.gather(*(session.close() for session in sessions), return_exceptions=True)


MCP_SESSIONS = web.AppKey("mcp_sessions", McpSessions)
MCP_SESSION = web.RequestKey("mcp_session", McpSession)
EXCHANGE = web.RequestKey("mcp_exchange", Exchange)


# --- the GET stream ---


@dataclass
class _Gone:
    reason: str


Item = tuple[str, list[LogEntry] | Ending | _Gone]

_GONE = {"closed": "the session was deleted", "store_unavailable": "session storage is unavailable"}


class McpStream:
    """One open GET stream: a pump per followed session's log into one outbox, one writer."""

    def __init__(self, mcp: McpSession) -> None:
        self.mcp = mcp
        # Bounded in batches; a client that stops reading meets the SSE send timeout first.
        self.outbox: Outbox[Item] = Outbox(QUEUE_BATCHES, put_timeout=mcp.context.settings.sse_send_timeout_s)
        self.pumps = Pumps("mcp-pump")

    @property
    def closed(self) -> bool:
        """True once a newer stream took over, or this one ended."""
        return self.outbox.closed

    def start_all(self) -> None:
        for session_id in list(self.mcp.followed):
            self.start(session_id)

    def start(self, session_id: str) -> None:
        if self.closed or self.mcp.level is None or session_id in self.pumps:
            return
        after = self.mcp.followed.get(session_id)
        if after is None:
            return
        # The position is read now, not when the task first runs: by then it may have moved.
        self.pumps.start(session_id, self._pump(session_id, after))

    def stop(self, session_id: str) -> None:
        self.pumps.stop(session_id)

    def close(self) -> None:
        # What is queued is dropped (a newer stream, or none, takes over) and the writer woken.
        self.outbox.close()
        self.pumps.cancel_all()

    async def _pump(self, session_id: str, after: int) -> None:
        mcp = self.mcp
        try:
            try:
                session = await mcp.context.sessions.get_owned(session_id, mcp.owner)
            except SessionNotFound:
                await self.outbox.put((session_id, _Gone("the session no longer exists")))
                return
            except StoreUnavailable:
                await self.outbox.put((session_id, _Gone(_GONE["store_unavailable"])))
                return
            # A purged stretch is reported and skipped: the stream goes on from the oldest kept.
            await pump(
                session.log,
                after,
                self.outbox,
                lambda batch: [(session_id, batch)],
                end=lambda ending: [(session_id, ending)],
                skip_purged=True,
            )
        except TooSlow:
            pass  # closed under us, or the writer's send timeout ends the stream

    def render(self, item: Item) -> list[str]:
        """The SSE blocks for one queue item; advances the followed positions."""
        mcp = self.mcp
        blocks: list[str] = []
        if self.closed:
            return blocks  # a newer stream took over: the positions are its to move
        session_id, what = item
        if session_id not in mcp.followed:
            return blocks  # unfollowed since the pump read it
        if isinstance(what, list):
            for entry in what:
                mcp.followed[session_id] = entry.id
                data = notification_data(session_id, entry)
                level = event_level(data)
                if mcp.wants(level):
                    blocks.append(sse_block(log_message(level, data), id=format_cursor(mcp.followed)))
            return blocks
        if isinstance(what, Ending) and what.reason == "purged":
            after, oldest = what.last_id, what.oldest_id or what.last_id + 1
            mcp.followed[session_id] = oldest - 1
            data = {
                "session_id": session_id,
                "type": "error",
                "code": "events_purged",
                "message": (
                    f"events after id {after} of session {session_id} were purged (the oldest kept is "
                    f"{oldest}); call session_events with since_index {after} for what is left and a "
                    "snapshot; this stream goes on from the oldest kept event"
                ),
                "recoverable": True,
                "after_id": after,
                "oldest_id": oldest,
                "poll": {"tool": "session_events", "session_id": session_id, "since_index": after},
            }
            if mcp.wants("error"):
                blocks.append(sse_block(log_message("error", data), id=format_cursor(mcp.followed)))
            return blocks
        reason = what.reason if isinstance(what, _Gone) else _GONE.get(what.reason, "the session ended")
        mcp.followed.pop(session_id, None)
        data = {"session_id": session_id, "type": "unfollowed", "message": reason}
        if mcp.wants("warning"):
            blocks.append(sse_block(log_message("warning", data), id=format_cursor(mcp.followed) or None))
        return blocks
