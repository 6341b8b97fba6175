"""What AG-UI's ``RunAgentInput`` brings, as the service reads it, and the session's conversation
as AG-UI messages (for ``MESSAGES_SNAPSHOT``).

An input asks one of two things of its thread: a new query (the last message is the user's), or
the rest of the query that waits on the client's tools (the last messages are ``role: "tool"``
messages answering its calls). Besides, ``tools`` are the client's own tools (offered to the
model; their calls wait for the client's results) and ``forwardedProps.multitask_strategy`` says
what a message does while a query runs.

Every message keeps one id across runs, the same in the stream and in a later snapshot: a user's
message the id its client sent, an answer's messages the ids the core gives them (see
:mod:`service.core.conversation`), a tool message :func:`tool_message_id` of its call.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, get_args

from ag_ui.core import (
    AssistantMessage,
    BaseEvent,
    FunctionCall,
    MessagesSnapshotEvent,
    RunAgentInput,
    TextMessageContentEvent,
    TextMessageStartEvent,
    ToolCall,
    ToolCallArgsEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
    ToolMessage,
    UserMessage,
)
from pydantic import AfterValidator, Field, TypeAdapter, ValidationError

from service.core import conversation
from service.transports.edge.inputs import ClientTool, ClientTools, Strategy, ToolResultRequest, query_text

Message = UserMessage | AssistantMessage | ToolMessage


def _unicode(value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode text (no lone surrogates)") from None
    return value


# The id of a user's message as the conversation keeps it: the client's own, whatever its alphabet
# (an AG-UI id is any string), within a bound.
_MESSAGE_ID: TypeAdapter[str] = TypeAdapter(
    Annotated[str, Field(min_length=1, max_length=128), AfterValidator(_unicode)]
)
_CLIENT_TOOLS: TypeAdapter[list[ClientTool]] = TypeAdapter(ClientTools)
STRATEGIES: tuple[str, ...] = get_args(Strategy)


class InputError(ValueError):
    """A ``RunAgentInput`` the service cannot take: ``field`` says where (a 422)."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")


def tool_message_id(tool_call_id: str) -> str:
    """The id of the tool message that carries a call's result."""
    return f"{tool_call_id}-result"


def _text_of(content: Any) -> str:
    return (
        content if isinstance(content, str) else "".join(getattr(part, "text", "") or "" for part in content)
    )


def _problem(exc: ValidationError) -> tuple[str, str]:
    first = exc.errors(include_url=False)[0]
    return ".".join(str(part) for part in first["loc"]), first["msg"]


def new_message(body: RunAgentInput) -> tuple[str, str]:
    """The new query and its id: the last message, which must be the user's (:class:`InputError`)."""
    if not body.messages:
        raise InputError("messages", "messages is empty; the last one must be the user's new message")
    where = f"messages.{len(body.messages) - 1}"
    last = body.messages[-1]
    if not isinstance(last, UserMessage):
        raise InputError(
            "messages", f"the last message must be the user's (or tool results), not {last.role!r}"
        )
    try:
        text = query_text(_text_of(last.content))
    except ValueError as exc:
        raise InputError("messages", str(exc)) from None
    try:
        message_id = _MESSAGE_ID.validate_python(last.id)
    except ValidationError as exc:
        raise InputError(f"{where}.id", _problem(exc)[1]) from None
    return text, message_id


def tool_results(body: RunAgentInput) -> list[tuple[str, ToolResultRequest]]:
    """The results of the client's tool calls that the input's last messages carry (``role:
    "tool"`` after its last other message), by call id; tool messages of the service's own tools
    (their ids are :func:`tool_message_id`'s) left out. Empty when the input asks a new query."""
    results: list[tuple[str, ToolResultRequest]] = []
    index = len(body.messages)
    while index and isinstance(body.messages[index - 1], ToolMessage):
        index -= 1
    for n in range(index, len(body.messages)):
        message = body.messages[n]
        assert isinstance(message, ToolMessage)
        if message.id == tool_message_id(message.tool_call_id):
            continue  # the service's own result, as it streamed it
        fields: dict[str, Any] = (
            {"error": message.error} if message.error else {"output": _text_of(message.content)}
        )
        try:
            results.append((message.tool_call_id, ToolResultRequest.model_validate(fields)))
        except ValidationError as exc:
            where, problem = _problem(exc)
            raise InputError(f"messages.{n}.{'error' if message.error else 'content'}", problem) from None
    return results


def client_tools(body: RunAgentInput) -> list[ClientTool]:
    """The input's ``tools`` as the client's own tools (``parameters`` is their input schema)."""
    raw = [
        {
            "name": tool.name,
            "description": tool.description,
            **({"input_schema": tool.parameters} if tool.parameters is not None else {}),
        }
        for tool in body.tools or ()
    ]
    try:
        return _CLIENT_TOOLS.validate_python(raw)
    except ValidationError as exc:
        where, problem = _problem(exc)
        where = where.replace("input_schema", "parameters")
        raise InputError(f"tools.{where}" if where else "tools", problem) from None


def strategy_of(body: RunAgentInput) -> str:
    """``forwardedProps.multitask_strategy`` (``reject`` without it)."""
    props = body.forwarded_props
    if not isinstance(props, dict) or "multitask_strategy" not in props:
        return "reject"
    strategy = props["multitask_strategy"]
    if strategy not in STRATEGIES:
        raise InputError(
            "forwardedProps.multitask_strategy", f"must be one of {', '.join(STRATEGIES)}, not {strategy!r}"
        )
    return str(strategy)


# -- the conversation, as AG-UI messages ----------------------------------------------------------


def messages_of(messages: list[dict[str, Any]]) -> list[Message]:
    """A session's conversation (Bedrock's message format) as AG-UI messages, with their ids."""
    out: list[Message] = []
    for index, message in enumerate(messages):
        message_id = conversation.message_id(messages, index)
        text = conversation.text_of(message)
        if message.get("role") == "assistant":
            calls = [
                ToolCall(
                    id=call.id,
                    function=FunctionCall(name=call.name, arguments=json.dumps(call.input, allow_nan=False)),
                )
                for call in conversation.calls_of(message)
            ]
            out.append(AssistantMessage(id=message_id, content=text or None, tool_calls=calls or None))
            continue
        results = conversation.results_of(message)
        for result in results:
            out.append(
                ToolMessage(
                    id=tool_message_id(result.id),
                    tool_call_id=result.id,
                    content=result.text,
                    error=result.text if result.is_error else None,
                )
            )
        if text or not results:
            out.append(UserMessage(id=message_id, content=text))
    return out


def history_before(messages: list[dict[str, Any]], message_id: str) -> list[dict[str, Any]]:
    """The conversation before the query whose user message has that id (a live session's
    conversation may already hold it and part of its answer, or not yet)."""
    index = conversation.find(messages, message_id) if message_id else None
    return messages[:index] if index is not None else list(messages)


class Transcript:
    """The messages an AG-UI client holds after the events it was sent, as its ``HttpAgent``
    builds them (reasoning aside, which no snapshot carries): what a run that continues a query
    starts its snapshot with."""

    def __init__(self) -> None:
        self.messages: list[Message] = []

    def _find(self, message_id: str) -> Message | None:
        return next((message for message in self.messages if message.id == message_id), None)

    def _call(self, tool_call_id: str) -> ToolCall | None:
        for message in self.messages:
            if isinstance(message, AssistantMessage):
                for call in message.tool_calls or ():
                    if call.id == tool_call_id:
                        return call
        return None

    def apply(self, event: BaseEvent) -> None:
        """Take in one event the client was sent."""
        if isinstance(event, MessagesSnapshotEvent):
            self.messages = [message for message in event.messages if isinstance(message, Message)]
        elif isinstance(event, TextMessageStartEvent):
            if self._find(event.message_id) is None:
                self.messages.append(AssistantMessage(id=event.message_id, content=""))
        elif isinstance(event, TextMessageContentEvent):
            found = self._find(event.message_id)
            if isinstance(found, AssistantMessage):
                found.content = (found.content or "") + event.delta
        elif isinstance(event, ToolCallStartEvent):
            parent = self._find(event.parent_message_id or event.tool_call_id)
            if not isinstance(parent, AssistantMessage):
                parent = AssistantMessage(id=event.parent_message_id or event.tool_call_id)
                self.messages.append(parent)
            call = ToolCall(
                id=event.tool_call_id, function=FunctionCall(name=event.tool_call_name, arguments="")
            )
            parent.tool_calls = [*(parent.tool_calls or []), call]
        elif isinstance(event, ToolCallArgsEvent):
            call = self._call(event.tool_call_id)
            if call is not None:
                call.function.arguments += event.delta
        elif isinstance(event, ToolCallResultEvent):
            self.messages.append(
                ToolMessage(id=event.message_id, tool_call_id=event.tool_call_id, content=event.content)
            )
