"""Canonical events: the one shape every provider produces and every transport projects.

A run of the agent is told as a sequence of these events. They are appended to a session's
event log, which gives each one an integer id; transports turn them into their wire dialect
with the pure functions in ``service.transports.stream.session``.

Events are immutable pydantic models with a ``type`` discriminator, so a log stored outside the
process (Redis) can rebuild them with :data:`EVENT_ADAPTER`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, TypeAdapter

from service import jsonsafe


def _finite(value: Any) -> Any:
    # The service's writers refuse NaN and infinities (strict JSON) while pydantic's
    # model_dump_json writes them as null: an event that never holds one reads the same on
    # every wire and in every store. The edges refuse them, so one here is a bug, made loud.
    if not jsonsafe.finite(value):
        raise ValueError("holds NaN or an infinite number, which JSON cannot carry")
    return value


# A JSON value from a client or a model (a tool's input): strict JSON, no NaN or infinity.
JsonValue = Annotated[Any, AfterValidator(_finite)]


class Usage(BaseModel):
    """Token usage, always named the same way on every wire."""

    model_config = ConfigDict(frozen=True)

    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            total_tokens=self.total_tokens + other.total_tokens,
        )


class ToolCall(BaseModel):
    """A finished tool call as reported in a run's summary."""

    model_config = ConfigDict(frozen=True)

    tool: str
    input: JsonValue
    tool_use_id: str
    is_error: bool = False
    result: str | None = None


class _Event(BaseModel):
    model_config = ConfigDict(frozen=True, allow_inf_nan=False)


class RunStarted(_Event):
    """A query began: the user's message is about to go to the model.

    ``message_id`` is the user's message in the conversation (the client's own id where it sent
    one); ``reply_id`` the assistant's answer to it, which every face streams as its message id
    (see :mod:`service.core.conversation`). A query that answers a message again (a regenerate)
    names the message it answers and adds none.
    """

    type: Literal["run_started"] = "run_started"
    run_id: str
    message: str
    max_turns: int
    at: float = Field(default_factory=time.time)
    message_id: str = ""
    reply_id: str = ""
    # What the face that started the query keeps of its request (RunOptions.request).
    request: dict[str, Any] | None = None


class TextDelta(_Event):
    """A piece of the assistant's answer."""

    type: Literal["text_delta"] = "text_delta"
    text: str
    turn: int = 1


# What every text delta is given: one set for all of them, where pydantic makes one per event.
# A set per event, kept for the life of a session's log, would be one more object per token for
# the garbage collector to walk (measured: docs/benchmarks.md, section Per-run work and the sink
# (c25db1d)). No one changes it: the events are frozen, and pydantic copies the set before adding
# to it (``model_copy(update=...)``).
_TEXT_DELTA_FIELDS = {"text", "turn"}


def text_delta(text: str, turn: int) -> TextDelta:
    """``TextDelta(text=text, turn=turn)``, the event made once per token, with the shared set of
    field names."""
    event = TextDelta(text=text, turn=turn)
    object.__setattr__(event, "__pydantic_fields_set__", _TEXT_DELTA_FIELDS)
    return event


class ReasoningDelta(_Event):
    """A piece of the model's reasoning, for models that expose it."""

    type: Literal["reasoning_delta"] = "reasoning_delta"
    text: str
    turn: int = 1


class ToolUseStart(_Event):
    """The model began a tool-use block."""

    type: Literal["tool_use_start"] = "tool_use_start"
    tool: str
    tool_use_id: str
    turn: int = 1


class ToolInputDelta(_Event):
    """A fragment of a tool use's JSON input, as the model streams it."""

    type: Literal["tool_input_delta"] = "tool_input_delta"
    tool_use_id: str
    delta: str
    turn: int = 1


class ToolUse(_Event):
    """A tool-use block is complete and its input parsed."""

    type: Literal["tool_use"] = "tool_use"
    tool: str
    tool_use_id: str
    input: JsonValue
    turn: int = 1


class ToolExecuting(_Event):
    """A tool started running."""

    type: Literal["tool_executing"] = "tool_executing"
    tool: str
    tool_use_id: str
    turn: int = 1


class ToolResult(_Event):
    """A tool finished; ``is_error`` marks a failure the model is told about."""

    type: Literal["tool_result"] = "tool_result"
    tool: str
    tool_use_id: str
    result: str
    is_error: bool = False
    turn: int = 1


class TurnCompleted(_Event):
    """One model turn ended: its stop reason, its usage and the running total."""

    type: Literal["turn_completed"] = "turn_completed"
    turn: int
    stop_reason: str
    usage: Usage
    total_usage: Usage
    latency_ms: int | None = None


class PlanCreated(_Event):
    """The model wrote a plan before acting (when planning is on)."""

    type: Literal["plan"] = "plan"
    plan: str
    usage: Usage = Field(default_factory=Usage)


class StepCompleted(_Event):
    """One model turn and what it led to: its text, its tool calls and their results."""

    type: Literal["step_completed"] = "step_completed"
    turn: int
    step_number: int = 0
    text: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    observations: list[str] = Field(default_factory=list)
    error: str | None = None
    usage: Usage = Field(default_factory=Usage)


class RunDone(_Event):
    """The query finished; always the last event of a query that did not fail."""

    type: Literal["done"] = "done"
    turns: int
    output: str = ""
    final_step: int = 0
    tool_calls: list[ToolCall] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    stop_reason: str = "end_turn"
    truncated: bool = False
    max_turns_reached: bool = False
    cancelled: bool = False
    agent: str = ""  # the agent that answered (see service.core.agents)


class RunError(_Event):
    """The query failed; the last event of that query."""

    type: Literal["error"] = "error"
    error: str
    code: str = "internal_error"
    turns: int = 0
    recoverable: bool = False
    usage: Usage = Field(default_factory=Usage)


class ToolApprovalRequest(_Event):
    """A tool call waits for a person's approval (``AGENT_TOOLS_REQUIRE_APPROVAL``).

    ``expires_at`` is epoch seconds: unanswered by then, the call counts as denied (``expired``).
    """

    type: Literal["tool_approval_request"] = "tool_approval_request"
    approval_id: str
    tool: str
    tool_use_id: str
    input: JsonValue
    expires_at: float
    turn: int = 1
    # The W3C traceparent of the span that waits for the answer, so that an answer taken on
    # another instance joins the query's trace (service.core.traces.continued); not on any wire.
    trace: str = ""


class ToolApprovalResponse(_Event):
    """The answer to a :class:`ToolApprovalRequest`, logged once by whoever answered first.

    ``input`` is an edited input the tool runs with instead of the model's (approved only);
    ``by`` says where the answer came from (``http``, ``ws``, ``mcp``, ``timeout``, ...).
    """

    type: Literal["tool_approval_response"] = "tool_approval_response"
    approval_id: str
    approved: bool
    reason: str = ""
    by: str = ""
    input: JsonValue = None


class ClientToolRequest(_Event):
    """A call of a tool the client runs itself waits for the client's result.

    Held like an approval (:mod:`service.core.approvals`): pending in the store under
    :attr:`approval_id`, answered once by a :class:`ClientToolResult` from any tab or instance,
    and given an error result at ``expires_at`` (epoch seconds) if nobody answered.
    """

    type: Literal["client_tool_request"] = "client_tool_request"
    tool: str
    tool_use_id: str
    input: JsonValue
    expires_at: float
    turn: int = 1
    trace: str = ""  # as a ToolApprovalRequest's

    @property
    def approval_id(self) -> str:
        """The key it is pending under, beside the approvals (whose ids start ``ap_``)."""
        return client_tool_key(self.tool_use_id)


class ClientToolResult(_Event):
    """The client's result of a :class:`ClientToolRequest`: its ``output`` (any JSON), or an
    ``error`` the model is told; ``by`` says where it came from (``timeout`` for the expiry's)."""

    type: Literal["client_tool_result"] = "client_tool_result"
    tool_use_id: str
    output: JsonValue = None
    error: str | None = None
    by: str = ""

    @property
    def approval_id(self) -> str:
        return client_tool_key(self.tool_use_id)

    @property
    def approved(self) -> bool:
        """As an approval's answer: whether the call succeeded (the stores keep the state)."""
        return self.error is None


def client_tool_key(tool_use_id: str) -> str:
    """Where a client tool call is kept among a session's approvals."""
    return f"ct:{tool_use_id}"


class ConversationRewound(_Event):
    """The conversation was cut back to before the message ``message_id`` (a regenerate, an edit,
    a rollback): ``kept`` messages remain, and ``usage`` is the session's usage counted from them."""

    type: Literal["conversation_rewound"] = "conversation_rewound"
    message_id: str
    kept: int
    removed: int
    usage: Usage = Field(default_factory=Usage)


class ContextTrimmed(_Event):
    """The conversation outgrew the model's window: its oldest whole turns were left out of what
    was sent (the session keeps every message). Logged when the number left out changes."""

    type: Literal["context_trimmed"] = "context_trimmed"
    turn: int
    dropped_messages: int
    kept_messages: int
    estimated_tokens: int
    max_tokens: int


class StatusChange(_Event):
    """The session's status changed (idle, running, waiting, cancelled, ...)."""

    type: Literal["status_change"] = "status_change"
    status: str


Event = Annotated[
    RunStarted
    | TextDelta
    | ReasoningDelta
    | ToolUseStart
    | ToolInputDelta
    | ToolUse
    | ToolExecuting
    | ToolResult
    | TurnCompleted
    | PlanCreated
    | StepCompleted
    | RunDone
    | RunError
    | ToolApprovalRequest
    | ToolApprovalResponse
    | ClientToolRequest
    | ClientToolResult
    | ConversationRewound
    | ContextTrimmed
    | StatusChange,
    Field(discriminator="type"),
]

EVENT_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)

TERMINAL_TYPES = frozenset({"done", "error"})


def is_terminal(event: _Event) -> bool:
    """True for the event that ends a query (``done`` or ``error``)."""
    return getattr(event, "type", None) in TERMINAL_TYPES


Sink = Callable[[Event], bool]
"""Takes one event synchronously, where a provider read it: True when it dealt with it (the run
logged it), and the provider then does not yield it; False to have it yielded as usual.

A run hands one down to its provider for the one event that comes per token, the text delta: a
delta that climbed the agent's generators back to the run (four of them, each a suspension and a
resumption per token) cost as much as logging it. Providers offer it nothing else.
"""
