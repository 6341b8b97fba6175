"""The agent loop's spans: ``chat {model}`` per model turn and ``execute_tool {tool}`` per tool
call (OpenTelemetry's GenAI conventions; see :mod:`service.core.traces` for the query's own).

Everything here is per turn or per call, never per token: a turn's time to first chunk is taken
by the loop where it already notes that the client has seen part of the turn.
"""

from __future__ import annotations

import contextvars
import dataclasses
import time
from typing import Any
from urllib.parse import urlsplit

from opentelemetry import propagate, trace
from opentelemetry.trace import Span, SpanKind, Tracer

from service import jsonsafe
from service.agent.calls import error_type
from service.agent.query import Turn
from service.agent.tools import ToolOutcome
from service.core.traces import CANCELLED, capture_content, fail, make_current, provider_name
from service.errors import ProviderError
from service.providers.base import ModelProvider, ModelRequest

TOOL_ERROR = "tool_error"
now = time.perf_counter  # when a turn started and first answered: its time to first chunk


def _server(provider: ModelProvider) -> tuple[str, int | None]:
    url = getattr(provider, "server_url", "")
    if not url:
        return "", None
    parts = urlsplit(url)
    return parts.hostname or "", parts.port


def start_chat(tracer: Tracer, provider: ModelProvider, request: ModelRequest) -> Span:
    model = request.model or getattr(provider, "model_id", "") or ""
    span = tracer.start_span(f"chat {model}".rstrip(), kind=SpanKind.CLIENT)
    if span.is_recording():
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": provider_name(provider),
            "gen_ai.request.model": model,
            "gen_ai.request.max_tokens": request.max_tokens,
        }
        if request.temperature is not None:
            attributes["gen_ai.request.temperature"] = request.temperature
        if capture_content():
            attributes["gen_ai.input.messages"] = jsonsafe.dumps([_message(m) for m in request.messages])
            if request.system:
                attributes["gen_ai.system_instructions"] = jsonsafe.dumps(
                    [{"type": "text", "content": request.system}]
                )
        address, port = _server(provider)
        if address:
            attributes["server.address"] = address
        if port is not None:
            attributes["server.port"] = port
        span.set_attributes(attributes)
    return span


def carry(span: Span, request: ModelRequest) -> ModelRequest:
    """``request`` with the turn's trace context in its headers, for the upstream to continue the
    trace (both wires send them); as it is when traces are off."""
    if not span.get_span_context().is_valid:
        return request
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=trace.set_span_in_context(span))
    return dataclasses.replace(request, headers=tuple(carrier.items()))


def retried(span: Span, error: ProviderError, attempt: int, delay_s: float) -> None:
    """A turn's stream failed with a retryable error (throttling) and is asked again."""
    if span.is_recording():
        span.add_event(
            "gen_ai.retry",
            {"error.type": error.code, "retry.attempt": attempt + 1, "retry.delay_s": delay_s},
        )


def end_chat(span: Span, turn: Turn, started: float, first_at: float, stopped: BaseException | None) -> None:
    """End a model turn's span with what the turn produced, or how it failed."""
    if span.is_recording():
        if first_at:
            span.set_attribute("gen_ai.response.time_to_first_chunk", first_at - started)
        result = turn.result
        if result is not None:
            attributes: dict[str, Any] = {
                "gen_ai.response.finish_reasons": (result.stop_reason,),
                "gen_ai.usage.input_tokens": result.usage.input_tokens,
                "gen_ai.usage.output_tokens": result.usage.output_tokens,
            }
            if result.response_id:
                attributes["gen_ai.response.id"] = result.response_id
            if result.response_model:
                attributes["gen_ai.response.model"] = result.response_model
            if capture_content():
                attributes["gen_ai.output.messages"] = output_messages(result.message, result.stop_reason)
            span.set_attributes(attributes)
        failed = error_type(turn, stopped)  # the metrics' error_type too: the two agree
        if failed:
            description = turn.error.message if turn.error is not None else str(stopped or "")
            fail(span, failed, description or "the turn was stopped")
    span.end()


def start_tool(tracer: Tracer, tool: str, tool_use_id: str, input: Any) -> Span:
    span = tracer.start_span(f"execute_tool {tool}", kind=SpanKind.INTERNAL)
    if span.is_recording():
        attributes = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": tool,
            "gen_ai.tool.call.id": tool_use_id,
            "gen_ai.tool.type": "function",
        }
        if capture_content():
            attributes["gen_ai.tool.call.arguments"] = jsonsafe.dumps(input)
        span.set_attributes(attributes)
    return span


def context_of(span: Span) -> contextvars.Context | None:
    """A copy of the current context with ``span`` current in it, for the task that does the
    span's work (a tool call: an MCP server's request then carries the span's trace context);
    None when traces are off."""
    if not span.get_span_context().is_valid:
        return None
    context = contextvars.copy_context()
    context.run(make_current, span)
    return context


def end_tool(span: Span | None, outcome: ToolOutcome) -> None:
    """End a tool call's span: ERROR with ``error.type`` when the model is told the call failed."""
    if span is None:
        return
    if capture_content() and span.is_recording():
        span.set_attribute("gen_ai.tool.call.result", outcome.result)
    if outcome.is_error:
        fail(span, outcome.error_type or TOOL_ERROR, outcome.result[:200])
    span.end()


def abandon(span: Span) -> None:
    """End the span of a call the query stopped waiting for (it was cancelled)."""
    fail(span, CANCELLED, "the query stopped before the tool answered")
    span.end()


# Message content as the GenAI conventions shape it (``gen_ai.input.messages`` and
# ``gen_ai.output.messages``: a role and its parts), from Bedrock's message format, which the
# agent loop speaks on both wires.


def _part(block: Any) -> dict[str, Any]:
    if not isinstance(block, dict):
        return {"type": "unknown"}
    if "text" in block:
        return {"type": "text", "content": block["text"]}
    use = block.get("toolUse")
    if isinstance(use, dict):
        return {
            "type": "tool_call",
            "id": use.get("toolUseId"),
            "name": use.get("name"),
            "arguments": use.get("input"),
        }
    result = block.get("toolResult")
    if isinstance(result, dict):
        texts = [
            item.get("text", item.get("json"))
            for item in result.get("content") or []
            if isinstance(item, dict)
        ]
        response: Any = texts[0] if len(texts) == 1 else texts
        return {"type": "tool_call_response", "id": result.get("toolUseId"), "response": response}
    reasoning = block.get("reasoningContent")
    if isinstance(reasoning, dict):
        text = (reasoning.get("reasoningText") or {}).get("text", "")
        return {"type": "reasoning", "content": text}
    return {"type": next(iter(block), "unknown")}  # an image or a document: named, not copied


def _message(message: Any) -> dict[str, Any]:
    blocks = message.get("content") if isinstance(message, dict) else None
    parts = [_part(block) for block in blocks or []]
    role = message.get("role", "user") if isinstance(message, dict) else "user"
    if parts and all(part["type"] == "tool_call_response" for part in parts):
        role = "tool"  # Bedrock carries tool results in a user message; the conventions do not
    return {"role": role, "parts": parts}


def output_messages(message: dict[str, Any], finish_reason: str) -> str:
    return jsonsafe.dumps([{**_message(message), "finish_reason": finish_reason}])
