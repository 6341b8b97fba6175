"""The spans of a query, named by OpenTelemetry's GenAI conventions (their latest experimental
names, ``gen_ai_latest_experimental``: this service never emitted an older version).

Only the OpenTelemetry API is used here; the SDK (provider, exporter) is set up by
:mod:`service.telemetry` when an endpoint is configured. Without one the tracer is the API's
no-op tracer: its spans record nothing, and the callers skip their attribute work by asking
``span.is_recording()`` first.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode, Tracer

NO_TRACER: Tracer = trace.NoOpTracer()

# Message content (prompts, answers, tool arguments and results) goes on spans only when this
# is true: a trace backend is often less guarded than the conversations themselves.
CAPTURE_CONTENT = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"

# Our providers' names as the conventions' gen_ai.provider.name knows them.
PROVIDER_NAMES = {"bedrock": "aws.bedrock", "openai": "openai"}
CANCELLED = "cancelled"


def capture_content() -> bool:
    """Whether spans carry message content (read when a span is recorded, so never when traces
    are off)."""
    return os.environ.get(CAPTURE_CONTENT, "").strip().lower() == "true"


def provider_name(provider: Any) -> str:
    name = getattr(provider, "name", "")
    return PROVIDER_NAMES.get(name, name or "unknown")


def model_of(agent: Any) -> str:
    """The model an agent asks for: its own, else its provider's default."""
    return getattr(agent, "model", "") or getattr(getattr(agent, "provider", None), "model_id", "") or ""


def start_query(tracer: Tracer, agent: Any, agent_name: str, session_id: str) -> Span:
    """The ``invoke_agent`` span of one query, a child of the caller's current span (the HTTP
    request's server span, itself continued from the client's ``traceparent``)."""
    span = tracer.start_span(f"invoke_agent {agent_name}", kind=SpanKind.INTERNAL)
    if span.is_recording():
        provider = getattr(agent, "provider", None)
        attributes = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": agent_name,
            "gen_ai.conversation.id": session_id,
            "gen_ai.provider.name": provider_name(provider),
        }
        model = model_of(agent)
        if model:
            attributes["gen_ai.request.model"] = model
        span.set_attributes(attributes)
    return span


def make_current(span: Span) -> None:
    """Make ``span`` the current one in the calling context (a run task's copied context: the
    spans its agent starts become its children). Never detached: the context dies with the task."""
    otel_context.attach(trace.set_span_in_context(span))


def end_query(span: Span, terminal: Any) -> None:
    """End a query's span at its terminal event: its usage, and ERROR with ``error.type`` when the
    query failed or was cancelled."""
    if not span.is_recording():
        return
    usage = getattr(terminal, "usage", None)
    if usage is not None:
        span.set_attribute("gen_ai.usage.input_tokens", usage.input_tokens)
        span.set_attribute("gen_ai.usage.output_tokens", usage.output_tokens)
    error_type = None
    if terminal.type == "error":
        error_type = getattr(terminal, "code", None) or "error"
        description = getattr(terminal, "error", "")
    elif getattr(terminal, "cancelled", False):
        error_type, description = CANCELLED, "the query was cancelled"
    if error_type is not None:
        span.set_attribute("error.type", error_type)
        span.set_status(Status(StatusCode.ERROR, description))
    span.end()


def fail(span: Span, error_type: str, description: str = "") -> None:
    """Mark a span failed (the caller ends it)."""
    if span.is_recording():
        span.set_attribute("error.type", error_type)
        span.set_status(Status(StatusCode.ERROR, description or error_type))


def traceparent(span: Span) -> str:
    """``span``'s W3C ``traceparent``, to keep with what others continue from ("" when traces
    are off)."""
    if not span.get_span_context().is_valid:
        return ""
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get("traceparent", "")


@contextmanager
def continued(tracer: Tracer, parent: str, name: str, attributes: dict[str, Any]) -> Iterator[Span]:
    """A span continuing the trace whose ``traceparent`` was kept (``parent``), for work done for
    a query on another instance than the one running it (an approval's answer): the query's trace
    stays one, and the span links to the request that did the work. Nothing without a kept parent
    or with traces off."""
    if not parent or tracer is NO_TRACER:
        yield trace.INVALID_SPAN
        return
    here = trace.get_current_span().get_span_context()
    links = [Link(here)] if here.is_valid else []
    context = propagate.extract({"traceparent": parent})
    with tracer.start_as_current_span(
        name, context=context, kind=SpanKind.INTERNAL, attributes=attributes, links=links
    ) as span:
        yield span
