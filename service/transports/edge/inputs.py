"""Reading what a client sends: JSON bodies (parsed with a nesting bound, validated by pydantic
models) and integer query parameters, each refused with the right status and a JSON error.

413 a body too large, 400 malformed JSON or a bad parameter, 422 a body of the wrong shape.
Text holding U+0000 (NUL) is refused wherever a client sends it (400 in a query parameter, 422 in
a body; the WebSocket and MCP refuse it alike): PostgreSQL's text columns cannot hold it, and a
request must not be taken on one backend and refused on another.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal, TypeVar

from aiohttp import web
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    model_validator,
)

from service import jsonsafe
from service.config import Settings
from service.transports.edge.context import CONTEXT
from service.transports.edge.middleware import json_error

Model = TypeVar("Model", bound=BaseModel)


NUL_REFUSED = "text must not contain the NUL character (U+0000)"


def may_hold_nul(raw: str | bytes) -> bool:
    """Whether JSON text ``raw`` may carry U+0000: escaped, or as the NUL bytes of a UTF-16 or
    UTF-32 encoding (a raw NUL is not valid in JSON's UTF-8). A cheap test before :func:`holds_nul`."""
    if isinstance(raw, str):
        return "\\u0000" in raw or "\x00" in raw
    return b"\\u0000" in raw or b"\x00" in raw


def holds_nul(value: Any) -> bool:
    """True when a string anywhere in ``value`` (parsed JSON, object keys included) holds U+0000."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            if "\x00" in node:
                return True
        elif isinstance(node, dict):
            stack.extend(node)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


def text_refused(text: str, message: Any) -> str | None:
    """Why a client's JSON ``text`` (parsed: ``message``) cannot be taken as text, or None: a lone
    surrogate (escaped: JSON text is UTF-8) can be neither stored nor sent, and a NUL not stored."""
    if "\\u" not in text:
        return None  # both can only come escaped
    try:
        json.dumps(message, ensure_ascii=False).encode()
    except (UnicodeEncodeError, RecursionError):
        return "a message must be valid Unicode text (no lone surrogates)"
    return NUL_REFUSED if holds_nul(message) else None


def check_text_param(request: web.Request, name: str) -> str | None:
    """The query parameter ``name`` (None when absent); 400 when it holds U+0000."""
    value = request.query.get(name)
    if value is not None and "\x00" in value:
        raise json_error(400, f"{name}: {NUL_REFUSED}", code="nul_character")
    return value


def _unicode(value: Any) -> Any:
    # A lone surrogate (escaped in the JSON) can be neither stored nor sent.
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode text (no lone surrogates)") from None
    return value


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be blank")
    return value


Text = Annotated[str, Field(min_length=1), AfterValidator(_not_blank)]


def _json_integer(value: object) -> object:
    # pydantic's lax mode would take ``true`` and ``"3"`` as integers; JSON Schema's "integer"
    # (and so the OpenAPI document) takes neither, but does take ``3.0``.
    if isinstance(value, bool | str):
        raise ValueError("must be an integer")
    return value


MaxTurns = Annotated[
    Annotated[int, Field(ge=1, le=100)] | None, BeforeValidator(_json_integer), Field(default=None)
]


AgentName = Annotated[
    str,
    Field(min_length=1, max_length=64, description="One of `GET /agents`; the default one when left out."),
]


class AgentRequest(BaseModel):
    """Body of ``POST /agent/stream`` and ``POST /agent/run``."""

    model_config = ConfigDict(extra="ignore")

    message: Text
    max_turns: MaxTurns = None
    agent: AgentName | None = None


class SessionRequest(BaseModel):
    """Body of ``POST /sessions`` (or none)."""

    model_config = ConfigDict(extra="ignore")

    agent: AgentName | None = None


class TitleRequest(BaseModel):
    """Body of ``PATCH /sessions/{id}``."""

    model_config = ConfigDict(extra="ignore")

    title: Annotated[Text, Field(max_length=200)]


class TokenRequest(BaseModel):
    """Body of ``POST /auth/token`` (optional): ``sub`` names one user of the key's app."""

    model_config = ConfigDict(extra="ignore")

    sub: Annotated[Text, Field(max_length=256)] | None = None


# What a second message does while a query runs (see service/core/multitask.py).
Strategy = Literal["reject", "enqueue", "interrupt", "rollback"]
# A message id a client chooses (an AI SDK or AG-UI message id), in the alphabet of a session id's.
MessageId = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$")]


def _json_value(value: Any) -> Any:
    if not jsonsafe.finite(value):
        raise ValueError("must not hold NaN or an infinite number")
    if holds_nul(value):
        raise ValueError(NUL_REFUSED)
    return _unicode(value)


JsonValue = Annotated[Any, AfterValidator(_json_value)]


class ClientTool(BaseModel):
    """A tool the client runs itself (a browser-side tool), offered to the model beside the
    service's own; its calls wait for the client's result."""

    model_config = ConfigDict(extra="ignore")

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    description: Annotated[str, Field(max_length=10_000), AfterValidator(_unicode)] = ""
    input_schema: Annotated[dict[str, Any], AfterValidator(_json_value)] = Field(
        default_factory=lambda: {"type": "object", "properties": {}},
        description="The JSON schema of the tool's input.",
    )


ClientTools = Annotated[list[ClientTool], Field(max_length=64)]


class MessageRequest(BaseModel):
    """Body of ``POST /sessions/{id}/messages`` (and the WebSocket ``message``).

    ``content`` is the new message, or the edited text of the message ``edit`` names (the
    conversation is cut back to before it first); ``regenerate`` (an answer's id, or ``true`` for
    the last) answers that answer's question again and takes no content.
    """

    model_config = ConfigDict(extra="ignore")

    content: Text | None = None
    max_turns: MaxTurns = None
    id: MessageId | None = Field(None, description="The new message's id (the client's own).")
    edit: MessageId | None = Field(None, description="The id of an earlier message of the user's to replace.")
    regenerate: MessageId | Literal[True] | None = Field(
        None, description="The id of an answer to give again (`true`: the last answer)."
    )
    multitask_strategy: Strategy = "reject"
    tools: ClientTools | None = None

    @model_validator(mode="after")
    def _one_action(self) -> MessageRequest:
        if self.regenerate is not None:
            if self.content is not None or self.edit is not None:
                raise ValueError("regenerate takes neither content nor edit")
        elif self.content is None:
            raise ValueError("content is required (unless regenerate is given)")
        return self


class ToolResultRequest(BaseModel):
    """Body of ``POST /sessions/{id}/tool-results/{tool_call_id}``: a client tool's ``output``
    (any JSON), or the ``error`` it failed with."""

    model_config = ConfigDict(extra="ignore")

    output: JsonValue = None
    error: Annotated[str, Field(min_length=1, max_length=20_000), AfterValidator(_unicode)] | None = None

    @model_validator(mode="after")
    def _one_of(self) -> ToolResultRequest:
        if ("output" in self.model_fields_set) == (self.error is not None):
            raise ValueError("give either output or error")
        return self


class ApprovalAnswer(BaseModel):
    """Body of ``POST /sessions/{id}/approvals/{approval_id}`` (and of the WebSocket ``approve``
    and the MCP ``session_approve``): approve or deny a tool call that waits."""

    model_config = ConfigDict(extra="ignore")

    approved: StrictBool
    reason: Annotated[str, Field(max_length=2000)] | None = None
    input: Annotated[dict[str, Any] | None, AfterValidator(_unicode)] = Field(
        None, description="An edited input for the tool (approved only), checked against its input schema."
    )


async def read_object(request: web.Request, *, allow_empty: bool = False) -> dict[str, Any]:
    """The body as a JSON object: 413 too large, 400 malformed or empty, 422 not an object."""
    limit = request.app[CONTEXT].settings.max_request_bytes
    if request.content_length is not None and request.content_length > limit:
        raise json_error(413, f"request body too large (limit {limit} bytes)", max_bytes=limit)
    raw = await request.read()  # aiohttp enforces client_max_size while reading a chunked body
    if not raw and allow_empty:
        return {}
    if not raw.strip():  # blank is not "no body": what sent it meant to send something
        raise json_error(400, "request body is empty; send a JSON object")
    try:
        data = jsonsafe.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise json_error(400, f"malformed JSON: {exc}") from None
    if not isinstance(data, dict):
        raise json_error(422, "request body must be a JSON object")
    if may_hold_nul(raw) and holds_nul(data):
        raise json_error(422, f"invalid request: {NUL_REFUSED}", code="nul_character")
    return data


async def read_json(request: web.Request, model: type[Model], *, allow_empty: bool = False) -> Model:
    """Parse the body as ``model``: 413 too large, 400 malformed JSON, 422 wrong shape (an empty
    body is ``{}`` with ``allow_empty``)."""
    data = await read_object(request, allow_empty=allow_empty)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        details = [
            {"field": ".".join(str(part) for part in item["loc"]) or "body", "message": item["msg"]}
            for item in exc.errors(include_url=False)
        ]
        summary = "; ".join(f"{item['field']}: {item['message']}" for item in details)
        raise json_error(422, f"invalid request: {summary}", details=details) from None


def check_length(settings: Settings, text: str, field: str) -> None:
    """422 when a message is longer than ``AGENT_MAX_MESSAGE_CHARS``."""
    limit = settings.max_message_chars
    if len(text) > limit:
        raise json_error(422, f"invalid request: {field}: longer than {limit} characters")


DECIMAL = re.compile(r"-?[0-9]+")


def decimal(raw: str) -> int:
    """``raw`` as an integer, written in ASCII digits; ``ValueError`` otherwise (``int()`` alone
    would also take ``" 5"``, ``"+5"``, ``"1_0"`` and other scripts' digits)."""
    if not DECIMAL.fullmatch(raw):
        raise ValueError(raw)
    return int(raw)


def int_param(request: web.Request, *names: str, minimum: int = 0) -> int | None:
    """The first of ``names`` present in the query string as an integer; 400 if it is not one."""
    for name in names:
        raw = request.query.get(name)
        if raw is None:
            continue
        try:
            value = decimal(raw)
        except ValueError:
            raise json_error(400, f"{name} must be an integer, got {raw!r}") from None
        if value < minimum:
            raise json_error(400, f"{name} must be at least {minimum}")
        return value
    return None


def last_event_id(request: web.Request) -> int | None:
    """The id a client resumes after: the `Last-Event-ID` header, else `?last_event_id=`; 400 if bad."""
    header = request.headers.get("Last-Event-ID")
    if header is not None and header.strip():
        try:
            value = decimal(header.strip())
        except ValueError:
            raise json_error(400, f"Last-Event-ID must be an event id (an integer), got {header!r}") from None
        if value < 0:
            raise json_error(400, "Last-Event-ID must not be negative")
        return value
    return int_param(request, "last_event_id")


def query_text(text: str) -> str:
    """A protocol's new query as the service takes it: some text, and valid Unicode (``ValueError``
    says what is wrong)."""
    if not text.strip():
        raise ValueError("the last message has no text")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("the last message's text is not valid Unicode (a lone surrogate)") from None
    return text
