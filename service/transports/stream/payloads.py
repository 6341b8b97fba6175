"""The wire payloads of the dialects, one ``TypedDict`` per shape.

The dialect functions (:mod:`service.transports.stream.session`) build plain dicts of these types, so a
type checker holds them to it, and ``GET /openapi.json`` (:mod:`service.transports.openapi.document`)
describes the streams from the same types through pydantic's ``TypeAdapter``: one definition of
each shape. They are types only; nothing is validated or built per event.

A class's docstring and its fields' ``Field`` metadata become the published description and
constraints. Field names are contracts (../shared/DESIGN.md): add fields, never rename or remove.
Every union is a named alias, so the document refers to it by that name.
"""

from typing import Annotated, Any, Literal, NotRequired

from pydantic import Field
from typing_extensions import TypeAliasType, TypedDict

Count = Annotated[int, Field(ge=0)]
Status = Annotated[
    str,
    Field(
        description="`idle`, `running` (a query runs in the background) or `waiting` (its tool call "
        "waits for a person's approval).",
        examples=["idle", "running", "waiting"],
    ),
]


class Usage(TypedDict):
    """Token usage, named the same way on every wire."""

    input_tokens: Count
    output_tokens: Count
    total_tokens: Count


class ToolCall(TypedDict):
    """A finished tool call as a run's summary reports it."""

    tool: str
    input: Annotated[Any, Field(description="The tool's input as the model gave it (usually an object).")]
    tool_use_id: str
    result: NotRequired[str]
    is_error: NotRequired[bool]


class EndFields(TypedDict):
    """How a run ended, in every dialect's ``done`` and ``POST /agent/run``'s reply; a flag only when set."""

    turns: Count
    tool_calls: list[ToolCall]
    usage: Usage
    stop_reason: str
    truncated: NotRequired[bool]
    max_turns_reached: NotRequired[bool]
    cancelled: NotRequired[bool]
    agent: NotRequired[Annotated[str, Field(description="The agent that answered (`GET /agents`).")]]


# The session dialect (GET /sessions/{id}/events, polling, WebSocket).


class Logged(TypedDict):
    """Where an event sits in the session's log; a made-up event (no log entry) has neither."""

    id: NotRequired[Annotated[int, Field(ge=1)]]
    ts: NotRequired[Annotated[float, Field(description="When it was logged, epoch seconds.")]]


class AssistantText(Logged):
    """A piece of the answer; ``first_id`` when a lagging reader gets several merged into one."""

    type: Literal["assistant_text"]
    text: str
    first_id: NotRequired[int]


class ReasoningText(Logged):
    """A piece of the model's reasoning."""

    type: Literal["reasoning_text"]
    text: str


class SessionToolUseStart(Logged):
    """The model began a tool call."""

    type: Literal["tool_use_start"]
    toolName: str
    toolUseId: str


class SessionToolInputDelta(Logged):
    """A fragment of a tool call's JSON input."""

    type: Literal["tool_input_delta"]
    toolUseId: str
    delta: str


class ToolUse(Logged):
    """A tool call is complete, its input parsed."""

    type: Literal["tool_use"]
    toolName: str
    toolInput: Any
    toolUseId: str


class SessionToolExecuting(Logged):
    """A tool started running."""

    type: Literal["tool_executing"]
    toolName: str
    toolUseId: str


class SessionToolResult(Logged):
    """A tool finished."""

    type: Literal["tool_result"]
    toolUseId: str
    toolName: str
    result: str
    isError: bool


class StatusChange(Logged):
    """The session's status changed (`running`, `idle`, `cancelled`, ...)."""

    type: Literal["status_change"]
    status: str


class ApprovalRequest(Logged):
    """A tool call waits for a person's approval; answer it with
    `POST /sessions/{id}/approvals/{approval_id}` before `expires_at` (epoch seconds), or it
    counts as denied with the reason `expired`."""

    type: Literal["tool_approval_request"]
    approval_id: str
    toolUseId: str
    toolName: str
    toolInput: Any
    expires_at: float


class ApprovalResponse(Logged):
    """The answer to a tool approval, logged once: `by` says where it came from (`http`, `ws`,
    `mcp`, or `timeout` for an expired request); `toolInput` is an approver's edited input."""

    type: Literal["tool_approval_response"]
    approval_id: str
    approved: bool
    reason: str
    by: str
    toolInput: NotRequired[Any]


class ClientToolRequest(Logged):
    """A call of a tool the client runs itself (a browser-side tool) waits for its result:
    `POST /sessions/{id}/tool-results/{toolUseId}` before `expires_at` (epoch seconds), or the call
    gets an error result and the model goes on."""

    type: Literal["client_tool_request"]
    toolUseId: str
    toolName: str
    toolInput: Any
    expires_at: float


class ClientToolResult(Logged):
    """A client tool's result, logged once: its `output`, or its `error`; `by` says where it came
    from (`http`, `ws`, `ai-sdk`, `ag-ui`, or `timeout`)."""

    type: Literal["client_tool_result"]
    toolUseId: str
    output: NotRequired[Any]
    error: NotRequired[str]
    by: str


class ConversationRewound(Logged):
    """The conversation was cut back to before the message `message_id` (a regenerate, an edit, a
    rollback): `kept` messages remain (`removed` went), and `usage` is the session's usage counted
    from them. A client showing the conversation drops that message and everything after it."""

    type: Literal["conversation_rewound"]
    message_id: str
    kept: Count
    removed: Count
    usage: Usage


class Processing(Logged):
    """A query began: `message_id` is the user's message (the client's own id where it sent one),
    `reply_id` the answer's, the id each face streams for it."""

    type: Literal["processing"]
    run_id: str
    message: str
    message_id: NotRequired[str]
    reply_id: NotRequired[str]


class TurnUsage(Logged):
    """A model turn ended: its stop reason, its usage and the running total."""

    type: Literal["usage"]
    turn: int
    stop_reason: str
    usage: Usage
    total_usage: Usage
    latency_ms: int | None


class ContextTrimmed(Logged):
    """The oldest whole turns of the conversation were left out of what the model was sent,
    to keep within `AGENT_CONTEXT_MAX_TOKENS`; the session still holds them."""

    type: Literal["context_trimmed"]
    turn: int
    dropped_messages: Count
    kept_messages: Count
    estimated_tokens: Count
    max_tokens: Count


class Plan(Logged):
    """The model wrote a plan before acting."""

    type: Literal["plan"]
    plan: str
    usage: Usage


class Step(Logged):
    """A model turn and what it led to."""

    type: Literal["step"]
    turn: int
    step_number: int
    text: str
    tool_calls: list[ToolCall]
    error: str | None
    usage: Usage


class DoneFields(EndFields):
    """How a query ended, in the session and steps dialects: with the whole answer."""

    output: str


class Done(DoneFields):
    """The query finished; the last event of a query."""

    type: Literal["done"]


class SessionDone(Logged, Done):
    """The query finished; the last event of a query."""


class SessionError(Logged):
    """The query failed; the last event of that query."""

    type: Literal["error"]
    message: str
    recoverable: bool
    code: str
    turns: Count
    usage: Usage


SessionPayload = TypeAliasType(
    "SessionPayload",
    Annotated[
        Processing
        | StatusChange
        | AssistantText
        | ReasoningText
        | SessionToolUseStart
        | SessionToolInputDelta
        | SessionToolExecuting
        | ToolUse
        | SessionToolResult
        | TurnUsage
        | ContextTrimmed
        | Plan
        | Step
        | SessionDone
        | SessionError
        | ApprovalRequest
        | ApprovalResponse
        | ClientToolRequest
        | ClientToolResult
        | ConversationRewound,
        Field(
            discriminator="type", description="An event in the **session** dialect; `type` names its shape."
        ),
    ],
)
# A logged event always has its place in the log, so here ``id`` and ``ts`` are required.
SessionEvent = TypeAliasType(
    "SessionEvent",
    Annotated[
        SessionPayload,
        Field(
            description="An event in the **session** dialect as the log holds it, with its `id` and `ts`.",
            json_schema_extra={"required": ["id", "ts"]},
        ),
    ],
)


class Heartbeat(TypedDict):
    """Sent (without an id) while a session stream is idle."""

    type: Literal["heartbeat"]
    last_id: Count
    status: Status


class StreamError(TypedDict):
    """A session stream's last event (no id): its reader fell behind the purge horizon, or the store left."""

    type: Literal["error"]
    message: str
    code: Literal["events_purged", "store_unavailable"]
    recoverable: bool
    last_id: Count
    oldest_id: NotRequired[int]


SessionStreamEvent = TypeAliasType(
    "SessionStreamEvent",
    Annotated[
        SessionPayload | Heartbeat | StreamError,
        Field(
            description=(
                "A `SessionPayload` (with `id` and `ts` when it comes from the log), or what the stream "
                "makes up for one client, without an id: the `status_change` sent on joining, a "
                "`heartbeat` while idle, an `error` with `code` `events_purged` or `store_unavailable`."
            )
        ),
    ],
)
