"""A Responses request as the agent takes it: pure functions from OpenAI's items to the canonical
conversation (Bedrock's message format, as the agent keeps it).

``input`` items become messages: a ``user`` message the query's text (the last one) or a user
turn of the history, an ``assistant`` message and the ``function_call``\\ s after it one assistant
turn (``toolUse`` blocks), ``function_call_output``\\ s one user turn of ``toolResult`` blocks.
``system`` and ``developer`` messages, after ``instructions``, are the system prompt. Every call
must be answered before anything else comes, as OpenAI requires (and Bedrock too): the calls the
previous response handed back first. What no model could take is refused here, with the
message and ``param`` a 400 carries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from service import jsonsafe
from service.core.conversation import tool_use_id
from service.transports.edge.openai_errors import InvalidParam
from service.transports.responses.models import (
    ResponseFunctionCallItem,
    ResponseFunctionCallOutputItem,
    ResponseFunctionTool,
    ResponseItemReference,
    ResponseMessageItem,
    ResponseRequest,
    ResponseSkippedItem,
)

NO_OUTPUT = "(no output)"
# The ids of the output items a reference may name: an answer's text is read back from the stored
# conversation; reasoning and the service's own tool calls are left out, as they are when a
# client sends them in full.
MESSAGE_PREFIX = "msg_"
_LEFT_OUT_PREFIXES = ("rs_", "mcp_", "mcpr_")


@dataclass(frozen=True, slots=True)
class Query:
    """What the query adds to the conversation (``prelude``), its text (empty with ``resume``:
    the prelude ends with the user's turn), the system prompt the request brings and the
    client's tools (specs as the agent takes them)."""

    prelude: tuple[dict[str, Any], ...]
    text: str
    resume: bool
    system: str
    client_tools: tuple[dict[str, Any], ...]
    tools: tuple[dict[str, Any], ...]  # as the request gave them, for the response to show


def param_of(loc: tuple[int | str, ...], prefix: str = "") -> str:
    """A pydantic error location as OpenAI names a parameter (``input[0].content``)."""
    name = prefix
    previous: int | str | None = None
    for item in loc:
        if isinstance(item, int):
            name += f"[{item}]"
        elif isinstance(previous, int) and item in _ITEM_TAGS:
            pass  # the input item's type, which pydantic names after the item's index
        elif item.replace("_", "").isalnum() and not item[:1].isupper() and item not in _TYPE_NAMES:
            name += f".{item}" if name else item
        # Else a union's member (``constrained-str``, ``list[...]``, a model's name): no field.
        previous = item
    return name or "body"


_TYPE_NAMES = frozenset({"str", "int", "bool", "none", "list", "dict", "float"})
# The item types pydantic adds to a location as the discriminated union's member.
_ITEM_TAGS = frozenset({"message", "function_call", "function_call_output", "skipped", "item_reference"})


def _text(content: str | list[dict[str, Any]], param: str) -> str:
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for index, part in enumerate(content):
        kind = part.get("type")
        if kind in {"input_text", "output_text", "text"} and isinstance(part.get("text"), str):
            parts.append(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            parts.append(part["refusal"])
        else:
            raise InvalidParam(f"only text content is supported here, not {kind!r}", f"{param}[{index}].type")
    return "\n".join(parts)


def _arguments(text: str, param: str) -> dict[str, Any]:
    value = jsonsafe.loads_object(text)
    if value is None:
        raise InvalidParam("the arguments must be a JSON object", param)
    return value


def _no_output(pending: dict[str, str]) -> str:
    return f"No tool output found for function call {next(iter(pending))}."


class _Turns:
    """Messages being built: a block joins the last message when it has the same role, so the
    roles alternate as every model requires."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []

    def add(self, role: str, block: dict[str, Any]) -> None:
        if self.messages and self.messages[-1]["role"] == role:
            self.messages[-1]["content"].append(block)
        else:
            self.messages.append({"role": role, "content": [block]})


def message_references(body: ResponseRequest) -> list[tuple[str, str]]:
    """``(id, param)`` of each answer (``msg_`` item) the input names by reference: their text
    is to be read from the conversations that hold them, for :func:`to_query`."""
    if isinstance(body.input, str):
        return []
    return [
        (item.id, f"input[{index}].id")
        for index, item in enumerate(body.input)
        if isinstance(item, ResponseItemReference) and item.id.startswith(MESSAGE_PREFIX)
    ]


def _dereferenced(item: ResponseItemReference, answers: dict[str, str], param: str) -> Any:
    """The item a reference names: an answer as an assistant message, None for one left out."""
    if item.id.startswith(_LEFT_OUT_PREFIXES):
        return None
    if item.id.startswith(MESSAGE_PREFIX) and item.id in answers:
        return ResponseMessageItem(role="assistant", content=answers[item.id], id=item.id)
    raise InvalidParam(
        f"only an answer's message (msg_), its reasoning (rs_) and the service's own tool calls (mcp_) "
        f"can be referenced here, not {item.id!r}: send the item itself",
        f"{param}.id",
    )


def to_query(
    body: ResponseRequest, pending: dict[str, str] | None = None, answers: dict[str, str] | None = None
) -> Query:
    """The request as the agent takes it; ``pending`` are the calls the conversation it continues
    left unanswered (``call_id`` to tool-use id), ``answers`` the text of the answers the input
    references (see :func:`message_references`). :class:`InvalidParam` for what no model could take."""
    items: list[Any] = (
        [ResponseMessageItem(role="user", content=body.input)] if isinstance(body.input, str) else body.input
    )
    waiting = dict(pending or {})
    system = [body.instructions] if body.instructions and body.instructions.strip() else []
    turns = _Turns()
    last: Any = None
    for index, item in enumerate(items):
        param = f"input[{index}]"
        if isinstance(item, ResponseItemReference):
            item = _dereferenced(item, answers or {}, param)
        if item is None or isinstance(item, ResponseSkippedItem):
            continue
        if waiting and not isinstance(item, ResponseFunctionCallOutputItem | ResponseFunctionCallItem):
            raise InvalidParam(_no_output(waiting), "input")
        if isinstance(item, ResponseMessageItem):
            text = _text(item.content, f"{param}.content")
            if item.role in {"system", "developer"}:
                if text.strip():
                    system.append(text)
                continue
            if item.role == "user" and not text.strip():
                raise InvalidParam("a user message must hold some text", f"{param}.content")
            if text.strip():
                turns.add(item.role, {"text": text})
        elif isinstance(item, ResponseFunctionCallItem):
            if item.call_id in waiting:
                raise InvalidParam(f"call_id {item.call_id!r} is given twice", f"{param}.call_id")
            waiting[item.call_id] = ours = tool_use_id(item.call_id)
            use = {
                "toolUseId": ours,
                "name": item.name,
                "input": _arguments(item.arguments, f"{param}.arguments"),
            }
            turns.add("assistant", {"toolUse": use})
        else:
            ours = waiting.pop(item.call_id, None)
            if ours is None:
                raise InvalidParam(
                    f"No tool call found for function call output with call_id {item.call_id}.",
                    f"{param}.call_id",
                )
            output = _text(item.output, f"{param}.output")
            turns.add(
                "user",
                {
                    "toolResult": {
                        "toolUseId": ours,
                        "content": [{"text": output if output.strip() else NO_OUTPUT}],
                    }
                },
            )
        last = item
    if waiting:
        raise InvalidParam(_no_output(waiting), "input")
    messages = turns.messages
    if last is None or (isinstance(last, ResponseMessageItem) and last.role == "assistant") or not messages:
        raise InvalidParam(
            "the last input item must be a user message or a function_call_output", f"input[{len(items) - 1}]"
        )
    final = messages[-1]["content"]
    # The user's text alone in the last turn is the query's; joined to tool results, the whole
    # turn goes in as it is and the model answers it.
    asks = isinstance(last, ResponseMessageItem) and len(final) == 1
    return Query(
        prelude=tuple(messages[:-1] if asks else messages),
        text=final[0]["text"] if asks else "",
        resume=not asks,
        system="\n\n".join(system),
        client_tools=_client_tools(body) if body.tool_choice != "none" else (),
        tools=tuple(_tools(body)),
    )


def _tools(body: ResponseRequest) -> list[dict[str, Any]]:
    tools = []
    for index, tool in enumerate(body.tools or []):
        if tool.get("type") != "function":
            raise InvalidParam(
                f"tools of type {tool.get('type')!r} are not supported here: only function tools, "
                "which the client runs (the service's own tools run inside it)",
                f"tools[{index}].type",
            )
        try:
            parsed = ResponseFunctionTool.model_validate(tool)
        except ValidationError as exc:
            problem = exc.errors(include_url=False)[0]
            raise InvalidParam(
                f"invalid tool: {problem['msg']}", param_of(problem["loc"], f"tools[{index}]")
            ) from None
        tools.append(parsed.model_dump(exclude_none=True))
    return tools


def _client_tools(body: ResponseRequest) -> tuple[dict[str, Any], ...]:
    specs: dict[str, dict[str, Any]] = {}
    for index, tool in enumerate(_tools(body)):
        if tool["name"] in specs:
            raise InvalidParam(f"tool name {tool['name']!r} is given twice", f"tools[{index}].name")
        specs[tool["name"]] = {
            "name": tool["name"],
            "description": tool.get("description") or "",
            "input_schema": tool.get("parameters") or {"type": "object", "properties": {}},
        }
    return tuple(specs.values())
