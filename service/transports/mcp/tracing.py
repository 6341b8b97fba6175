"""A SERVER span per MCP request and notification, named and dressed by OpenTelemetry's MCP
conventions: ``{mcp.method.name} {target}`` (``tools/call session_message``), with
``mcp.method.name``, ``mcp.session.id``, ``jsonrpc.request.id``, and for a tool call
``gen_ai.operation.name`` = ``execute_tool`` and ``gen_ai.tool.name``.

Its parent is the context the client put in the request's ``params._meta`` (``traceparent``,
``tracestate``), as the conventions propagate it; the HTTP request's span is then a link, since
one POST's transport and one MCP call's context are independent. Without one in ``_meta``, the
span is a child of the HTTP request's. The query a tool starts (``session_message``) is made while
this span is current, so it hangs under it.

The SDK's own middleware does the same with the process's global tracer; the service has none
(its provider is the app's), so the server runs this one, on the app's tracer, instead, and no
middleware at all when traces are off.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mcp_types as types
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.shared.exceptions import MCPError
from opentelemetry import trace
from opentelemetry.trace import Link, SpanKind, Status, StatusCode, Tracer
from pydantic import ValidationError

from service.transports.edge.tracing import remote_parent

TOOLS_CALL = "tools/call"


class TracingMiddleware:
    """The SDK server's middleware (outermost) that wraps each inbound message in its span."""

    def __init__(self, tracer: Tracer, session_id_of: Callable[[Any], str | None]) -> None:
        self.tracer = tracer
        self.session_id_of = session_id_of

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        name = ctx.params.get("name") if ctx.params else None
        tool = name if ctx.method == TOOLS_CALL and isinstance(name, str) else None
        attributes: dict[str, Any] = {
            "mcp.method.name": ctx.method,
            "network.protocol.name": "http",
            "network.transport": "tcp",
        }
        if ctx.protocol_version:
            attributes["mcp.protocol.version"] = ctx.protocol_version
        if ctx.request_id is not None:
            attributes["jsonrpc.request.id"] = str(ctx.request_id)
        session_id = self.session_id_of(ctx.request)
        if session_id:
            attributes["mcp.session.id"] = session_id
        if ctx.method == TOOLS_CALL:
            attributes["gen_ai.operation.name"] = "execute_tool"
            if tool is not None:
                attributes["gen_ai.tool.name"] = tool
        parent = remote_parent(ctx.meta) if ctx.meta else None
        links = None
        if parent is not None:
            ambient = trace.get_current_span().get_span_context()
            links = [Link(ambient)] if ambient.is_valid else None
        with self.tracer.start_as_current_span(
            ctx.method if tool is None else f"{ctx.method} {tool}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes=attributes,
            links=links,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                result = await call_next(ctx)
            except MCPError as exc:
                _failed(span, str(exc.error.code), exc.error.message)
                raise
            except ValidationError:  # the SDK answers INVALID_PARAMS; pydantic's text holds input
                _failed(span, str(types.INVALID_PARAMS), "Invalid request parameters")
                raise
            except BaseException as exc:
                span.set_attribute("error.type", type(exc).__qualname__)
                span.set_status(Status(StatusCode.ERROR))
                raise
            if ctx.method == TOOLS_CALL and _is_error(result):
                # A tool's own failure is a result, not a JSON-RPC error: the conventions call it so.
                span.set_attribute("error.type", "tool_error")
                span.set_status(Status(StatusCode.ERROR))
            return result


def _failed(span: trace.Span, code: str, message: str) -> None:
    span.set_attributes({"error.type": code, "rpc.response.status_code": code})
    span.set_status(Status(StatusCode.ERROR, message))


def _is_error(result: HandlerResult) -> bool:
    """Whether a tool call's result (the SDK has made it its wire dict by now) is ``isError``."""
    if isinstance(result, types.CallToolResult):
        return bool(result.is_error)
    return isinstance(result, dict) and result.get("isError") is True
