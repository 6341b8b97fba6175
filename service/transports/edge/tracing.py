"""A server span per HTTP request that can start work (a POST), continued from the client's
W3C ``traceparent``: the query a request starts gets its span as the parent, so a front end's
trace goes on through the service. The app installs it only when traces are on.

:func:`remote_parent` reads the same context from a message's ``_meta`` object, where the
WebSocket and MCP faces take it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import web
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from service.core.traces import NO_TRACER
from service.transports.edge.context import CONTEXT


def _route(request: web.Request) -> str:
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else request.path


@web.middleware
async def tracing_middleware(request: web.Request, handler: web.Handler) -> web.StreamResponse:
    tracer = request.app[CONTEXT].tracer
    if tracer is NO_TRACER or request.method != "POST":
        return await handler(request)
    route = _route(request)
    parent = propagate.extract(request.headers)
    with tracer.start_as_current_span(
        f"POST {route}",
        context=parent,
        kind=SpanKind.SERVER,
        attributes={"http.request.method": "POST", "http.route": route, "url.path": request.path},
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            _status(span, exc.status)
            raise
        except BaseException as exc:
            span.set_attribute("error.type", type(exc).__qualname__)
            span.set_status(Status(StatusCode.ERROR))
            raise
        _status(span, response.status)
        return response


def _status(span: Span, status: int) -> None:
    span.set_attribute("http.response.status_code", status)
    if status >= 500:  # a server span fails on the server's errors only (the HTTP conventions)
        span.set_attribute("error.type", str(status))
        span.set_status(Status(StatusCode.ERROR))


def remote_parent(carrier: Mapping[str, Any]) -> Context | None:
    """The caller's span context a protocol's ``_meta`` object carries (``traceparent``,
    ``tracestate``, read by the configured propagators), or None when it holds none that is valid.
    Only its string values are read: the propagators take nothing else."""
    extracted = propagate.extract({name: value for name, value in carrier.items() if isinstance(value, str)})
    return extracted if trace.get_current_span(extracted).get_span_context().is_valid else None
