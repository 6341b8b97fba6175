"""The JSON reply bodies of the HTTP routes, one ``TypedDict`` per shape.

Like :mod:`service.transports.stream.payloads` for the streams: the shapes a handler answers with, which
``GET /openapi.json`` publishes through pydantic's ``TypeAdapter`` (docstrings and ``Field``
metadata become descriptions and constraints). Fields may be added, never renamed or removed.
"""

from typing import Annotated, Any, Literal, NotRequired

from pydantic import Field
from typing_extensions import TypedDict

from service.transports.stream.payloads import (
    ApprovalRequest,
    ClientToolRequest,
    Count,
    EndFields,
    SessionEvent,
    Status,
    Usage,
)

ErrorText = Annotated[str, Field(description="What went wrong, for a person.")]
Snapshot = Annotated[
    dict[str, Any],
    Field(
        description=(
            "The conversation so far, the running query's text and finished tool calls with their "
            "results, and the usage to date."
        )
    ),
]


class Error(TypedDict):
    """Every error reply; some carry more fields."""

    error: ErrorText
    code: NotRequired[Annotated[str, Field(description="A machine-readable code, where there is one.")]]


class FieldError(TypedDict):
    """One field of a body that is not what it should be."""

    field: str
    message: str


class ValidationError(Error):
    """422: a JSON body of the wrong shape (or a text over the length limit)."""

    details: NotRequired[list[FieldError]]


class Purged(Error):
    """410: the events after the id asked for are gone; rebuild from ``snapshot``, go on from ``last_id``."""

    oldest_id: int
    last_id: NotRequired[int]
    snapshot: NotRequired[Snapshot]


class AgentRunResult(EndFields):
    """The run as one reply: the whole text and the ``done`` event's fields."""

    response: str


class AgentRunFailure(TypedDict):
    """503 from ``POST /agent/run``: the run failed upstream; what it produced so far."""

    error: ErrorText
    code: Annotated[str, Field(examples=["throttlingException", "InternalServerException"])]
    turns: Count
    response: str
    usage: Usage


class SessionCreated(TypedDict):
    """A new, idle session, and the agent it was made for."""

    id: str
    status: Status
    agent: str


class AgentDescription(TypedDict):
    """One of the agents a session may be made for."""

    name: str
    description: str
    provider: str
    model: str
    tools: list[str]
    client_tools: bool


class AgentList(TypedDict):
    """``GET /agents``: every agent, and the one a session gets when it names none."""

    agents: list[AgentDescription]
    default: str


class Session(TypedDict):
    """A session's status and conversation."""

    id: str
    status: Status
    messages: Annotated[
        list[dict[str, Any]],
        Field(description="The conversation in Bedrock's Converse format (`role`, `content` blocks)."),
    ]
    usage: Usage
    last_event_id: Count
    agent: Annotated[
        str, Field(description="The agent the session was made for; it answers every query in it.")
    ]
    title: NotRequired[Annotated[str, Field(description="With the session database: its title.")]]
    created_at: NotRequired[Annotated[float, Field(description="With the database: made at (epoch s).")]]
    updated_at: NotRequired[Annotated[float, Field(description="With the database: last updated (epoch s).")]]
    pending_approvals: Annotated[
        list[ApprovalRequest],
        Field(description="The tool calls waiting for a person's approval, as their requests were logged."),
    ]
    pending_tool_calls: Annotated[
        list[ClientToolRequest],
        Field(description="The calls of client (browser-side) tools waiting for their results."),
    ]


class SessionSummary(TypedDict):
    """One of the caller's sessions, as ``GET /sessions`` lists it."""

    id: str
    title: Annotated[str, Field(description="The first message, shortened, until renamed.")]
    created_at: float
    updated_at: float
    status: Status
    usage: Usage
    last_event_id: Count
    agent: Annotated[str, Field(description="The agent the session was made for.")]


class SessionList(TypedDict):
    """A page of the caller's sessions, last updated first."""

    sessions: list[SessionSummary]
    next_before: Annotated[
        str | None, Field(description="Pass as `before` for the next page; null on the last page.")
    ]


class SessionRenamed(TypedDict):
    """The session's new title."""

    id: str
    title: str
    status: Status


class ApprovalAnswered(TypedDict):
    """The approval's answer, as logged (the same answer sent again gets this reply again)."""

    approval_id: str
    approved: bool


class MessageAccepted(TypedDict):
    """A query was started (``run_id``), or queued behind the running one (``queued``, with
    ``multitask_strategy: enqueue``; ``status`` is then ``queued``)."""

    id: str
    status: Annotated[str, Field(description="The session's status, or `queued`.")]
    run_id: NotRequired[str]
    queued: NotRequired[Annotated[int, Field(ge=1, description="Its place in the queue (1: next).")]]
    after_id: Annotated[
        int,
        Field(
            ge=0, description="Resume from this id (`Last-Event-ID`, `since_index`) to see all of this query."
        ),
    ]


class ToolResultAccepted(TypedDict):
    """A client tool's result was taken; the query that waited on it goes on."""

    tool_call_id: str
    accepted: bool


class CancelAccepted(TypedDict):
    """A cancel was asked for."""

    id: str
    status: Status
    cancelled: Annotated[bool, Field(description="Whether a query was running.")]


class Poll(TypedDict):
    """The events after ``since_index``."""

    events: list[SessionEvent]
    next_index: Annotated[int, Field(ge=0, description="The `since_index` to pass next time.")]
    status: Status
    last_id: Count
    oldest_id: Count
    purged: Annotated[
        bool,
        Field(
            description=(
                "`since_index` was older than the oldest kept event; `snapshot` rebuilds what was lost."
            )
        ),
    ]
    snapshot: NotRequired[Snapshot]


class Store(TypedDict):
    """The session store and whether it answers."""

    kind: Literal["memory", "redis"]
    connected: bool
    instance_id: NotRequired[str]


class Database(TypedDict):
    """The session database and whether it answers."""

    kind: Literal["sqlite", "postgresql"]
    connected: bool


class LoopLag(TypedDict):
    """The event loop's lag in milliseconds over the window."""

    p50: float
    p99: float
    max: float
    samples: Count


class Health(TypedDict):
    """``GET /healthz``: serving or degraded, with a few numbers worth watching."""

    status: Literal["ok", "degraded"]
    provider: str
    runs_active: Count
    sessions: int | None
    store: Store
    loop_lag_ms: LoopLag
    database: NotRequired[Database]
    unavailable: NotRequired[
        Annotated[
            list[str],
            Field(description="What does not answer while degraded: `store` (Redis), `database`."),
        ]
    ]
    mcp: NotRequired[
        Annotated[
            list[dict[str, Any]],
            Field(description="Each configured MCP server: `url`, `connected`, `tools`, `last_error`."),
        ]
    ]


class Token(TypedDict):
    """A short-lived browser token."""

    token: str
    expires_at: Annotated[float, Field(description="Epoch seconds.")]
