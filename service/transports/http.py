"""JSON over HTTP: request bodies, error replies, ``POST /agent/run`` and ``GET /healthz``.

Every error body is JSON ``{"error": "..."}`` with a fitting status; a client's mistake is
never a 500 (see the error middleware).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import aclosing
from typing import Annotated, Any, TypeVar

from aiohttp import web
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from service.app import SERVICES, Services
from service.core.events import Event, RunDone, RunError, TextDelta, is_terminal
from service.core.sessions import Session
from service.errors import (
    EventsPurged,
    Overloaded,
    RunInProgress,
    SessionLimitReached,
    SessionNotFound,
    StoreUnavailable,
)
from service.logs import session_id_var
from service.transports import dialects
from service.transports.auth import owner_of

log = logging.getLogger(__name__)

Model = TypeVar("Model", bound=BaseModel)


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be blank")
    return value


Text = Annotated[str, Field(min_length=1), AfterValidator(_not_blank)]


def _json_integer(value: object) -> object:
    # pydantic's lax mode would take ``true`` and ``"3"`` as integers; JSON Schema's "integer"
    # (and so the OpenAPI document) takes neither, but does take ``3.0``.
    if isinstance(value, bool | str):
        raise ValueError("must be an integer")
    return value


MaxTurns = Annotated[
    Annotated[int, Field(ge=1, le=100)] | None, BeforeValidator(_json_integer), Field(default=None)
]


class AgentRequest(BaseModel):
    """Body of ``POST /agent/stream`` and ``POST /agent/run``."""

    model_config = ConfigDict(extra="ignore")

    message: Text
    max_turns: MaxTurns = None


def error_response(status: int, message: str, **extra: Any) -> web.Response:
    """A JSON error reply."""
    return web.json_response({"error": message, **extra}, status=status)


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
    ):
        if candidate.status_code == status:
            cls = candidate
            break
    kwargs: dict[str, Any] = {
        "text": json.dumps({"error": message, **extra}),
        "content_type": "application/json",
    }
    if cls is web.HTTPRequestEntityTooLarge:
        return web.HTTPRequestEntityTooLarge(max_size=extra.get("max_bytes", 0), actual_size=0, **kwargs)
    return cls(**kwargs)


_DOMAIN_ERRORS: dict[type[Exception], tuple[int, str]] = {
    SessionNotFound: (404, "Session not found"),
    RunInProgress: (409, "a query is already running in this session"),
    Overloaded: (503, "the service is at its limit of concurrent queries; try again shortly"),
    SessionLimitReached: (503, "the service holds as many sessions as it may; delete one or try again later"),
    StoreUnavailable: (503, "session storage (Redis) is unavailable; try again shortly"),
}


@web.middleware
async def error_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Give every error a JSON body and the right status; log only the server's own faults."""
    session_id = request.match_info.get("session_id")
    if session_id:
        session_id_var.set(session_id)  # on every log line while this request is served
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.content_type == "application/json" or exc.status < 400:
            raise
        if isinstance(exc, web.HTTPRequestEntityTooLarge):
            message = "request body too large"
        else:
            message = exc.reason
        response = error_response(exc.status, message)
        if "Allow" in exc.headers:  # a 405 says which methods the path takes (RFC 9110)
            response.headers["Allow"] = exc.headers["Allow"]
        return response
    except EventsPurged as exc:
        return error_response(410, str(exc), oldest_id=exc.oldest_id)
    except tuple(_DOMAIN_ERRORS) as exc:
        status, message = _DOMAIN_ERRORS[type(exc)]
        extra = {"code": "store_unavailable"} if isinstance(exc, StoreUnavailable) else {}
        response = error_response(status, message, **extra)
        if status == 503:
            response.headers["Retry-After"] = "1"
        return response
    except ConnectionResetError:
        # The client went away before or while we answered: nobody is left to tell, and it is no
        # fault of ours to log. aiohttp drops this reply quietly when it cannot be written.
        return web.Response(status=499, reason="Client Closed Request")
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(500, "internal server error")


async def read_object(request: web.Request, *, allow_empty: bool = False) -> dict[str, Any]:
    """The body as a JSON object: 413 too large, 400 malformed or empty, 422 not an object."""
    services = request.app[SERVICES]
    limit = services.settings.max_request_bytes
    if request.content_length is not None and request.content_length > limit:
        raise json_error(413, f"request body too large (limit {limit} bytes)", max_bytes=limit)
    raw = await request.read()  # aiohttp enforces client_max_size while reading a chunked body
    if not raw.strip():
        if allow_empty:
            return {}
        raise json_error(400, "request body is empty; send a JSON object")
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise json_error(400, f"malformed JSON: {exc}") from None
    except RecursionError:
        raise json_error(400, "malformed JSON: nested too deeply") from None
    if not isinstance(data, dict):
        raise json_error(422, "request body must be a JSON object")
    return data


async def read_json(request: web.Request, model: type[Model]) -> Model:
    """Parse the body as ``model``: 413 too large, 400 malformed JSON, 422 wrong shape."""
    data = await read_object(request)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        details = [
            {"field": ".".join(str(part) for part in item["loc"]) or "body", "message": item["msg"]}
            for item in exc.errors(include_url=False)
        ]
        summary = "; ".join(f"{item['field']}: {item['message']}" for item in details)
        raise json_error(422, f"invalid request: {summary}", details=details) from None


def check_length(services: Services, text: str, field: str) -> None:
    """422 when a message is longer than ``AGENT_MAX_MESSAGE_CHARS``."""
    limit = services.settings.max_message_chars
    if len(text) > limit:
        raise json_error(422, f"invalid request: {field}: longer than {limit} characters")


async def follow_run(session: Session, after_id: int = 0) -> AsyncIterator[Event]:
    """The session's events after ``after_id`` until the query's terminal event (inclusive)."""
    async with aclosing(session.log.subscribe(after_id)) as batches:
        async for batch in batches:
            for entry in batch:
                yield entry.event
                if is_terminal(entry.event):
                    return


async def start_ephemeral(services: Services, body: AgentRequest, owner: str = "") -> Session:
    """A short-lived session with the query started on it."""
    check_length(services, body.message, "message")
    session = await services.sessions.create(ephemeral=True, owner=owner)
    try:
        await services.runs.start(session, body.message, body.max_turns)
    except BaseException:
        await services.sessions.delete(session.id)
        raise
    return session


async def end_ephemeral(services: Services, session: Session) -> None:
    """Cancel the short-lived session's query if it still runs (its client left), then forget it."""
    await services.runs.cancel(session.id)
    try:
        await services.sessions.delete(session.id)
    except SessionNotFound:
        pass


async def agent_run(request: web.Request) -> web.Response:
    """``POST /agent/run``: the same run as ``/agent/stream``, collected into one JSON reply."""
    services = request.app[SERVICES]
    body = await read_json(request, AgentRequest)
    session = await start_ephemeral(services, body, owner_of(request))
    parts: list[str] = []
    terminal: Event | None = None
    try:
        async for event in follow_run(session):
            if isinstance(event, TextDelta):
                parts.append(event.text)
            elif is_terminal(event):
                terminal = event
    finally:
        await asyncio.shield(end_ephemeral(services, session))
    if isinstance(terminal, RunDone):
        reply = dialects.agent(terminal) or {}
        reply.pop("type", None)
        return web.json_response({"response": "".join(parts), **reply})
    error = terminal if isinstance(terminal, RunError) else RunError(error="the run ended without a result")
    return error_response(
        503,
        error.error,
        code=error.code,
        turns=error.turns,
        response="".join(parts),
        usage=dialects.usage_dict(error.usage),
    )


async def healthz(request: web.Request) -> web.Response:
    """``GET /healthz``: 200 while serving, with a few numbers worth watching."""
    services = request.app[SERVICES]
    try:
        since = float(request.query["lag_since"]) if "lag_since" in request.query else None
    except ValueError:
        raise json_error(400, "lag_since must be a number (a time.monotonic() reading)") from None
    mcp: list[dict[str, Any]] = []
    if services.settings.mcp_servers:
        # Imported only when configured: the MCP SDK is a heavy import for a health probe.
        from service.agent.mcp import mcp_status

        mcp = mcp_status(services.tools)
    store: dict[str, Any] = {"kind": "memory", "connected": True}
    sessions: int | None = None
    backend = services.backend
    if backend is None:
        sessions = await services.sessions.count()
    else:
        store = {"kind": "redis", "instance_id": backend.instance_id, "connected": False}
        # Counting the sessions is the probe: one round trip, on a short clock of its own, so a
        # Redis that hangs makes health say "degraded" at once rather than hang with it.
        with contextlib.suppress(StoreUnavailable, TimeoutError):
            async with asyncio.timeout(backend.probe_s):
                sessions = await services.sessions.count()
                store["connected"] = True
    healthy = store["connected"]
    return web.json_response(
        {
            "status": "ok" if healthy else "degraded",
            "provider": services.settings.provider,
            "runs_active": services.runs.active,
            "sessions": sessions,
            # Redis when the service is scaled out; without it no new work can be taken (503).
            "store": store,
            "loop_lag_ms": services.monitor.summary(since),
            # Per MCP server: connected or not, and why; a server being down is not a failure.
            "mcp": mcp,
        },
        status=200 if healthy else 503,
    )


async def metrics(request: web.Request) -> web.Response:
    """``GET /metrics``: Prometheus's text format; with ``AGENT_API_KEYS`` set the scraper sends a
    key as a bearer token, like any client."""
    from service.metrics import CONTENT_TYPE

    body = request.app[SERVICES].metrics.render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


@contextlib.contextmanager
def open_connection(services: Services, transport: str, owner: str | None = None) -> Iterator[None]:
    """Count a streaming connection for as long as the block runs; with ``owner``, it also holds
    one of that owner's stream slots (``AGENT_QUOTA_STREAMS``): entering raises
    :class:`~service.errors.QuotaExceeded` (a 429) when none is free, so enter before the
    response starts."""
    if owner is not None:
        services.quotas.acquire_stream(owner)
    gauge = services.metrics.connections.labels(transport)
    gauge.inc()
    try:
        yield
    finally:
        gauge.dec()
        if owner is not None:
            services.quotas.release_stream(owner)


def add_routes(app: web.Application) -> None:
    """Register the JSON routes."""
    app.router.add_post("/agent/run", agent_run)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)
