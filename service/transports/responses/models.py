"""The shapes of OpenAI's Responses API face: the request it reads, the objects and events it writes.

The request is read strictly (a JSON boolean is ``true``, not ``"true"``), and, as OpenAI's own
API does, a parameter it does not know is refused by name (``Unknown parameter: 'x'.``). The
parameters OpenAI's clients send that change nothing here (``temperature``, ``include``,
``parallel_tool_calls``, ...) are read and ignored; those it cannot honour (``conversation``,
``prompt``, a JSON ``text.format``, a tool that is not a function) are refused with their
``param``. The replies are ``TypedDict``\\ s, published by ``GET /openapi.json``; their names
carry a ``Response`` prefix so that none meets a name of another face's in the document.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, NotRequired

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag
from typing_extensions import TypeAliasType, TypedDict

ToolName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
# A constrained str: pydantic then refuses a lone surrogate, which no upstream could take.
Text = Annotated[str, Field(min_length=0)]
CallId = Annotated[str, Field(min_length=1, max_length=256)]

_STRICT = ConfigDict(strict=True, extra="ignore")
_CLOSED = ConfigDict(strict=True, extra="forbid")


class ResponseTextPart(BaseModel):
    """A text part of a message's content: ``input_text`` (the user's, or instructions) or
    ``output_text`` (an earlier answer's)."""

    model_config = _STRICT
    type: Literal["input_text", "output_text", "text"]
    text: Text


class ResponseRefusalPart(BaseModel):
    """A refusal part of an earlier answer."""

    model_config = _STRICT
    type: Literal["refusal"]
    refusal: Text


class ResponseMessageItem(BaseModel):
    """A message of the conversation: ``user``, ``assistant``, or instructions (``system``,
    ``developer``). Parts other than text (images, files, audio) are refused."""

    model_config = _STRICT
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: Text | list[dict[str, Any]]
    id: Text | None = None
    status: Text | None = None


class ResponseFunctionCallItem(BaseModel):
    """A call of one of the client's functions an earlier response made."""

    model_config = _STRICT
    type: Literal["function_call"]
    call_id: CallId
    name: ToolName
    arguments: Text
    id: Text | None = None
    status: Text | None = None


class ResponseFunctionCallOutputItem(BaseModel):
    """The result of a call of the client's function, answering it by ``call_id``."""

    model_config = _STRICT
    type: Literal["function_call_output"]
    call_id: CallId
    output: Text | list[dict[str, Any]]
    id: Text | None = None
    status: Text | None = None


class ResponseSkippedItem(BaseModel):
    """An item of an earlier response a stateless client sends back that the model does not need
    again: its reasoning, and the calls of the service's own tools (their outcome is in the text
    that followed them)."""

    model_config = _STRICT
    type: Literal["reasoning", "mcp_call", "mcp_list_tools", "mcp_approval_request"]


_SKIPPED = frozenset({"reasoning", "mcp_call", "mcp_list_tools", "mcp_approval_request"})


class ResponseItemReference(BaseModel):
    """An item of an earlier stored response, named by its id instead of sent again (the AI SDK's
    OpenAI provider does so for what it was given with ``store``): an answer's ``msg_`` item is
    read back from the stored conversation, a ``rs_`` or ``mcp_`` item is left out as those items
    are when sent in full."""

    model_config = _STRICT
    type: Literal["item_reference"]
    id: Annotated[str, Field(min_length=1, max_length=512)]


def _item_kind(value: Any) -> str | None:
    """An input item's tag: a message may leave out its ``type``, as OpenAI's easy form does."""
    kind = value.get("type", "message") if isinstance(value, dict) else getattr(value, "type", None)
    return "skipped" if kind in _SKIPPED else kind


ResponseInputItem = Annotated[
    Annotated[ResponseMessageItem, Tag("message")]
    | Annotated[ResponseFunctionCallItem, Tag("function_call")]
    | Annotated[ResponseFunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ResponseSkippedItem, Tag("skipped")]
    | Annotated[ResponseItemReference, Tag("item_reference")],
    Discriminator(
        _item_kind,
        custom_error_type="invalid_input_item",
        custom_error_message=(
            "an input item's type is one of message, function_call, function_call_output, "
            "item_reference, reasoning, mcp_call, mcp_list_tools or mcp_approval_request"
        ),
    ),
]


class ResponseFunctionTool(BaseModel):
    """A function the client offers the model; the service never runs it: a call comes back as a
    ``function_call`` item for the client to answer with a ``function_call_output``."""

    model_config = _STRICT
    type: Literal["function"]
    name: ToolName
    description: Text | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ResponseNamedFunction(BaseModel):
    """``tool_choice`` naming one function (taken as ``auto``: the model chooses)."""

    model_config = _STRICT
    type: Literal["function"]
    name: ToolName


class ResponseTextFormat(BaseModel):
    """``text.format``: only plain text."""

    model_config = _STRICT
    type: Literal["text"]


class ResponseTextConfig(BaseModel):
    """``text``: the answer's format (only ``text``) and verbosity (ignored)."""

    model_config = _STRICT
    format: ResponseTextFormat | None = None
    verbosity: Text | None = None


Metadata = Annotated[
    dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]],
    Field(max_length=16, description="At most 16 pairs: keys of up to 64 characters, values of 512."),
]


class ResponseRequest(BaseModel):
    """Body of ``POST /v1/responses``.

    ``input`` is the user's text, or items: messages, the client's ``function_call``\\ s and their
    ``function_call_output``\\ s, references to earlier responses' items. The last item is the
    user's message (the query) or the outputs of the calls the response before it handed back.
    """

    model_config = _CLOSED
    model: Annotated[str, Field(min_length=1, description="The id `GET /v1/models` lists.")]
    input: Annotated[str, Field(min_length=1)] | Annotated[list[ResponseInputItem], Field(min_length=1)]
    instructions: Text | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | ResponseNamedFunction | None = None
    stream: bool | None = None
    background: bool | None = None
    store: bool | None = None
    previous_response_id: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    metadata: Metadata | None = None
    text: ResponseTextConfig | None = None
    # Read, and changing nothing here.
    temperature: float | None = None
    top_p: float | None = None
    user: Text | None = None
    parallel_tool_calls: bool | None = None
    truncation: Literal["auto", "disabled"] | None = None
    include: list[Text] | None = None
    reasoning: dict[str, Any] | None = None
    service_tier: Text | None = None
    prompt_cache_key: Text | None = None
    prompt_cache_retention: Text | None = None
    safety_identifier: Text | None = None
    stream_options: dict[str, Any] | None = None
    max_tool_calls: Annotated[int, Field(ge=1)] | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    prompt_cache_options: dict[str, Any] | None = None
    # Refused when given (see UNSUPPORTED), by name rather than as unknown.
    conversation: Any = None
    prompt: Any = None
    context_management: Any = None


# Parameters of OpenAI's API this service does not honour: refused by name, not ignored.
UNSUPPORTED = {
    "conversation": "conversations are not supported here: continue with `previous_response_id`",
    "prompt": "stored prompts are not supported here: send `instructions` and `input`",
    "context_management": "`context_management` is not supported here",
}


# --- replies -----------------------------------------------------------------------------------

Count = Annotated[int, Field(ge=0)]


class ResponseInputTokensDetails(TypedDict):
    """Input tokens read from the model's cache, and written to it (not told here: 0)."""

    cached_tokens: Count
    cache_write_tokens: Count


class ResponseOutputTokensDetails(TypedDict):
    """Output tokens spent reasoning (not told apart by every model: 0 then)."""

    reasoning_tokens: Count


class ResponseUsageBody(TypedDict):
    """Tokens of the whole response (every model turn of the agent)."""

    input_tokens: Count
    input_tokens_details: ResponseInputTokensDetails
    output_tokens: Count
    output_tokens_details: ResponseOutputTokensDetails
    total_tokens: Count


class ResponseOutputText(TypedDict):
    """The text of an answer."""

    type: Literal["output_text"]
    text: str
    annotations: list[Any]
    logprobs: list[Any]


class ResponseOutputMessage(TypedDict):
    """A model turn's text."""

    id: str
    type: Literal["message"]
    status: Literal["in_progress", "completed", "incomplete"]
    role: Literal["assistant"]
    content: list[ResponseOutputText]


class ResponseSummaryText(TypedDict):
    """The model's reasoning, as it was shown."""

    type: Literal["summary_text"]
    text: str


class ResponseReasoningItem(TypedDict):
    """A model turn's reasoning."""

    id: str
    type: Literal["reasoning"]
    summary: list[ResponseSummaryText]
    status: Literal["in_progress", "completed", "incomplete"]


class ResponseFunctionCall(TypedDict):
    """A call of one of the client's functions, for the client to run."""

    id: str
    type: Literal["function_call"]
    status: Literal["in_progress", "completed", "incomplete"]
    call_id: str
    name: str
    arguments: str


class ResponseToolError(TypedDict):
    """Why a call of the service's own tools failed: what the tool said, as MCP's content."""

    type: Literal["mcp_tool_execution_error"]
    content: list[dict[str, Any]]


class ResponseServerToolCall(TypedDict):
    """A call of one of the service's own tools (the calculator, an MCP server's), run by the
    service: shown, never for the client to run."""

    id: str
    type: Literal["mcp_call"]
    status: Literal["in_progress", "calling", "completed", "failed", "incomplete"]
    server_label: str
    name: str
    arguments: str
    output: str | None
    error: ResponseToolError | None


class ResponseApprovalRequest(TypedDict):
    """A call of the service's own tools that waits for a person's approval (answered on the
    session's native routes: ``POST /sessions/{session_id}/approvals/{approval_id}``)."""

    id: str
    type: Literal["mcp_approval_request"]
    server_label: str
    name: str
    arguments: str
    approval_id: str


ResponseOutputItem = TypeAliasType(
    "ResponseOutputItem",
    Annotated[
        ResponseOutputMessage
        | ResponseReasoningItem
        | ResponseFunctionCall
        | ResponseServerToolCall
        | ResponseApprovalRequest,
        Field(discriminator="type"),
    ],
)


class ResponseErrorBody(TypedDict):
    """Why a response failed."""

    code: str
    message: str


class ResponseIncomplete(TypedDict):
    """Why a response stopped short: ``max_output_tokens``, ``max_turns``, ``content_filter``."""

    reason: str


ResponseStatus = Literal["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]


class ResponseObject(TypedDict):
    """A response: OpenAI's object, and ``session_id``, the session it runs in (its native
    routes answer its approvals and show it to every other face)."""

    id: str
    object: Literal["response"]
    created_at: float
    completed_at: float | None
    status: ResponseStatus
    background: bool
    store: bool
    error: ResponseErrorBody | None
    incomplete_details: ResponseIncomplete | None
    instructions: str | None
    max_output_tokens: int | None
    metadata: dict[str, str]
    model: str
    output: list[ResponseOutputItem]
    parallel_tool_calls: bool
    previous_response_id: str | None
    temperature: float | None
    top_p: float | None
    text: dict[str, Any]
    tool_choice: Any
    tools: list[dict[str, Any]]
    truncation: Literal["disabled"]
    usage: ResponseUsageBody | None
    user: str | None
    session_id: str


class ResponseDeleted(TypedDict):
    """``DELETE /v1/responses/{id}``."""

    id: str
    object: Literal["response.deleted"]
    deleted: Literal[True]


class ResponseStreamEvent(TypedDict):
    """One event of a response's stream (``event:`` is its ``type``). Every event has its
    ``sequence_number``, counted from 0 at ``response.created``; the rest depends on the type:

    - ``response.created``, ``response.in_progress``, ``response.completed``,
      ``response.incomplete``, ``response.failed``: ``response`` (the object as it stands);
    - ``response.output_item.added`` / ``.done``: ``output_index``, ``item``;
    - ``response.content_part.added`` / ``.done``: ``item_id``, ``output_index``,
      ``content_index``, ``part``;
    - ``response.output_text.delta`` / ``.done``: ``item_id``, ``output_index``,
      ``content_index``, ``delta`` / ``text``, ``logprobs``;
    - ``response.reasoning_summary_part.added`` / ``.done``,
      ``response.reasoning_summary_text.delta`` / ``.done``: ``item_id``, ``output_index``,
      ``summary_index``, ``part`` / ``delta`` / ``text``;
    - ``response.function_call_arguments.delta`` / ``.done``,
      ``response.mcp_call_arguments.delta`` / ``.done``: ``item_id``, ``output_index``,
      ``delta`` / ``arguments`` (and the function's ``name`` with a function call's);
    - ``response.mcp_call.in_progress`` / ``.completed`` / ``.failed``: ``item_id``,
      ``output_index``;
    - ``error``: ``code``, ``message``, ``param`` (the stream ended before the response did).
    """

    type: str
    sequence_number: Count
    response: NotRequired[ResponseObject]
    output_index: NotRequired[Count]
    item: NotRequired[ResponseOutputItem]
    item_id: NotRequired[str]
    content_index: NotRequired[Count]
    summary_index: NotRequired[Count]
    part: NotRequired[dict[str, Any]]
    delta: NotRequired[str]
    text: NotRequired[str]
    arguments: NotRequired[str]
    name: NotRequired[str]
    logprobs: NotRequired[list[Any]]
    code: NotRequired[str | None]
    message: NotRequired[str]
    param: NotRequired[str | None]


class ResponseErrorDetail(TypedDict):
    """What went wrong, as OpenAI says it."""

    message: str
    type: Annotated[
        str,
        Field(
            description=(
                "`invalid_request_error` (400, 404, 409, 413), `authentication_error` (401), "
                "`permission_error` (403), `rate_limit_error` (429), `server_error` (5xx)."
            )
        ),
    ]
    code: str | None
    param: str | None


class ResponseError(TypedDict):
    """Every error of the Responses routes, in OpenAI's shape."""

    error: ResponseErrorDetail
