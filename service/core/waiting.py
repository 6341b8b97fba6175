"""The spans of a query's waits on someone else: a person's approval of a tool call, and the
result of a call the client runs itself (OpenTelemetry; see :mod:`service.core.traces`).

Each wait is a span under the query's ``invoke_agent``, from the request to its answer, and ends
with the answer's outcome. Its ``traceparent`` travels in the request event, so the instance that
takes the answer (any of them, on a shared store) adds its own span to the same trace
(:func:`service.core.traces.continued`). A person who does not answer in time (``expired``), a
client tool that times out (``timeout``) or fails, and a query cancelled while it waits end the
span with status ERROR and their ``error.type``; a denial is an outcome, not an error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry.trace import Span, SpanKind, Tracer

from service import jsonsafe
from service.core.events import ClientToolResult, ToolApprovalResponse, ToolUse
from service.core.sessions import BY_TIMEOUT, Answer, Request
from service.core.traces import CANCELLED, capture_content, fail

TOOL_ERROR = "tool_error"
TIMEOUT = "timeout"
EXPIRED = "expired"


def start_approval(tracer: Tracer, use: ToolUse) -> Span:
    """The span of one tool call's wait for a person's approval."""
    span = tracer.start_span(f"tool_approval {use.tool}", kind=SpanKind.INTERNAL)
    if span.is_recording():
        span.set_attributes({"gen_ai.tool.name": use.tool, "gen_ai.tool.call.id": use.tool_use_id})
    return span


def start_client_tool(tracer: Tracer, use: ToolUse) -> Span:
    """The span of a call the client runs: an ``execute_tool`` like the service's own calls,
    whose time is the wait for the client's result."""
    span = tracer.start_span(f"execute_tool {use.tool}", kind=SpanKind.INTERNAL)
    if span.is_recording():
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": use.tool,
            "gen_ai.tool.call.id": use.tool_use_id,
            "gen_ai.tool.type": "function",
            "agentstream.tool.executor": "client",
        }
        if capture_content():
            attributes["gen_ai.tool.call.arguments"] = _json(use.input)
        span.set_attributes(attributes)
    return span


@contextmanager
def ended(spans: Sequence[Span], requests: Sequence[Request]) -> Iterator[dict[str, Answer]]:
    """End the wait spans of ``requests`` with the answers the caller puts in the dict it is
    given (by approval id); with the error, if the wait itself ended in one."""
    answers: dict[str, Answer] = {}
    try:
        yield answers
    except BaseException as exc:
        error_type = CANCELLED if isinstance(exc, asyncio.CancelledError) else type(exc).__qualname__
        for span in spans:
            fail(span, error_type, "the query stopped waiting")
            span.end()
        raise
    for span, request in zip(spans, requests, strict=True):
        if span.is_recording():
            _outcome(span, answers.get(request.approval_id))
        span.end()


def _outcome(span: Span, answer: Answer | None) -> None:
    if isinstance(answer, ToolApprovalResponse):
        span.set_attributes(
            {"agentstream.approval.approved": answer.approved, "agentstream.approval.by": answer.by}
        )
        if answer.by == BY_TIMEOUT:
            fail(span, EXPIRED, "nobody answered the approval in time")
        elif answer.reason:
            span.set_attribute("agentstream.approval.reason", answer.reason)
    elif isinstance(answer, ClientToolResult):
        if answer.by == BY_TIMEOUT:
            fail(span, TIMEOUT, "the client did not return the result in time")
        elif answer.error is not None:
            fail(span, TOOL_ERROR, answer.error)
        elif capture_content():
            span.set_attribute("gen_ai.tool.call.result", _json(answer.output))


def _json(value: Any) -> str:
    return value if isinstance(value, str) else jsonsafe.dumps(value)
