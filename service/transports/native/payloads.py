"""The native face's own stream payloads, one ``TypedDict`` per shape: the agent dialect's, the
steps dialect's and the self-test's (see :mod:`service.transports.stream.payloads` for the rules
these follow and for the session dialect's, which other faces carry too)."""

from typing import Annotated, Any, Literal, NotRequired

from pydantic import Field
from typing_extensions import TypeAliasType, TypedDict

from service.transports.stream.payloads import Count, Done, EndFields, Usage

# The agent dialect (POST /agent/stream).


class AgentTextDelta(TypedDict):
    """A piece of the answer."""

    type: Literal["text_delta"]
    text: str


class AgentToolUseStart(TypedDict):
    """The model began a tool call."""

    type: Literal["tool_use_start"]
    tool: str
    id: str


class AgentToolInputDelta(TypedDict):
    """A fragment of a tool call's JSON input."""

    type: Literal["tool_input_delta"]
    delta: str
    id: str


class AgentToolExecuting(TypedDict):
    """A tool started running."""

    type: Literal["tool_executing"]
    tool: str
    id: str


class AgentToolResult(TypedDict):
    """A tool finished; ``is_error`` only on a failure."""

    type: Literal["tool_result"]
    tool: str
    result: str
    id: str
    is_error: NotRequired[bool]


class AgentReasoningDelta(TypedDict):
    """A piece of the model's reasoning."""

    type: Literal["reasoning_delta"]
    text: str


class AgentDone(EndFields):
    """The run finished; the last event."""

    type: Literal["done"]


class AgentError(TypedDict):
    """The run failed; the last event."""

    type: Literal["error"]
    error: str
    turns: Count
    code: str
    recoverable: bool


AgentEvent = TypeAliasType(
    "AgentEvent",
    Annotated[
        AgentTextDelta
        | AgentToolUseStart
        | AgentToolInputDelta
        | AgentToolExecuting
        | AgentToolResult
        | AgentReasoningDelta
        | AgentDone
        | AgentError,
        Field(
            discriminator="type", description="An event in the **agent** dialect; `done` or `error` is last."
        ),
    ],
)


# The steps dialect (GET /sessions/{id}/stream).


class StepsMessage(TypedDict):
    """The user's question."""

    type: Literal["message"]
    role: Literal["user"]
    content: str
    timestamp: Annotated[str, Field(description="ISO 8601, UTC.")]


class PlanningStep(TypedDict):
    """The plan, as step 1 (when planning is on)."""

    type: Literal["step"]
    step_type: Literal["planning"]
    step_number: int
    plan: str
    token_usage: Usage


class ActionStep(TypedDict):
    """A model turn: its text, its tool calls (as JSON) and what they returned."""

    type: Literal["step"]
    step_type: Literal["action"]
    step_number: int
    model_output: str
    code_action: str | None
    observations: str | None
    error: str | None
    token_usage: Usage


class Final(TypedDict):
    """The answer (not after a cancel)."""

    type: Literal["final"]
    step_number: int
    output: str


class ApprovalStep(TypedDict):
    """A tool call waits for a person's approval (answer it with
    `POST /sessions/{id}/approvals/{approval_id}`)."""

    type: Literal["step"]
    step_type: Literal["approval"]
    approval_id: str
    tool: str
    input: Any
    expires_at: float


class StepsError(TypedDict):
    """The query failed; the last event."""

    type: Literal["error"]
    error: str
    code: str


# Two shapes share ``type: step`` (told apart by ``step_type``), so no discriminator here.
StepsEvent = TypeAliasType(
    "StepsEvent",
    Annotated[
        StepsMessage | PlanningStep | ActionStep | ApprovalStep | Final | Done | StepsError,
        Field(description="An event in the **steps** dialect; `done` or `error` is last."),
    ],
)


# GET /selftest/stream.


class SelftestTick(TypedDict):
    """One tick; ``idle_ms`` on the last."""

    type: Literal["tick"]
    n: Annotated[int, Field(ge=1)]
    of: Annotated[int, Field(ge=1)]
    ts: Annotated[float, Field(description="The server's clock when it was written, epoch seconds.")]
    interval_ms: int
    idle_ms: NotRequired[int]


class SelftestEnd(TypedDict):
    """After the last tick."""

    type: Literal["end"]
    ticks: int


SelftestEvent = TypeAliasType(
    "SelftestEvent",
    Annotated[
        SelftestTick | SelftestEnd, Field(discriminator="type", description="`tick` events, then `end`.")
    ],
)
