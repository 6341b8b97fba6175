"""A server span per WebSocket message that starts work, so the query a message starts hangs
under it as a query started by a POST hangs under the POST's span.

Its parent is the ``traceparent`` (and ``tracestate``) in the message's ``_meta`` object, else
the one the upgrade request carried, else none: a new trace. A socket lives long and carries
many messages; each message is its own unit of work, so each gets its own span.

The span follows OpenTelemetry's RPC conventions: a message is a call the server answers (an
``accepted``, ``created``, ... frame, or an ``error`` one), a SERVER span named ``{rpc.method}``,
here ``WebSocket/{type}``. (The messaging conventions fit a broker's queue, whose consumers get
CONSUMER spans and answer no one.) A refusal sets ``error.type`` to the error frame's ``code``;
like an HTTP server span's 5xx, only the service's own failures (overloaded, a store down) set
the status to ERROR.

Nothing here runs when traces are off: the connection asks for a span only with a tracer.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer

from service.transports.edge.tracing import remote_parent

# The messages that start work or change it; reads (subscribe, ping) get no span. A tuple:
# a client's ``type`` may be any JSON value, hashable or not.
TRACED = ("create", "message", "run", "approve", "cancel", "tool_result")
# Error codes that are the service's failure rather than the client's (HTTP would answer 503).
SERVER_FAULTS = frozenset({"overloaded", "store_unavailable", "database_unavailable"})
PATH = "/ws"


def upgrade_parent(headers: Mapping[str, str]) -> Context:
    """The context the upgrade request's ``traceparent`` names (empty without one): the parent
    of the socket's messages that carry none of their own."""
    return propagate.extract(headers)


@contextmanager
def message_span(tracer: Tracer, request_type: str, meta: Any, fallback: Context) -> Iterator[None]:
    """The span of one message, current while it is handled: the run it starts copies it."""
    parent = remote_parent(meta) if isinstance(meta, dict) else None
    method = f"WebSocket/{request_type}"
    with tracer.start_as_current_span(
        method,
        context=fallback if parent is None else parent,
        kind=SpanKind.SERVER,
        attributes={
            "rpc.system.name": "websocket",
            "rpc.method": method,
            "network.protocol.name": "websocket",
            "url.path": PATH,
        },
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield
        except BaseException as exc:  # a fault of ours: the socket closes with 1011
            span.set_attribute("error.type", type(exc).__qualname__)
            span.set_status(Status(StatusCode.ERROR))
            raise


def refused(code: str, message: str) -> None:
    """Mark the current message's span (when it has one) refused with ``code``."""
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attributes({"error.type": code, "rpc.response.status_code": code})
        if code in SERVER_FAULTS:
            span.set_status(Status(StatusCode.ERROR, message))
