"""WebSocket transport, ``GET /ws``: the same sessions, events and ids as SSE, on the same core.

One socket follows many sessions. The handler owns its read loop and hands commands to the
core; each subscription is a task that reads the session's log (the same ``subscribe`` the SSE
handler uses) and puts frames in the socket's bounded outbox, which one writer task drains.
A client that stops reading fills the outbox; once a frame has waited ``AGENT_WS_SEND_TIMEOUT_S``
for room, the socket is closed with 1013 and memory stays flat; the client resumes with
``last_event_id``. Bad messages get ``{"type": "error", ...}`` and the socket stays open;
binary frames close it with 1003; oversized ones with 1009 (aiohttp's ``max_msg_size``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web

from service import jsonsafe
from service.core.agents import chosen
from service.core.log import LogEntry
from service.core.run_state import Run
from service.core.sessions import Session
from service.core.traces import NO_TRACER
from service.core.wakeup import Wakeup
from service.errors import (
    ApprovalError,
    ConversationError,
    Overloaded,
    QuotaExceeded,
    RunInProgress,
    SessionLimitReached,
    SessionNotFound,
    StoreUnavailable,
    UnknownAgent,
)
from service.transports.edge import actions, approvals
from service.transports.edge.auth import TOKEN_EXPIRED, at_expiry, origin_allowed, owner_of
from service.transports.edge.context import Context, context_of
from service.transports.edge.inputs import MessageRequest, ToolResultRequest
from service.transports.edge.middleware import unavailable_reply
from service.transports.edge.quotas import quota_fields
from service.transports.stream.follow import Ending, Stop
from service.transports.stream.pump import Outbox, Pumps, TooSlow, pump
from service.transports.stream.reading import purged_body
from service.transports.stream.session import merge_text_runs, session_frame, ws_frame
from service.transports.ws.direct import SocketWrites
from service.transports.ws.messages import (
    ClientError,
    check_meta,
    optional_int,
    optional_str,
    parsed,
    required_str,
    validated,
)
from service.transports.ws.tracing import TRACED, message_span, refused, upgrade_parent

log = logging.getLogger(__name__)

TRY_AGAIN_LATER = 1013
TOKEN_EXPIRED_CLOSE = 4401  # like HTTP's 401: come back with a fresh token
SOCKETS = web.AppKey("ws_sockets", set)


class Connection:
    """One WebSocket client: its subscriptions, its short-lived runs, and its outbox."""

    def __init__(
        self,
        ws: web.WebSocketResponse,
        context: Context,
        owner: str,
        upgrade: Mapping[str, str],
        transport: Any = None,
    ) -> None:
        self.ws = ws
        # The parent of the messages' spans that name none in their ``_meta``; None: traces off.
        self.trace_parent = None if context.tracer is NO_TRACER else upgrade_parent(upgrade)
        self.context = context
        self.owner = owner
        self._delivered = context.metrics.delivered("ws")
        settings = context.settings
        self.send_timeout = settings.ws_send_timeout_s
        # Its writer runs only while frames wait: an idle socket holds no task of its own.
        self.outbox: Outbox[str] = Outbox(
            settings.ws_send_queue, self.send_timeout, on_full=self.close_slow, write=self._write
        )
        self.direct = SocketWrites(ws, transport, self.outbox.qsize)
        self.draining = False
        self.pumps = Pumps("ws-sub")
        self.sessions: dict[str, Session] = {}
        self.cursors: dict[str, int] = {}  # the last id each subscription has queued
        self.progress = Wakeup()  # frames went out (what drain waits on)
        self.ephemeral: set[str] = set()
        self.closing = False
        self.expiring: asyncio.Task[None] | None = None

    # -- writing ---------------------------------------------------------------------------

    async def emit(self, frame: str) -> None:
        """Queue a frame; the socket is closed with 1013 if it finds no room in time (TooSlow)."""
        await self.outbox.put(frame)

    async def emit_json(self, payload: dict[str, Any]) -> None:
        """Queue a JSON frame made here (acknowledgements, errors, status)."""
        await self.emit(jsonsafe.dumps(payload))

    async def _write(self, frames: list[str]) -> bool:
        """Send what is queued under one timer; False once the client is gone or closed."""
        self.direct.sending = True
        try:
            async with asyncio.timeout(self.send_timeout):
                for frame in frames:
                    await self.ws.send_str(frame)
        except TimeoutError:
            await self.close_slow()
            return False
        except (ConnectionResetError, RuntimeError):
            return False
        finally:
            self.direct.sending = False
        self._progressed()
        return True

    def _progressed(self) -> None:
        self.progress.notify()

    async def drain(self, timeout: float) -> None:
        """Wait (at most ``timeout``) until every subscription has sent all its log holds."""
        self.draining = True  # the frames written past the outbox say so too
        try:
            async with asyncio.timeout(timeout):
                while True:
                    progressed = self.progress.waiter()  # taken first: progress while looking wakes it
                    pending = self.outbox.qsize() > 0
                    for session_id in self.pumps.keys():
                        session = self.sessions.get(session_id)
                        if (
                            session is not None
                            and self.cursors.get(session_id, 0) < await session.log.last_id()
                        ):
                            pending = True
                    if not pending:
                        return
                    await progressed
        except TimeoutError:
            pass

    async def close_slow(self) -> None:
        """Close a client that does not read; it may resume with ``last_event_id``."""
        if not self.closing:
            self.closing = True
            log.info("closing a WebSocket client that stopped reading")
            await self.ws.close(code=TRY_AGAIN_LATER, message=b"client too slow; resume with last_event_id")

    # -- commands --------------------------------------------------------------------------

    async def handle(self, text: str) -> None:
        """Parse and run one client message; a bad one gets an error frame."""
        try:
            message = parsed(text)
        except ClientError as error:
            await self.handle_error(error, None)
            return
        request_type = message.get("type")
        if self.trace_parent is None or request_type not in TRACED:
            await self._dispatch(message, request_type)
            return
        with message_span(self.context.tracer, request_type, message.get("_meta"), self.trace_parent):
            await self._dispatch(message, request_type)

    async def _dispatch(self, message: dict[str, Any], request_type: Any) -> None:
        try:
            if request_type != "ping":
                await self._count_request()
            handler = self._handlers.get(request_type) if isinstance(request_type, str) else None
            if handler is None:
                raise ClientError(
                    "unknown_type",
                    f"unknown message type {request_type!r}; expected one of {', '.join(sorted(self._handlers))}",
                )
            check_meta(message)
            await handler(self, message)
        except ClientError as error:
            await self.handle_error(error, request_type)
        except (ApprovalError, ConversationError) as exc:
            await self.handle_error(ClientError(exc.code, str(exc), **_ids(message)), request_type)
        except SessionNotFound:
            missing = ClientError("not_found", "Session not found", session_id=message.get("session_id"))
            await self.handle_error(missing, request_type)
        except UnknownAgent as exc:  # the known agents listed, as the HTTP 422 lists them
            await self.handle_error(ClientError(exc.code, str(exc), agents=exc.known), request_type)
        except StoreUnavailable as exc:  # a dependency down: refused as a 503 is, the socket stays open
            code, why = unavailable_reply(exc)
            await self.handle_error(ClientError(code, why, **_ids(message)), request_type)

    async def handle_error(self, error: ClientError, request_type: Any) -> None:
        """Tell the client its message was refused, and why."""
        if self.trace_parent is not None:
            refused(error.code, str(error))
        await self.emit_json(
            {
                "type": "error",
                "error": str(error),
                "code": error.code,
                "request_type": request_type,
                **error.extra,
            }
        )

    async def _ping(self, message: dict[str, Any]) -> None:
        await self.emit_json({"type": "pong"})

    async def _subscribe(self, message: dict[str, Any]) -> None:
        session = await self._session(message)
        after = optional_int(message, "last_event_id")
        log_ = session.log
        last = await log_.last_id()
        if after is not None:
            if after > last:
                raise ClientError(
                    "invalid",
                    f"last_event_id {after} is ahead of the session's last event id {last}",
                    session_id=session.id,
                )
            oldest = await log_.first_id()
            if after < oldest - 1:
                body = await purged_body(self.context, session, after, oldest)
                raise ClientError("events_purged", body.pop("error"), session_id=session.id, **body)
        self.pumps.stop(session.id)
        await self.emit_json({"type": "subscribed", "session_id": session.id})
        if after is None:
            await self.emit_json(
                {"session_id": session.id, "type": "status_change", "status": session.status}
            )
            after = last
        self.pumps.start(session.id, self._pump(session, after))

    async def _unsubscribe(self, message: dict[str, Any]) -> None:
        session_id = required_str(message, "session_id")
        if not self.pumps.stop(session_id):
            raise ClientError("not_subscribed", "not subscribed to that session", session_id=session_id)
        await self.emit_json({"type": "unsubscribed", "session_id": session_id})

    async def _message(self, message: dict[str, Any]) -> None:
        session = await self._session(message)
        fields = {name: value for name, value in message.items() if name not in ("type", "session_id")}
        body = validated(MessageRequest, fields, session_id=session.id)
        self._check_query(body.content or "", body.max_turns, session_id=session.id)
        context = {"session_id": session.id}
        try:
            sent = await actions.send(self.context, session, body)
        except RunInProgress:
            raise ClientError("conflict", "a query is already running in this session", **context) from None
        except Overloaded as exc:
            raise ClientError("overloaded", str(exc), **context) from None
        except QuotaExceeded as exc:
            raise _quota_error(exc, **context) from None
        if sent.run is not None:
            await self._accepted(session, sent.run)
        else:
            await self.emit_json({"type": "queued", "session_id": session.id, "queued": sent.queued})

    async def _tool_result(self, message: dict[str, Any]) -> None:
        session = await self._session(message)
        tool_call_id = required_str(message, "tool_call_id")
        fields = {name: message[name] for name in ("output", "error") if name in message}
        body = validated(ToolResultRequest, fields, session_id=session.id, tool_call_id=tool_call_id)
        reply = await actions.answer_tool_result(self.context, session, tool_call_id, body, "ws")
        await self.emit_json({"type": "tool_result_accepted", "session_id": session.id, **reply})

    async def _cancel(self, message: dict[str, Any]) -> None:
        session = await self._session(message)
        cancelled = await self.context.runs.cancel(session.id)
        await self.emit_json({"type": "cancel_requested", "session_id": session.id, "cancelled": cancelled})

    async def _approve(self, message: dict[str, Any]) -> None:
        session = await self._session(message)
        approval_id = required_str(message, "approval_id")
        reply = await approvals.answer_message(self.context, session, approval_id, message, "ws")
        await self.emit_json({"type": "approval_answered", "session_id": session.id, **reply})

    async def _create(self, message: dict[str, Any]) -> None:
        """A new idle session of the agent named (the default one without ``agent``), for the
        client to subscribe to and send messages in, as ``POST /sessions`` makes."""
        agent = chosen(self.context.agents, optional_str(message, "agent"))
        try:
            session = await self.context.sessions.create(owner=self.owner, agent=agent)
        except SessionLimitReached as exc:
            raise ClientError("overloaded", str(exc)) from None
        except QuotaExceeded as exc:
            raise _quota_error(exc) from None
        await self.emit_json({"type": "created", "session_id": session.id, "agent": session.agent})

    async def _run(self, message: dict[str, Any]) -> None:
        text = required_str(message, "message")
        if not text.strip():
            raise ClientError("invalid", "message must not be blank")
        max_turns = optional_int(message, "max_turns")
        agent = chosen(self.context.agents, optional_str(message, "agent"))
        self._check_query(text, max_turns)
        session = await self._create_ephemeral(agent)
        self.ephemeral.add(session.id)
        try:
            # Started before the client hears of the session: a refused run (overloaded, a quota)
            # leaves no subscription behind for the client to wait on.
            run = await self._start(session, text, max_turns, context={})
            await self.emit_json({"type": "subscribed", "session_id": session.id})
            await self._accepted(session, run)
        except BaseException:
            await self._end_ephemeral(session.id)
            raise
        # The run has logged its start already; reading from 0 misses nothing.
        self.pumps.start(session.id, self._pump(session, 0, until_done=True))

    _handlers = {
        "ping": _ping,
        "create": _create,
        "subscribe": _subscribe,
        "unsubscribe": _unsubscribe,
        "message": _message,
        "cancel": _cancel,
        "approve": _approve,
        "tool_result": _tool_result,
        "run": _run,
    }

    # -- helpers ---------------------------------------------------------------------------

    async def _session(self, message: dict[str, Any]) -> Session:
        session_id = required_str(message, "session_id")
        return await self.context.sessions.get_owned(session_id, self.owner)

    async def _create_ephemeral(self, agent: str) -> Session:
        try:
            return await self.context.sessions.create(ephemeral=True, owner=self.owner, agent=agent)
        except SessionLimitReached as exc:
            raise ClientError("overloaded", str(exc)) from None

    async def _count_request(self) -> None:
        """A message counts as a request against the key's per-minute quota (pings do not)."""
        try:
            await self.context.quotas.count_request(self.owner)
        except QuotaExceeded as exc:
            raise _quota_error(exc) from None

    def _check_query(self, content: str, max_turns: int | None, **context: Any) -> None:
        limit = self.context.settings.max_message_chars
        if len(content) > limit:
            raise ClientError("invalid", f"longer than {limit} characters", **context)
        if max_turns is not None and not 1 <= max_turns <= 100:
            raise ClientError("invalid", "max_turns must be between 1 and 100", **context)

    async def _start(
        self, session: Session, content: str, max_turns: int | None, *, context: dict[str, Any] | None = None
    ) -> Run:
        """Start the query; a refusal is a ClientError naming the session (``context`` overrides)."""
        context = {"session_id": session.id} if context is None else context
        self._check_query(content, max_turns, **context)
        try:
            return await self.context.runs.start(session, content, max_turns)
        except RunInProgress:
            raise ClientError("conflict", "a query is already running in this session", **context) from None
        except Overloaded as exc:
            raise ClientError("overloaded", str(exc), **context) from None
        except QuotaExceeded as exc:
            raise _quota_error(exc, **context) from None

    async def _accepted(self, session: Session, run: Run) -> None:
        await self.emit_json({"type": "accepted", "session_id": session.id, "run_id": run.id})

    async def _pump(self, session: Session, after: int, *, until_done: bool = False) -> None:
        """Forward the session's events after ``after`` until unsubscribed (or the run's end)."""
        merge_after = self.context.settings.merge_deltas_after
        session_id = session.id
        self.sessions[session_id] = session
        self.cursors[session_id] = after

        def project(batch: list[LogEntry]) -> list[str]:
            if len(batch) > merge_after:
                frames = [ws_frame(session_id, data) for _, _, data in merge_text_runs(batch)]
            else:
                frames = [self._frame(session_id, entry) for entry in batch]
            self._delivered.inc(len(frames))
            return frames

        def queued(batch: list[LogEntry]) -> None:
            self.cursors[session_id] = batch[-1].id
            self._progressed()

        def written(count: int, last_id: int) -> None:
            self._delivered.inc(count)
            self.cursors[session_id] = last_id
            if self.draining:
                self._progressed()

        deliver, deliver_many = self.direct.delivery(session_id, self._frame, written)

        try:
            await pump(
                session.log,
                after,
                self.outbox,
                project,
                end=lambda ending: [jsonsafe.dumps(_ending_frame(session_id, ending))],
                stop=Stop.AT_TERMINAL if until_done else Stop.NEVER,
                on_batch=queued,
                deliver=deliver,
                deliver_many=deliver_many,
            )
        except TooSlow:
            pass
        finally:
            if self.pumps.owns(session_id) or session_id not in self.pumps:
                self.sessions.pop(session_id, None)
                self.cursors.pop(session_id, None)
            if until_done:
                await self._end_ephemeral(session_id)

    @staticmethod
    def _frame(session_id: str, entry: Any) -> str:
        cached = entry.encoded.get("ws")
        if cached is None:
            cached = entry.encoded["ws"] = ws_frame(session_id, session_frame(entry)[1])
        return cached

    async def _end_ephemeral(self, session_id: str) -> None:
        self.ephemeral.discard(session_id)
        await self.context.end_ephemeral(session_id)

    def expire_soon(self) -> None:
        """The token has expired: end the socket (see :meth:`expire`) from a task of its own."""
        self.expiring = asyncio.create_task(self.expire(), name="ws-expiry")

    async def expire(self) -> None:
        """The token the socket was opened with has expired: stop following, say so, close with
        4401. What was queued and not sent is dropped; the client resumes by ``last_event_id``
        with a fresh token, so nothing is lost."""
        if self.closing:
            return
        self.closing = True
        await asyncio.gather(*self.pumps.cancel_all(), return_exceptions=True)
        writer = self.outbox.writer
        self.outbox.close()
        if writer is not None:
            await asyncio.wait([writer], timeout=self.send_timeout)
        frame = {
            "type": "error",
            "error": TOKEN_EXPIRED,
            "code": "token_expired",
            "request_type": None,
        }
        try:
            async with asyncio.timeout(self.send_timeout):
                await self.ws.send_str(jsonsafe.dumps(frame))
        except (TimeoutError, ConnectionResetError, RuntimeError):
            pass  # the client is gone already
        await self.ws.close(code=TOKEN_EXPIRED_CLOSE, message=b"token expired")

    async def close(self) -> None:
        """Stop every subscription and the writer; a socket's short-lived runs end with it.

        Shielded: the handler may be cancelled again while it cleans up (the peer vanished),
        and a half-done cleanup would leave tasks and short-lived runs behind.
        """
        tasks = self.pumps.cancel_all()
        writer = self.outbox.writer
        if writer is not None:
            writer.cancel()
            tasks.append(writer)
        if self.expiring is not None:
            tasks.append(self.expiring)  # let it finish its close rather than cut it
        self.outbox.close()
        await asyncio.shield(self._cleanup(tasks))

    async def _cleanup(self, tasks: list[asyncio.Task[Any]]) -> None:
        await asyncio.gather(*tasks, return_exceptions=True)
        for session_id in list(self.ephemeral):
            await self._end_ephemeral(session_id)


def _ending_frame(session_id: str, ending: Ending) -> dict[str, Any]:
    """How a subscription ended, as the frame that tells the client."""
    if ending.reason == "purged":
        # Fell behind the purge horizon: a subscribe with its last id gets the snapshot.
        return {
            "type": "error",
            "error": ending.message,
            "code": "events_purged",
            "session_id": session_id,
            "oldest_id": ending.oldest_id,
        }
    if ending.reason == "store_unavailable":
        return {
            "type": "error",
            "error": ending.message,
            "code": "store_unavailable",
            "session_id": session_id,
            "last_id": ending.last_id,
        }
    return {"type": "unsubscribed", "session_id": session_id, "reason": "ended"}


def _quota_error(exc: QuotaExceeded, **context: Any) -> ClientError:
    """A quota refusal as an ``error`` frame: code ``quota_exceeded``, the quota, its limit and
    ``retry_after`` (seconds), like the HTTP 429's body."""
    fields = quota_fields(exc)
    return ClientError(fields.pop("code"), exc.message, **fields, **context)


def _ids(message: dict[str, Any]) -> dict[str, Any]:
    return {
        name: message.get(name) for name in ("session_id", "approval_id", "tool_call_id") if name in message
    }


async def websocket(request: web.Request) -> web.StreamResponse:
    """``GET /ws``: the WebSocket protocol of ../shared/DESIGN.md."""
    context = context_of(request)
    settings = context.settings
    if not origin_allowed(request, settings):
        return web.json_response({"error": "origin not allowed"}, status=403)
    ws = web.WebSocketResponse(
        heartbeat=settings.ws_heartbeat_s,
        max_msg_size=settings.ws_max_message_bytes,
        compress=False,
        timeout=settings.ws_send_timeout_s,  # how long a close waits for the client's answer
    )
    owner = owner_of(request)
    quotas = context.quotas
    await quotas.open_stream(owner)  # no free stream slot: a 429 instead of the upgrade
    try:
        await ws.prepare(request)
    except BaseException:
        await quotas.close_stream(owner)
        raise
    connection = Connection(ws, context, owner, request.headers, request.transport)
    request.app[SOCKETS].add(connection)
    sockets = context.metrics.connections.labels("ws")
    sockets.inc()
    expiry = at_expiry(request, connection.expire_soon)
    try:
        while not ws.closed:
            try:
                message = await ws.receive(timeout=settings.ws_idle_timeout_s)
            except TimeoutError:
                if not len(connection.pumps):
                    await ws.close(code=WSCloseCode.GOING_AWAY, message=b"idle")
                    break
                continue
            if message.type == WSMsgType.TEXT:
                await connection.handle(message.data)
            elif message.type == WSMsgType.BINARY:
                await ws.close(code=WSCloseCode.UNSUPPORTED_DATA, message=b"binary frames are not supported")
                break
            elif message.type in {WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR}:
                break
    except TooSlow:
        pass
    except Exception:
        # A fault of ours: close with 1011 rather than let the error middleware write an HTTP
        # 500 into the upgraded connection (the client would see a broken frame).
        log.exception("unhandled error on a WebSocket")
        await ws.close(code=WSCloseCode.INTERNAL_ERROR, message=b"internal error")
    finally:
        if expiry is not None:
            expiry.cancel()
        sockets.dec()
        await quotas.close_stream(owner)
        request.app[SOCKETS].discard(connection)
        await connection.close()
    return ws


async def _close_sockets(app: web.Application) -> None:
    """On shutdown (after every run wrote its terminal event), let each socket send what its
    sessions hold, then tell the client to go elsewhere (1001); it resumes by last_event_id."""
    connections = list(app[SOCKETS])

    async def close(connection: Connection) -> None:
        await connection.drain(timeout=2.0)
        await connection.ws.close(code=WSCloseCode.GOING_AWAY, message=b"server shutting down")

    await asyncio.gather(*(close(connection) for connection in connections), return_exceptions=True)


def add_routes(app: web.Application) -> None:
    """Register the WebSocket route."""
    app[SOCKETS] = set()
    app.router.add_get("/ws", websocket)
    app.on_shutdown.append(_close_sockets)
