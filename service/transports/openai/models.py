"""The shapes of the OpenAI Chat Completions face: the request it reads, the replies it writes.

The request is a pydantic model read strictly (a JSON boolean is ``true``, not ``"true"``; an
integer is an integer), with every field the service does not act on ignored, as OpenAI-compatible
servers do (``temperature``, ``top_p``, ``user``, ``seed``, ...). The replies are ``TypedDict``\\ s,
like :mod:`service.transports.stream.payloads`: types only, published by ``GET /openapi.json``. Field names
follow OpenAI's API reference; the names here carry a ``Chat`` prefix so that none meets a name of
the service's own dialects in the document.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, NotRequired

from pydantic import BaseModel, ConfigDict, Field
from typing_extensions import TypeAliasType, TypedDict

# A function's name as OpenAI takes it (and Bedrock: at most 64 of these characters).
ToolName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
# A constrained str: pydantic then refuses a lone surrogate, which no upstream could take.
Text = Annotated[str, Field(min_length=0)]

_STRICT = ConfigDict(strict=True, extra="ignore")


class ChatTextPart(BaseModel):
    """A text part of a message's content."""

    model_config = _STRICT
    type: Literal["text"]
    text: Text


class ChatRefusalPart(BaseModel):
    """A refusal part of an assistant message's content."""

    model_config = _STRICT
    type: Literal["refusal"]
    refusal: Text


TextContent = Text | list[ChatTextPart]


class ChatSystemMessage(BaseModel):
    """Instructions (``system``, or ``developer`` as newer models name it): the system prompt."""

    model_config = _STRICT
    role: Literal["system", "developer"]
    content: TextContent
    name: Text | None = None


class ChatUserMessage(BaseModel):
    """A user's turn; text only (image, audio and file parts are refused with a 400)."""

    model_config = _STRICT
    role: Literal["user"]
    content: Text | list[dict[str, Any]]
    name: Text | None = None


class ChatFunctionCall(BaseModel):
    """The function a tool call names and its arguments, a JSON object as text."""

    model_config = _STRICT
    name: ToolName
    arguments: Text


class ChatToolCallIn(BaseModel):
    """A tool call of an earlier assistant message, as the client sends it back."""

    model_config = _STRICT
    id: Annotated[str, Field(min_length=1, max_length=256)]
    type: Literal["function"] = "function"
    function: ChatFunctionCall


class ChatAssistantMessage(BaseModel):
    """An earlier answer: its text, and the tool calls it made."""

    model_config = _STRICT
    role: Literal["assistant"]
    content: Text | list[ChatTextPart | ChatRefusalPart] | None = None
    refusal: Text | None = None
    tool_calls: list[ChatToolCallIn] | None = None
    name: Text | None = None


class ChatToolMessage(BaseModel):
    """The result of one tool call, answering it by ``tool_call_id``."""

    model_config = _STRICT
    role: Literal["tool"]
    content: TextContent
    tool_call_id: Annotated[str, Field(min_length=1, max_length=256)]


ChatMessage = Annotated[
    ChatSystemMessage | ChatUserMessage | ChatAssistantMessage | ChatToolMessage,
    Field(discriminator="role"),
]


class ChatFunctionDefinition(BaseModel):
    """A function the client offers the model; the service never runs it."""

    model_config = _STRICT
    name: ToolName
    description: Text | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatTool(BaseModel):
    """A tool the client brings (only ``function`` tools)."""

    model_config = _STRICT
    type: Literal["function"]
    function: ChatFunctionDefinition


class ChatNamedFunction(BaseModel):
    """The function a ``tool_choice`` object names."""

    model_config = _STRICT
    name: ToolName


class ChatNamedToolChoice(BaseModel):
    """``tool_choice`` naming one function (taken as ``auto``: the model chooses)."""

    model_config = _STRICT
    type: Literal["function"]
    function: ChatNamedFunction


class ChatStreamOptions(BaseModel):
    """Options of a streamed reply."""

    model_config = _STRICT
    include_usage: bool | None = None


class ChatCompletionRequest(BaseModel):
    """Body of ``POST /v1/chat/completions``: the conversation, and how to answer it.

    The last message is the user's (the query) or the results of the client's tools (``tool``
    messages answering the last assistant message's calls). Fields not listed are ignored.
    """

    model_config = _STRICT
    model: Annotated[str, Field(min_length=1, description="The id `GET /v1/models` lists.")]
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    stream: bool | None = None
    stream_options: ChatStreamOptions | None = None
    tools: list[ChatTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | ChatNamedToolChoice | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    n: Annotated[int, Field(ge=1, le=1, description="Only 1.")] | None = None


# --- replies -----------------------------------------------------------------------------------

Count = Annotated[int, Field(ge=0)]


class ChatUsage(TypedDict):
    """Tokens of the whole query (every model turn of the agent)."""

    prompt_tokens: Count
    completion_tokens: Count
    total_tokens: Count


class ChatFunctionCallOut(TypedDict):
    """A call's function: its name and arguments (a JSON object as text)."""

    name: str
    arguments: str


class ChatToolCall(TypedDict):
    """A call to one of the client's tools, for the client to run."""

    id: str
    type: Literal["function"]
    function: ChatFunctionCallOut


class ChatAnswer(TypedDict):
    """The assistant's message."""

    role: Literal["assistant"]
    content: str | None
    refusal: None
    tool_calls: NotRequired[list[ChatToolCall]]
    reasoning_content: NotRequired[str]


FinishReason = Annotated[
    str,
    Field(description="`stop`, `length` (max tokens or max turns), `tool_calls`, `content_filter`."),
]


class ChatChoice(TypedDict):
    """The one choice."""

    index: Literal[0]
    message: ChatAnswer
    finish_reason: FinishReason
    logprobs: None


class ChatCompletion(TypedDict):
    """The answer of a request without ``stream``."""

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: ChatUsage
    system_fingerprint: None


class ChatFunctionDelta(TypedDict):
    """A piece of a call's function: its name first, then pieces of its arguments."""

    name: NotRequired[str]
    arguments: str


class ChatToolCallDelta(TypedDict):
    """A piece of a tool call; ``index`` counts the calls of the reply."""

    index: Count
    id: NotRequired[str]
    type: NotRequired[Literal["function"]]
    function: ChatFunctionDelta


class ChatDelta(TypedDict):
    """What a chunk adds to the message."""

    role: NotRequired[Literal["assistant"]]
    content: NotRequired[str]
    reasoning_content: NotRequired[str]
    tool_calls: NotRequired[list[ChatToolCallDelta]]


class ChatChunkChoice(TypedDict):
    """The one choice of a chunk."""

    index: Literal[0]
    delta: ChatDelta
    finish_reason: FinishReason | None
    logprobs: None


class ChatCompletionChunk(TypedDict):
    """One `data:` line of a streamed answer; the usage chunk (``include_usage``) has no choices."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChatChunkChoice]
    system_fingerprint: None
    usage: NotRequired[ChatUsage | None]


class ChatModel(TypedDict):
    """A model this service answers as."""

    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ChatModelList(TypedDict):
    """``GET /v1/models``: the configured model."""

    object: Literal["list"]
    data: list[ChatModel]


class ChatErrorDetail(TypedDict):
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


class ChatError(TypedDict):
    """Every error of the ``/v1`` routes, in OpenAI's shape."""

    error: ChatErrorDetail


ChatStreamData = TypeAliasType(
    "ChatStreamData",
    Annotated[
        ChatCompletionChunk | ChatError,
        Field(description="A chunk, or an error that ends the stream (then no `[DONE]`)."),
    ],
)
