"""``/mcp`` over HTTP: the Streamable HTTP transport's POST, GET and DELETE.

``POST`` carries one JSON-RPC message, answered by the SDK's runner as JSON (or as SSE for a
``session_message`` that waits for its answer); ``GET`` is the MCP session's stream of event
notifications, resumable by ``Last-Event-ID``; ``DELETE`` ends the MCP session.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import mcp_types as types
from aiohttp import web
from mcp.shared.jsonrpc_dispatcher import handler_exception_to_error_data
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from pydantic import ValidationError

from service import jsonsafe
from service.errors import SessionLimitReached
from service.transports.edge.auth import TOKEN_EXPIRED, at_expiry, owner_of
from service.transports.edge.context import Context, context_of
from service.transports.edge.inputs import NUL_REFUSED, holds_nul, may_hold_nul
from service.transports.edge.middleware import error_response
from service.transports.mcp.notifications import format_cursor, log_message, parse_cursor
from service.transports.mcp.session import (
    EXCHANGE,
    MCP_SESSION,
    MCP_SESSIONS,
    Exchange,
    Item,
    McpSession,
    McpStream,
)
from service.transports.stream.frames import sse_block
from service.transports.stream.pump import write_until_closed
from service.transports.stream.sse import event_stream
from service.transports.stream.writes import write_blocks

log = logging.getLogger(__name__)

PATH = "/mcp"
SESSION_HEADER = "Mcp-Session-Id"
VERSION_HEADER = "MCP-Protocol-Version"


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
    if isinstance(message, types.JSONRPCRequest) and may_hold_nul(raw) and holds_nul(decoded):
        return _rpc_error(200, types.INVALID_PARAMS, f"Invalid params: {NUL_REFUSED}", message.id)
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
        return web.json_response(reply, headers=headers, dumps=jsonsafe.dumps)
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
        await write_blocks(request, response, sse_block(data).encode(), timeout)

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
    await sink(jsonsafe.dumps(reply))
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
        async with context.stream_slot("mcp", owner_of(request)):
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
    delivered = context.metrics.delivered("mcp")
    stream.start_all()

    async def write(items: list[Item]) -> bool:
        blocks = [block for item in items for block in stream.render(item)]
        if blocks:
            await write_blocks(request, response, "".join(blocks).encode(), settings.sse_send_timeout_s)
            delivered.inc(len(blocks))
        return True

    expired = asyncio.Event()

    def expire() -> None:
        expired.set()
        stream.outbox.close()  # what is queued and not written is dropped: the client resumes

    timer = at_expiry(request, expire)
    try:
        await write_until_closed(stream.outbox, write)
    finally:
        if timer is not None:
            timer.cancel()
    if expired.is_set():
        # No id: the client resumes from the last one it got, with a fresh token.
        ended = {"code": "token_expired", "error": TOKEN_EXPIRED}
        await write_blocks(
            request, response, sse_block(log_message("error", ended)).encode(), settings.sse_send_timeout_s
        )


async def delete(request: web.Request) -> web.Response:
    """``DELETE /mcp``: end the MCP session (the agent sessions it followed stay)."""
    found = _lookup(request)
    if isinstance(found, web.Response):
        return found
    await request.app[MCP_SESSIONS].remove(found)
    return web.Response(status=204)
