"""The vocabulary of a plan: the abstract steps of one streamed answer, and the :class:`Plan`.

:mod:`service.emulator.script` builds plans; the wire writers (:mod:`service.emulator.bedrock`,
:mod:`service.emulator.openai`) render their steps, and the server paces them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union


@dataclass(frozen=True, slots=True)
class StartMessage:
    """The assistant message begins."""

    role: str = "assistant"


@dataclass(frozen=True, slots=True)
class StartToolUse:
    """A tool-use block begins (text and reasoning blocks have no start step)."""

    index: int
    tool_use_id: str
    name: str


@dataclass(frozen=True, slots=True)
class EmitText:
    """One token of answer text."""

    index: int
    text: str


@dataclass(frozen=True, slots=True)
class EmitReasoning:
    """One token of reasoning text."""

    index: int
    text: str


@dataclass(frozen=True, slots=True)
class EmitSignature:
    """The signature that closes a reasoning block's content."""

    index: int
    signature: str


@dataclass(frozen=True, slots=True)
class EmitToolInput:
    """A fragment of a tool use's JSON input."""

    index: int
    fragment: str


@dataclass(frozen=True, slots=True)
class StopBlock:
    """A content block ends."""

    index: int


@dataclass(frozen=True, slots=True)
class StopMessage:
    """The assistant message ends with this stop reason."""

    stop_reason: str


@dataclass(frozen=True, slots=True)
class ReportUsage:
    """Token usage of the response (latency is measured by the writer)."""

    input_tokens: int
    output_tokens: int


@dataclass(frozen=True, slots=True)
class RaiseException:
    """An exception inside the stream; nothing follows it."""

    exception_type: str
    message: str


Step = Union[
    StartMessage,
    StartToolUse,
    EmitText,
    EmitReasoning,
    EmitSignature,
    EmitToolInput,
    StopBlock,
    StopMessage,
    ReportUsage,
    RaiseException,
]

# The steps that count as output tokens: these are paced and counted in usage.
TOKEN_STEPS: tuple[type, ...] = (EmitText, EmitReasoning, EmitToolInput)


def is_token(step: Step) -> bool:
    """True for a step that is an output token (paced, counted in usage)."""
    return isinstance(step, TOKEN_STEPS)


@dataclass(frozen=True, slots=True)
class HttpError:
    """An error answered with an HTTP status before any stream starts."""

    status: int
    error_type: str
    message: str


@dataclass(frozen=True, slots=True)
class Plan:
    """What to answer to one request: an HTTP error, or steps to stream."""

    steps: tuple[Step, ...] = ()
    http_error: HttpError | None = None
    user_text: str = ""
    ttft_ms: float | None = None
    tokens_per_second: float | None = None
    # ``[emu:stall]``: after this many output tokens the stream goes quiet for ``stall_ms``.
    stall_after_tokens: int | None = None
    stall_ms: float = 0.0

    @property
    def stop_reason(self) -> str | None:
        """The stop reason the plan ends with, if it gets that far."""
        for step in self.steps:
            if isinstance(step, StopMessage):
                return step.stop_reason
        return None
