"""Errors as replies: every error a JSON body with a fitting status, never a 500 for a client's
mistake, and never a second response written into a stream that has started.

Handlers raise :func:`json_error` (or let a domain error from ``service.errors`` through);
:func:`error_middleware` turns each into its reply and logs only the service's own faults.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from service.errors import (
    AgentMismatch,
    ConversationError,
    DatabaseUnavailable,
    EventsPurged,
    Overloaded,
    RunInProgress,
    SessionLimitReached,
    SessionNotFound,
    StoreUnavailable,
    StreamLimitReached,
    UnknownAgent,
)
from service.logs import session_id_var

log = logging.getLogger(__name__)
# An error body is strict JSON like every other answer: a NaN in ``extra`` raises here.
_strict_dumps = json.JSONEncoder(allow_nan=False).encode


def error_response(status: int, message: str, **extra: Any) -> web.Response:
    """A JSON error reply."""
    return web.json_response({"error": message, **extra}, status=status, dumps=_strict_dumps)


def json_error(status: int, message: str, **extra: Any) -> web.HTTPException:
    """An HTTP exception carrying a JSON error body, to raise from a handler."""
    cls = web.HTTPException
    for candidate in (
        web.HTTPBadRequest,
        web.HTTPUnauthorized,
        web.HTTPForbidden,
        web.HTTPNotFound,
        web.HTTPConflict,
        web.HTTPGone,
        web.HTTPRequestEntityTooLarge,
        web.HTTPUnprocessableEntity,
        web.HTTPServiceUnavailable,
        web.HTTPNotImplemented,
    ):
        if candidate.status_code == status:
            cls = candidate
            break
    kwargs: dict[str, Any] = {
        "text": _strict_dumps({"error": message, **extra}),
        "content_type": "application/json",
    }
    if cls is web.HTTPRequestEntityTooLarge:
        return web.HTTPRequestEntityTooLarge(max_size=extra.get("max_bytes", 0), actual_size=0, **kwargs)
    return cls(**kwargs)


_DOMAIN_ERRORS: dict[type[Exception], tuple[int, str]] = {
    SessionNotFound: (404, "Session not found"),
    RunInProgress: (409, "a query is already running in this session"),
    Overloaded: (503, "the service is at its limit of concurrent queries; try again shortly"),
    StreamLimitReached: (503, "the service is at its limit of open streams; try again shortly"),
    SessionLimitReached: (503, "the service holds as many sessions as it may; delete one or try again later"),
    StoreUnavailable: (503, "session storage (Redis) is unavailable; try again shortly"),
    DatabaseUnavailable: (503, "the session database is unavailable; try again shortly"),
}
# The ``code`` of a 503 that names the dependency down, so a client or an operator knows which.
_UNAVAILABLE_CODES: dict[type[Exception], str] = {
    StoreUnavailable: "store_unavailable",
    DatabaseUnavailable: "database_unavailable",
}


def unavailable_reply(exc: StoreUnavailable) -> tuple[str, str]:
    """``(code, message)`` telling a client which dependency is down (Redis or the database)."""
    kind = DatabaseUnavailable if isinstance(exc, DatabaseUnavailable) else StoreUnavailable
    return _UNAVAILABLE_CODES[kind], _DOMAIN_ERRORS[kind][1]


# The stream response a handler has started, if any: once its headers are out, an error can no
# longer be answered with a response of its own.
OPEN_STREAM = web.RequestKey("open_stream", web.StreamResponse)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# An error answer made over in another protocol's shape (OpenAI's on /v1/): it gets the status, the
# service's own JSON body (``{"error": str, ...}``) and the headers, and returns the response.
ErrorShape = Callable[[int, dict[str, Any], Any], web.Response]
ERROR_SHAPES = web.AppKey("error_shapes", dict[str, ErrorShape])


def add_error_shape(app: web.Application, prefix: str, shape: ErrorShape) -> None:
    """Answer every error on paths under ``prefix`` in ``shape``'s form, whoever raised it."""
    app.setdefault(ERROR_SHAPES, {})[prefix] = shape


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Give every error a JSON body and the right status; log only the server's own faults.

    The outermost middleware, and one frame: a streaming handler's every wake-up resumes through
    the middlewares it runs under, so what needs no frame of its own (the guard of started
    streams, another protocol's error shape) is done here rather than in middlewares of its own.
    """
    session_id = request.match_info.get("session_id")
    if session_id:
        session_id_var.set(session_id)  # on every log line while this request is served
    try:
        response = await handler(request)
    except Exception as exc:
        stream = request.get(OPEN_STREAM)
        if stream is not None and stream.prepared:
            return _end_started_stream(request, stream, exc)
        try:
            response = _error_answer(request, exc)
        except web.HTTPException as passed:
            shape = _shape_of(request)
            if shape is None or passed.status < 400:
                raise
            body = _service_error(passed.text)
            if body is None:
                raise
            return shape(passed.status, body, passed.headers)
    if response.status >= 400 and not response.prepared and isinstance(response, web.Response):
        shape = _shape_of(request)
        if shape is not None and response.content_type == "application/json":
            body = _service_error(response.text)
            if body is not None:
                return shape(response.status, body, response.headers)
    return response


def _shape_of(request: web.Request) -> ErrorShape | None:
    shapes = request.app.get(ERROR_SHAPES)
    if shapes:
        path = request.path
        for prefix, shape in shapes.items():
            if path.startswith(prefix):
                return shape
    return None


def _service_error(text: str | None) -> dict[str, Any] | None:
    """The parsed body when it is the service's own error shape (``error`` a string), else None."""
    try:
        parsed = json.loads(text or "")
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) and isinstance(parsed.get("error"), str) else None


def _error_answer(request: web.Request, exc: Exception) -> web.StreamResponse:
    """The response an error raised before any stream started gets (an HTTPException that is
    already the answer, with a JSON body or not an error, is raised on)."""
    if isinstance(exc, web.HTTPException):
        if exc.content_type == "application/json" or exc.status < 400:
            raise exc
        if isinstance(exc, web.HTTPRequestEntityTooLarge):
            message = "request body too large"
        else:
            message = exc.reason
        response = error_response(exc.status, message)
        if "Allow" in exc.headers:  # a 405 says which methods the path takes (RFC 9110)
            response.headers["Allow"] = exc.headers["Allow"]
        return response
    if isinstance(exc, EventsPurged):
        return error_response(410, str(exc), oldest_id=exc.oldest_id)
    if isinstance(exc, ConversationError):
        return error_response(exc.status, str(exc), code=exc.code)
    if isinstance(exc, UnknownAgent):
        return error_response(exc.status, str(exc), code=exc.code, agents=exc.known)
    if isinstance(exc, AgentMismatch):
        return error_response(exc.status, str(exc), code=exc.code, agent=exc.bound)
    if isinstance(exc, tuple(_DOMAIN_ERRORS)):
        status, message = _DOMAIN_ERRORS[type(exc)]
        code = _UNAVAILABLE_CODES.get(type(exc))
        extra = {"code": code} if code else {}
        response = error_response(status, message, **extra)
        if status == 503:
            response.headers["Retry-After"] = "1"
        return response
    if isinstance(exc, ConnectionResetError):
        # The client went away before or while we answered: nobody is left to tell, and it is no
        # fault of ours to log. aiohttp drops this reply quietly when it cannot be written.
        return web.Response(status=499, reason="Client Closed Request")
    log.exception("unhandled error on %s %s", request.method, request.path, exc_info=exc)
    return error_response(500, "internal server error")


def _end_started_stream(
    request: web.Request, stream: web.StreamResponse, exc: Exception
) -> web.StreamResponse:
    """An error raised after the handler's stream started ends that stream instead.

    A second response written into a started body would corrupt it (a status line inside the
    chunked encoding), so the stream is ended cleanly and the fault logged on one line. Each
    streaming route tells its client why it ended before it gets here (see ``follow.py``).
    """
    if not isinstance(exc, ConnectionResetError):  # a client gone is nobody's fault
        log.warning(
            "%s %s: %s ended the stream after it started: %s",
            request.method,
            request.path,
            type(exc).__name__,
            exc,
        )
    return stream
