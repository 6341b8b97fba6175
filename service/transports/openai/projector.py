"""The OpenAI Chat Completions dialect: pure functions between OpenAI's shapes and the canonical ones.

Inbound, :func:`to_query` turns a request's ``messages`` into the canonical conversation (Bedrock's
message format, as the agent keeps it), the query's text and its
:class:`~service.core.options.RunOptions`: system and developer messages become the system prompt,
an assistant's ``tool_calls`` become ``toolUse`` blocks and ``tool`` messages ``toolResult`` blocks.
What a model could not take is refused here, with the message and ``param`` a 400 carries.

Outbound, a :class:`ChatProjection` turns a run's events, one at a time, into
``chat.completion.chunk``\\ s, and keeps what it saw so that :meth:`ChatProjection.completion` is the
same answer as one ``chat.completion``. Only the answer's text, its reasoning and calls to the
client's own tools are shown: the agent's own tools run inside the service, unseen on this wire.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from service import jsonsafe
from service.core.conversation import tool_use_id
from service.core.events import (
    Event,
    ReasoningDelta,
    RunDone,
    RunError,
    TextDelta,
    ToolInputDelta,
    ToolUse,
    ToolUseStart,
    Usage,
)
from service.core.log import LogEntry
from service.core.options import RunOptions
from service.transports.edge.openai_errors import InvalidParam, error_body, run_error_status
from service.transports.openai.models import (
    ChatAnswer,
    ChatAssistantMessage,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    ChatSystemMessage,
    ChatTextPart,
    ChatToolCall,
    ChatToolMessage,
    ChatUsage,
    ChatUserMessage,
)
from service.transports.stream.follow import Ending
from service.transports.stream.frames import SSE_SEP, sse_block
from service.transports.stream.sse import Projector

NO_OUTPUT = "(no output)"
TURN_SEPARATOR = "\n\n"


@dataclass(frozen=True, slots=True)
class Query:
    """A request as the agent takes it: the conversation before the query, its text, its options."""

    messages: list[dict[str, Any]]
    text: str
    options: RunOptions


def _text(content: str | list[Any] | None, param: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for index, part in enumerate(content):
        if isinstance(part, dict):  # a user's part, not validated by the request model
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type")
                raise InvalidParam(
                    f"only text content parts are supported, not {kind!r}", f"{param}.[{index}]"
                )
            parts.append(part["text"])
        else:
            parts.append(part.text if isinstance(part, ChatTextPart) else part.refusal)
    return "\n".join(parts)


def _arguments(text: str, param: str) -> dict[str, Any]:
    value = jsonsafe.loads_object(text)
    if value is None:
        raise InvalidParam("the arguments must be a JSON object", param)
    return value


def _unanswered(pending: dict[str, str]) -> str:
    return (
        "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
        f"'tool_call_id'. The following tool_call_ids did not have response messages: {', '.join(pending)}"
    )


def to_query(body: ChatCompletionRequest) -> Query:
    """The request as the agent takes it; :class:`InvalidParam` for what no model could take."""
    system: list[str] = []
    out: list[dict[str, Any]] = []
    pending: dict[str, str] = {}  # the last assistant's calls not answered yet: client id -> ours
    # The blocks of the message that gathers a run of tool messages' results (None once another
    # kind of message comes), so each result is one append: thousands of them stay linear.
    results: list[dict[str, Any]] | None = None
    for index, message in enumerate(body.messages):
        param = f"messages.[{index}]"
        if pending and not isinstance(message, ChatToolMessage):
            raise InvalidParam(_unanswered(pending), param)
        if not isinstance(message, ChatToolMessage):
            results = None
        if isinstance(message, ChatSystemMessage):
            text = _text(message.content, f"{param}.content")
            if text.strip():
                system.append(text)
        elif isinstance(message, ChatUserMessage):
            text = _text(message.content, f"{param}.content")
            if not text.strip():
                raise InvalidParam("a user message must hold some text", f"{param}.content")
            out.append({"role": "user", "content": [{"text": text}]})
        elif isinstance(message, ChatAssistantMessage):
            blocks: list[dict[str, Any]] = []
            text = _text(message.content, f"{param}.content") or message.refusal or ""
            if text.strip():
                blocks.append({"text": text})
            for number, call in enumerate(message.tool_calls or []):
                if call.id in pending:
                    raise InvalidParam(f"tool call id {call.id!r} is given twice", f"{param}.tool_calls")
                pending[call.id] = tool_use_id(call.id)
                arguments = _arguments(
                    call.function.arguments, f"{param}.tool_calls.[{number}].function.arguments"
                )
                blocks.append(
                    {
                        "toolUse": {
                            "toolUseId": pending[call.id],
                            "name": call.function.name,
                            "input": arguments,
                        }
                    }
                )
            if blocks:  # an empty answer says nothing a model could take
                out.append({"role": "assistant", "content": blocks})
        else:
            ours = pending.pop(message.tool_call_id, None)
            if ours is None:
                raise InvalidParam(
                    f"tool_call_id {message.tool_call_id!r} answers no tool call of the assistant message "
                    "before it",
                    f"{param}.tool_call_id",
                )
            text = _text(message.content, f"{param}.content")
            if results is None:
                results = []
                out.append({"role": "user", "content": results})
            results.append(
                {
                    "toolResult": {
                        "toolUseId": ours,
                        "content": [{"text": text if text.strip() else NO_OUTPUT}],
                    }
                }
            )
    last = body.messages[-1]
    if pending or not isinstance(last, ChatUserMessage | ChatToolMessage):
        raise InvalidParam(
            _unanswered(pending) if pending else "the last message must be the user's or a tool result",
            f"messages.[{len(body.messages) - 1}]",
        )
    return Query(
        messages=out[:-1] if isinstance(last, ChatUserMessage) else out,
        text=out[-1]["content"][0]["text"] if isinstance(last, ChatUserMessage) else "",
        options=RunOptions(
            client_tools=_client_tools(body),
            system="\n\n".join(system),
            max_tokens=body.max_completion_tokens or body.max_tokens,
            resume=isinstance(last, ChatToolMessage),
            # Chat Completions has no way to ask its client for a tool approval, and the query's
            # short-lived session is no one else's to answer: such a call is declined at once.
            approvals=False,
        ),
    )


def _client_tools(body: ChatCompletionRequest) -> tuple[dict[str, Any], ...]:
    if body.tool_choice == "none" or not body.tools:
        return ()  # "none": the model may not call them, so they are not offered
    specs: dict[str, dict[str, Any]] = {}
    for index, tool in enumerate(body.tools):
        function = tool.function
        if function.name in specs:
            raise InvalidParam(f"tool name {function.name!r} is given twice", f"tools.[{index}]")
        specs[function.name] = {
            "name": function.name,
            "description": function.description or "",
            "input_schema": function.parameters or {"type": "object", "properties": {}},
        }
    return tuple(specs.values())


# --- events to chunks --------------------------------------------------------------------------


def chat_usage(usage: Usage) -> ChatUsage:
    """Usage in OpenAI's words."""
    return {
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.total_tokens,
    }


def finish_reason(done: RunDone, handed_back: bool) -> str:
    """How the answer ended, in OpenAI's words."""
    if handed_back and done.stop_reason == "tool_use":
        return "tool_calls"
    if done.truncated or done.max_turns_reached or done.stop_reason == "max_tokens":
        return "length"
    if done.stop_reason in {"content_filtered", "guardrail_intervened"}:
        return "content_filter"
    return "stop"


@dataclass
class _Call:
    index: int
    id: str
    name: str
    arguments: list[str] = field(default_factory=list)


class ChatProjection:
    """One answer's events as chunks; it remembers what it showed, for the whole completion."""

    def __init__(self, completion_id: str, model: str, created: int, client_tools: frozenset[str]) -> None:
        self.completion_id = completion_id
        self.model = model
        self.created = created
        self.client_tools = client_tools
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[str, _Call] = {}
        self.finish: str | None = None
        self.usage: ChatUsage | None = None
        self.output = ""  # the last turn's text, as the run's end tells it
        self._text_turn: int | None = None

    def chunk(self, delta: ChatDelta, finish: str | None = None) -> ChatCompletionChunk:
        """A chunk of this answer."""
        return {
            "id": self.completion_id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
        }

    def first(self) -> ChatCompletionChunk:
        """The chunk that opens the stream: the role."""
        return self.chunk({"role": "assistant", "content": ""})

    def usage_chunk(self) -> ChatCompletionChunk:
        """The last chunk when ``stream_options.include_usage`` is set: no choices, the usage."""
        chunk = self.chunk({})
        chunk["choices"] = []
        chunk["usage"] = self.usage or chat_usage(Usage())
        return chunk

    def project(self, event: Event) -> ChatCompletionChunk | None:
        """The chunk for one event, or None when this wire does not show it."""
        if isinstance(event, TextDelta):
            text = event.text
            if self._text_turn is not None and event.turn != self._text_turn and self.text:
                text = TURN_SEPARATOR + text  # each turn's words apart from the last turn's
            self._text_turn = event.turn
            self.text.append(text)
            return self.chunk({"content": text})
        if isinstance(event, ReasoningDelta):
            self.reasoning.append(event.text)
            return self.chunk({"reasoning_content": event.text})
        if isinstance(event, ToolUseStart | ToolUse) and event.tool in self.client_tools:
            call = self.calls.get(event.tool_use_id)
            if call is not None:
                return None  # started already; its arguments came as they streamed
            call = self.calls[event.tool_use_id] = _Call(len(self.calls), event.tool_use_id, event.tool)
            arguments = ""
            if isinstance(event, ToolUse):  # its start was not seen (purged): all of it at once
                arguments = jsonsafe.arguments_text(event.input)
                call.arguments.append(arguments)
            return self.chunk(
                {
                    "tool_calls": [
                        {
                            "index": call.index,
                            "id": call.id,
                            "type": "function",
                            "function": {"name": call.name, "arguments": arguments},
                        }
                    ]
                }
            )
        if isinstance(event, ToolInputDelta):
            call = self.calls.get(event.tool_use_id)
            if call is None:
                return None
            call.arguments.append(event.delta)
            return self.chunk({"tool_calls": [{"index": call.index, "function": {"arguments": event.delta}}]})
        if isinstance(event, RunDone):
            self.finish = finish_reason(event, bool(self.calls))
            self.usage = chat_usage(event.usage)
            self.output = event.output
            return self.chunk({}, self.finish)
        return None

    def completion(self) -> ChatCompletion:
        """Everything projected so far as one ``chat.completion``."""
        message: ChatAnswer = {"role": "assistant", "content": "".join(self.text) or None, "refusal": None}
        if self.reasoning:
            message["reasoning_content"] = "".join(self.reasoning)
        if self.calls:
            message["tool_calls"] = [_tool_call(call) for call in self.calls.values()]
        return {
            "id": self.completion_id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": [
                {"index": 0, "message": message, "finish_reason": self.finish or "stop", "logprobs": None}
            ],
            "usage": self.usage or chat_usage(Usage()),
        }


def _tool_call(call: _Call) -> ChatToolCall:
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": "".join(call.arguments) or "{}"},
    }


# --- errors ------------------------------------------------------------------------------------

DONE_BLOCK = f"data: [DONE]{SSE_SEP}{SSE_SEP}"


class ChunkStream(Projector):
    """A ``stream: true`` completion: ``chat.completion.chunk``\\ s on ``data:`` lines (each with
    the log's id as ``id:``), then the usage chunk when asked for and ``data: [DONE]``; a failed
    run ends with an error line and no ``[DONE]``, as OpenAI-compatible servers end one."""

    def __init__(self, projection: ChatProjection, include_usage: bool) -> None:
        self.projection = projection
        self.include_usage = include_usage
        self.failure: RunError | None = None

    def head(self) -> str:
        return sse_block(jsonsafe.dumps(self.projection.first()))

    def frames(self, entry: LogEntry) -> bytes:
        chunk = self.projection.project(entry.event)
        if chunk is not None:
            return sse_block(jsonsafe.dumps(chunk), id=entry.id).encode()
        if isinstance(entry.event, RunError):
            self.failure = entry.event
        return b""

    def end(self, ending: Ending | None) -> str:
        failure = self.failure
        if failure is None and (ending is None or not ending.clean):
            # Purged past this reader, the store gone, or the log closed under it (the server is
            # going away): said in OpenAI's way rather than by hanging up.
            failure = ending.as_error() if ending is not None else RunError(error="the stream ended early")
        if failure is not None:
            status = run_error_status(failure)
            return sse_block(jsonsafe.dumps(error_body(status, failure.error, failure.code)))
        usage = sse_block(jsonsafe.dumps(self.projection.usage_chunk())) if self.include_usage else ""
        return usage + DONE_BLOCK
