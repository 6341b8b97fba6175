"""A chat as the AI SDK holds it (``UIMessage[]``), built from the session's conversation, for
``GET /api/chat/{id}``: what ``useChat({messages})`` or ``new Chat({messages})`` is given to show
a chat again and go on with it.

Each message the user wrote is a user ``UIMessage`` with its id. The assistant's messages and the
tool results after it, up to the next message the user wrote, are one assistant ``UIMessage`` (as
one streamed answer is), with the id of the first of them (the answer's ``reply_id``), and per
model turn:

- ``step-start``, then its reasoning (``reasoning``) and text (``text``) in order, ``state: done``;
- each tool call: a service tool as ``dynamic-tool``, a browser tool as ``tool-<name>`` (as the
  stream had them), in state ``output-available`` (``output``: the result as the model was told it;
  a browser tool's JSON object or array as the object it gave), ``output-error`` (``errorText``), or
  ``input-available`` while it has no result (the query waits on it, or was stopped before it);
- ``metadata``: ``usage`` (what the answer's model turns used, named as the stream's ``finish``
  names it) and ``interrupted: true`` for an answer cut short by a cancel.

An approval leaves no mark of its own in the conversation: a call that was denied is an
``output-error`` with the reason the model was told.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from service.core import conversation
from service.core.events import Usage
from service.transports.stream.session import usage_dict

UIMessage = dict[str, Any]
Part = dict[str, Any]


def ui_messages(messages: list[dict[str, Any]], server_tool: Callable[[str], bool]) -> list[UIMessage]:
    """The conversation ``messages`` as the AI SDK's ``UIMessage[]``; ``server_tool`` tells the
    service's own tools from the browser's."""
    results = _results(messages)
    chat: list[UIMessage] = []
    answer: UIMessage | None = None
    usage = Usage()
    for index, message in enumerate(messages):
        if conversation.is_user_text(message):
            answer = None
            chat.append(
                {
                    "id": conversation.message_id(messages, index),
                    "role": "user",
                    "parts": [{"type": "text", "text": conversation.text_of(message)}],
                }
            )
            continue
        if message.get("role") != "assistant":
            continue  # tool results: told in the calls' parts
        if answer is None:
            usage = Usage()
            answer = {"id": conversation.message_id(messages, index), "role": "assistant", "parts": []}
            chat.append(answer)
        answer["parts"] += _turn_parts(message, results, server_tool)
        if isinstance(message.get("usage"), dict):
            usage = usage + Usage.model_validate(message["usage"])
        metadata: dict[str, Any] = {"usage": usage_dict(usage)}
        if message.get("interrupted") or answer.get("metadata", {}).get("interrupted"):
            metadata["interrupted"] = True
        answer["metadata"] = metadata
    return chat


def _results(messages: list[dict[str, Any]]) -> dict[str, conversation.Result]:
    """Every tool result of the conversation, by its call's id."""
    return {
        result.id: result
        for message in messages
        if message.get("role") == "user"
        for result in conversation.results_of(message)
    }


def _turn_parts(
    message: dict[str, Any], results: dict[str, conversation.Result], server_tool: Callable[[str], bool]
) -> list[Part]:
    parts: list[Part] = [{"type": "step-start"}]
    for item in conversation.parts_of(message):
        if isinstance(item, conversation.Text):
            parts.append({"type": "text", "text": item.text, "state": "done"})
        elif isinstance(item, conversation.Reasoning):
            parts.append({"type": "reasoning", "text": item.text, "state": "done"})
        else:
            parts.append(_tool_part(item, results, server_tool))
    return parts


def _tool_part(
    call: conversation.Call, results: dict[str, conversation.Result], server_tool: Callable[[str], bool]
) -> Part:
    browser = not server_tool(call.name)
    part: Part = (
        {"type": f"tool-{call.name}", "toolCallId": call.id}
        if browser
        else {"type": "dynamic-tool", "toolName": call.name, "toolCallId": call.id}
    )
    part["input"] = call.input
    result = results.get(call.id)
    if result is None:
        part["state"] = "input-available"
    elif result.is_error:
        part.update(state="output-error", errorText=result.text)
    else:
        part.update(state="output-available", output=_browser_output(result.text) if browser else result.text)
    return part


def _browser_output(text: str) -> Any:
    """A browser tool's output as it gave it: an object or array was told to the model as JSON,
    anything else as its text."""
    if text[:1] in ("{", "["):
        try:
            return json.loads(text)
        except ValueError:
            pass
    return text
