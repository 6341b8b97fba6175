"""Renders a :class:`~service.emulator.steps.Plan` in Bedrock's ConverseStream wire format.

Every step becomes one event-stream frame, encoded ahead of time so that the streaming loop
only writes bytes. The ``metadata`` frame is the exception: it carries the measured latency,
so it is encoded when the stream reaches it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from service.emulator.eventstream import encode_event, encode_exception
from service.emulator.steps import (
    EmitReasoning,
    EmitSignature,
    EmitText,
    EmitToolInput,
    HttpError,
    RaiseException,
    ReportUsage,
    StartMessage,
    StartToolUse,
    Step,
    StopBlock,
    StopMessage,
    is_token,
)


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame ready to write; ``usage`` is set on the metadata frame, encoded late."""

    data: bytes
    is_token: bool = False
    usage: ReportUsage | None = None


def encode_metadata(usage: ReportUsage, latency_ms: int) -> bytes:
    """Encode the closing ``metadata`` event."""
    return encode_event(
        "metadata",
        {
            "usage": {
                "inputTokens": usage.input_tokens,
                "outputTokens": usage.output_tokens,
                "totalTokens": usage.input_tokens + usage.output_tokens,
            },
            "metrics": {"latencyMs": latency_ms},
        },
    )


def render_step(step: Step) -> Frame:
    """The frame for one plan step."""
    match step:
        case StartMessage(role=role):
            data = encode_event("messageStart", {"role": role})
        case StartToolUse(index=index, tool_use_id=tool_use_id, name=name):
            start = {"toolUse": {"toolUseId": tool_use_id, "name": name}}
            data = encode_event("contentBlockStart", {"contentBlockIndex": index, "start": start})
        case EmitText(index=index, text=text):
            data = _delta(index, {"text": text})
        case EmitReasoning(index=index, text=text):
            data = _delta(index, {"reasoningContent": {"text": text}})
        case EmitSignature(index=index, signature=signature):
            data = _delta(index, {"reasoningContent": {"signature": signature}})
        case EmitToolInput(index=index, fragment=fragment):
            data = _delta(index, {"toolUse": {"input": fragment}})
        case StopBlock(index=index):
            data = encode_event("contentBlockStop", {"contentBlockIndex": index})
        case StopMessage(stop_reason=stop_reason):
            data = encode_event("messageStop", {"stopReason": stop_reason})
        case ReportUsage():
            return Frame(b"", usage=step)
        case RaiseException(exception_type=exception_type, message=message):
            data = encode_exception(exception_type, message)
        case _:
            raise TypeError(f"unknown plan step: {step!r}")
    return Frame(data, is_token=is_token(step))


def _delta(index: int, delta: dict[str, object]) -> bytes:
    return encode_event("contentBlockDelta", {"contentBlockIndex": index, "delta": delta})


def render_steps(steps: tuple[Step, ...]) -> list[Frame]:
    """Frames for a whole plan, in order."""
    return [render_step(step) for step in steps]


def error_body(error: HttpError) -> tuple[dict[str, str], bytes]:
    """Headers and body of a restJson error answered before any stream."""
    headers = {"x-amzn-ErrorType": error.error_type, "Content-Type": "application/json"}
    return headers, json.dumps({"message": error.message}).encode("utf-8")
