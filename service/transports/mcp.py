"""``/mcp``: the MCP Streamable HTTP transport, a third face on the same sessions (seed 004).

- ``POST /mcp``: one JSON-RPC message. ``initialize`` opens an MCP session (``Mcp-Session-Id``
  in the reply); requests are answered with JSON, or with an SSE stream for a
  ``session_message`` that waits for its answer (progress notifications, then the result);
  notifications get 202.
- ``GET /mcp``: the session's stream of server-initiated messages. Once the client has set a
  logging level, every event of each agent session it sent a message to arrives as a
  ``notifications/message`` whose ``data`` is the event (``session_id``, ``id``, ``type``, ...).
- ``DELETE /mcp``: end the MCP session.

The protocol itself (negotiation, validation, the tools) is the official SDK's
:class:`~mcp.server.runner.ServerRunner` over the server built in
:mod:`service.transports.mcp_server`; this module is the HTTP side.

Event ids on the GET stream come from the session event logs. An MCP session may follow several
agent sessions, so an id lists each one's position: ``<session_id>:<event id>``, joined by commas
(one entry when it follows one session). A reconnect with ``Last-Event-ID`` resumes every
followed session after its position. A position older than the log keeps gives, on the stream,
an ``error`` notification with ``code: events_purged`` naming the session and the index to poll
``session_events`` from, and the stream goes on from the oldest event kept.

MCP sessions live in the instance that made them (route ``/mcp`` by ``Mcp-Session-Id`` when
several instances share Redis); the agent sessions they follow are shared as usual. An unknown
or expired MCP session gets 404, which tells an MCP client to initialize again.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, get_args

import anyio
import mcp_types as types
from aiohttp import web
from mcp.server.connection import Connection
from mcp.server.lowlevel import Server
from mcp.server.runner import ServerRunner, aclose_shielded
from mcp.shared.dispatcher import CallOptions
from mcp.shared.exceptions import NoBackChannelError
from mcp.shared.jsonrpc_dispatcher import handler_exception_to_error_data, progress_token_from_params
from mcp.shared.message import ServerMessageMetadata
from mcp.shared.transport_context import TransportContext
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from pydantic import ValidationError

from service import jsonsafe
from service.core.log import LogEntry
from service.core.sessions import Session
from service.errors import SessionLimitReached, SessionNotFound, StoreUnavailable
from service.transports import dialects
from service.transports.auth import owner_of
from service.transports.context import CONTEXT, Context, context_of
from service.transports.follow import Ending
from service.transports.mcp_server import build_server
from service.transports.middleware import error_response
from service.transports.pump import Outbox, Pumps, TooSlow, pump, write_until_closed
from service.transports.sse import event_stream, write_blocks

log = logging.getLogger(__name__)

PATH = "/mcp"
SESSION_HEADER = "Mcp-Session-Id"
VERSION_HEADER = "MCP-Protocol-Version"
DEFAULT_VERSION = "2025-03-26"  # what a request without the header is taken to speak (spec)
LOGGER_NAME = "agentstream"
MAX_FOLLOWED = 32  # agent sessions one MCP session follows; the least recently messaged goes first
LEVELS: tuple[str, ...] = get_args(types.LoggingLevel)  # severity ascending
QUEUE_BATCHES = 16


def level_rank(level: str) -> int:
    """Position of ``level`` on the syslog scale (debug lowest)."""
    return LEVELS.index(level)


def event_level(payload: Mapping[str, Any]) -> str:
    """The log level an event is sent at: errors ``error``, failed tools ``warning``, the rest ``info``
    (partial tool input ``debug``)."""
    kind = payload["type"]
    if kind == "error":
        return "error"
    if kind == "tool_result" and payload.get("isError"):
        return "warning"
    if kind == "tool_input_delta":
        return "debug"
    return "info"


_TOOL_STATUS = {
    "tool_use_start": "started",
    "tool_use": "requested",
    "tool_executing": "executing",
}


def notification_data(session_id: str, entry: LogEntry) -> dict[str, Any]:
    """A log entry as a notification's ``data``: the session-dialect event plus ``session_id``
    (and a ``status`` on tool events)."""
    payload = dialects.session_payload(entry)
    kind = payload["type"]
    if kind in _TOOL_STATUS:
        payload["status"] = _TOOL_STATUS[kind]
    elif kind == "tool_result":
        payload["status"] = "failed" if payload.get("isError") else "completed"
    return {"session_id": session_id, **payload}


def log_message(level: str, data: Mapping[str, Any]) -> str:
    """A ``notifications/message`` JSON-RPC notification, encoded."""
    return dialects.dumps(
        {
            "jsonrpc": "2.0",
            "method": "notifications/message",
            "params": {"level": level, "logger": LOGGER_NAME, "data": data},
        }
    )


def format_cursor(positions: Mapping[str, int]) -> str:
    """The SSE id: each followed session's last event id."""
    return ",".join(f"{session_id}:{event_id}" for session_id, event_id in positions.items())


def parse_cursor(text: str) -> dict[str, int]:
    """The positions in a ``Last-Event-ID``; ValueError if it is not one of ours."""
    positions: dict[str, int] = {}
    for part in text.split(","):
        session_id, sep, number = part.strip().rpartition(":")
        if not sep or not session_id or not number.isdigit():
            raise ValueError(part)
        positions[session_id] = int(number)
    return positions


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
            await self.sink(dialects.dumps(message))

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
            session_of=lambda request: request[MCP_SESSION], exchange_of=lambda r: r[EXCHANGE]
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
                    blocks.append(
                        dialects.sse_block(log_message(level, data), id=format_cursor(mcp.followed))
                    )
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
                blocks.append(dialects.sse_block(log_message("error", data), id=format_cursor(mcp.followed)))
            return blocks
        reason = what.reason if isinstance(what, _Gone) else _GONE.get(what.reason, "the session ended")
        mcp.followed.pop(session_id, None)
        data = {"session_id": session_id, "type": "unfollowed", "message": reason}
        if mcp.wants("warning"):
            blocks.append(
                dialects.sse_block(log_message("warning", data), id=format_cursor(mcp.followed) or None)
            )
        return blocks


# --- HTTP handlers ---


def _rpc_error(
    status: int, code: int, message: str, request_id: types.RequestId | None = None, **headers: str
) -> web.Response:
    body = {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}
    return web.json_response(body, status=status, headers=headers or None)


def _accepts(request: web.Request, media_type: str) -> bool:
    accept = request.headers.get("Accept", "")
    if not accept.strip():
        return True
    kinds = {part.split(";")[0].strip().lower() for part in accept.split(",")}
    return media_type in kinds or "*/*" in kinds or f"{media_type.split('/')[0]}/*" in kinds


def _lookup(request: web.Request) -> McpSession | web.Response:
    session_id = request.headers.get(SESSION_HEADER)
    if not session_id:
        return error_response(400, f"the {SESSION_HEADER} header is required; initialize first")
    session = request.app[MCP_SESSIONS].get(session_id, owner_of(request))
    if session is None:
        return error_response(404, "MCP session not found; initialize a new one")
    version = request.headers.get(VERSION_HEADER)
    if version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS:
        return error_response(
            400,
            f"unsupported {VERSION_HEADER} {version!r}; supported: {', '.join(HANDSHAKE_PROTOCOL_VERSIONS)}",
        )
    return session


async def post(request: web.Request) -> web.StreamResponse:
    """``POST /mcp``: one JSON-RPC request, notification or response."""
    if not (_accepts(request, "application/json") or _accepts(request, "text/event-stream")):
        return error_response(406, "Accept must include application/json and text/event-stream")
    if request.content_type != "application/json":
        return error_response(415, "Content-Type must be application/json")
    raw = await request.read()
    try:
        decoded = jsonsafe.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        return _rpc_error(400, types.PARSE_ERROR, f"Parse error: {exc}")
    if isinstance(decoded, list):
        return _rpc_error(400, types.INVALID_REQUEST, "JSON-RPC batches are not supported; send one message")
    try:
        message = types.jsonrpc_message_adapter.validate_python(decoded, by_name=False)
    except ValidationError:
        return _rpc_error(400, types.INVALID_REQUEST, "Invalid request: not a JSON-RPC 2.0 message")
    registry = request.app[MCP_SESSIONS]
    if isinstance(message, types.JSONRPCRequest) and message.method == "initialize":
        try:
            mcp = registry.create(owner_of(request))
        except SessionLimitReached:
            return _rpc_error(
                503,
                types.INTERNAL_ERROR,
                "the service holds as many MCP sessions as it may",
                message.id,
                **{"Retry-After": "5"},
            )
        response = await _answer(request, mcp, message)
        if response.status >= 400 or not mcp.connection.initialize_accepted:
            await registry.remove(mcp)
        return response
    found = _lookup(request)
    if isinstance(found, web.Response):
        return found
    mcp = found
    if isinstance(message, types.JSONRPCNotification):
        if message.method == "notifications/cancelled":
            request_id = (message.params or {}).get("requestId")
            task = mcp.in_flight.get(request_id) if isinstance(request_id, str | int) else None
            if task is not None:
                task.cancel()
        request[MCP_SESSION] = mcp
        exchange = Exchange(request, None, message.params)
        request[EXCHANGE] = exchange
        await mcp.runner.on_notify(exchange, message.method, message.params)
        return web.Response(status=202)
    if not isinstance(message, types.JSONRPCRequest):
        return web.Response(status=202)  # a response: the server sends no requests, so nothing waits
    return await _answer(request, mcp, message)


def _wants_stream(request: web.Request, message: types.JSONRPCRequest) -> bool:
    params = message.params or {}
    arguments = params.get("arguments")
    return (
        message.method == "tools/call"
        and params.get("name") == "session_message"
        and isinstance(arguments, dict)
        and arguments.get("wait") is True
        and "text/event-stream" in request.headers.get("Accept", "")
    )


async def _answer(request: web.Request, mcp: McpSession, message: types.JSONRPCRequest) -> web.StreamResponse:
    """Run the request through the SDK and reply, as JSON or (for a long wait) as SSE."""
    exchange = Exchange(request, message.id, message.params)
    request[MCP_SESSION] = mcp
    request[EXCHANGE] = exchange
    headers = {SESSION_HEADER: mcp.id}

    async def run() -> dict[str, Any]:
        try:
            result = await mcp.runner.on_request(exchange, message.method, message.params)
        except Exception as exc:  # the SDK's own mapping; anything else is ours and logged
            error = handler_exception_to_error_data(exc)
            if error is None:
                log.exception("MCP %s failed", message.method)
                error = types.ErrorData(code=types.INTERNAL_ERROR, message="internal error")
            return {"jsonrpc": "2.0", "id": message.id, "error": error.model_dump(exclude_none=True)}
        return {"jsonrpc": "2.0", "id": message.id, "result": result}

    if not _wants_stream(request, message):
        reply = await run()
        return web.json_response(reply, headers=headers, dumps=dialects.dumps)
    context = context_of(request)
    async with event_stream(request, context, headers=headers, allow_all_methods=True) as response:
        return await _answer_streaming(request, context, response, mcp, exchange, message, run)


async def _answer_streaming(
    request: web.Request,
    context: Context,
    response: web.StreamResponse,
    mcp: McpSession,
    exchange: Exchange,
    message: types.JSONRPCRequest,
    run: Callable[[], Awaitable[dict[str, Any]]],
) -> web.StreamResponse:
    timeout = context.settings.sse_send_timeout_s

    async def sink(data: str) -> None:
        await write_blocks(request, response, dialects.sse_block(data).encode(), timeout)

    exchange.sink = sink
    task = asyncio.ensure_future(run())
    mcp.in_flight[message.id] = task
    try:
        reply = await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            task.cancel()  # the client went away: stop waiting (the query itself goes on)
            raise
        return response  # the client sent notifications/cancelled: no reply is due
    finally:
        mcp.in_flight.pop(message.id, None)
    exchange.sink = None
    await sink(dialects.dumps(reply))
    return response


def _last_event_id(request: web.Request) -> dict[str, int] | web.Response | None:
    header = request.headers.get("Last-Event-ID", "").strip()
    if not header:
        return None
    try:
        return parse_cursor(header)
    except ValueError:
        return error_response(
            400,
            f"Last-Event-ID {header!r} is not an id of this stream (<session_id>:<event id>, comma-separated)",
        )


async def get(request: web.Request) -> web.StreamResponse:
    """``GET /mcp``: the stream of server-initiated messages, resumable by ``Last-Event-ID``."""
    if not _accepts(request, "text/event-stream"):
        return error_response(406, "Accept must include text/event-stream")
    found = _lookup(request)
    if isinstance(found, web.Response):
        return found
    mcp = found
    positions = _last_event_id(request)
    if isinstance(positions, web.Response):
        return positions
    if positions:
        mcp.resumed += 1
        for session_id, event_id in positions.items():
            if session_id in mcp.followed:
                mcp.followed[session_id] = event_id
    context = context_of(request)
    stream = McpStream(mcp)
    mcp.attach(stream)
    try:
        with context.stream_slot("mcp", owner_of(request)):
            async with event_stream(request, context, headers={SESSION_HEADER: mcp.id}) as response:
                await _stream(request, context, response, stream)
            return response
    finally:
        stream.close()
        mcp.detach(stream)


async def _stream(request: web.Request, context: Context, response: Any, stream: McpStream) -> None:
    settings = context.settings
    mcp = stream.mcp
    # A priming event: the client has an id to resume from before any message.
    await response.send("", id=format_cursor(mcp.followed) or None, retry=settings.sse_retry_ms)
    delivered = context.metrics.events_delivered.labels("mcp")
    stream.start_all()

    async def write(items: list[Item]) -> bool:
        blocks = [block for item in items for block in stream.render(item)]
        if blocks:
            await write_blocks(request, response, "".join(blocks).encode(), settings.sse_send_timeout_s)
            delivered.inc(len(blocks))
        return True

    await write_until_closed(stream.outbox, write)


async def delete(request: web.Request) -> web.Response:
    """``DELETE /mcp``: end the MCP session (the agent sessions it followed stay)."""
    found = _lookup(request)
    if isinstance(found, web.Response):
        return found
    await request.app[MCP_SESSIONS].remove(found)
    return web.Response(status=204)


def add_routes(app: web.Application) -> None:
    """Register ``/mcp`` and the MCP sessions' lifetime."""
    context = app[CONTEXT]
    registry = McpSessions(context)
    app[MCP_SESSIONS] = registry
    context.metrics.track(
        "agentstream_mcp_sessions", "MCP sessions held by this instance.", lambda: len(registry)
    )

    async def close_sessions(app: web.Application) -> None:
        await registry.close_all()

    app.on_shutdown.append(close_sessions)
    app.router.add_post(PATH, post)
    app.router.add_get(PATH, get)
    app.router.add_delete(PATH, delete)
