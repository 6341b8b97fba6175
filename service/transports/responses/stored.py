"""A response told from the stored conversation, once the session's log no longer holds its query
(purged, or the service restarted on the session database).

The conversation keeps what the response said, under its id (see
:mod:`service.core.conversation`): its turns' assistant messages and the tool results they led
to. What only the events told (the request's ``instructions``, ``tools`` and ``metadata``, when it
was made) is not kept there, so it is left out.
"""

from __future__ import annotations

from typing import Any

from service import jsonsafe
from service.core import conversation
from service.core.conversation import Call, Reasoning, Text
from service.transports.responses.projector import (
    RESPONSE_PREFIX,
    SERVER_LABEL,
    tool_error,
    unique_id,
    usage_body,
)


def belongs(identifier: str, response_id: str) -> bool:
    """True for the id of a message the response wrote: its first turn's, ``<id>-<turn>``,
    ``<id>-<turn>-results`` and its ``<id>-input``."""
    return identifier == response_id or identifier.startswith(f"{response_id}-")


def from_conversation(
    response_id: str, session_id: str, messages: list[dict[str, Any]], model: str = ""
) -> dict[str, Any]:
    """The response whose messages ``messages`` holds, as far as they tell it (``model``: the
    one this service answers as now)."""
    token = response_id.removeprefix(RESPONSE_PREFIX)
    results: dict[str, conversation.Result] = {}
    answers: list[tuple[str, dict[str, Any]]] = []
    for index, identifier in conversation.ids(messages):
        if not belongs(identifier, response_id):
            continue
        message = messages[index]
        if message.get("role") == "assistant":
            answers.append((identifier, message))
        else:
            results.update((result.id, result) for result in conversation.results_of(message))
    output: list[dict[str, Any]] = []
    interrupted = False
    for identifier, message in answers:
        interrupted = interrupted or bool(message.get("interrupted"))
        item_token = identifier.removeprefix(response_id)
        for part in conversation.parts_of(message):
            if isinstance(part, Text):
                output.append(
                    {
                        "id": unique_id(f"msg_{token}{item_token}", output),
                        "type": "message",
                        "status": "completed",
                        "role": "assistant",
                        "content": [
                            {"type": "output_text", "text": part.text, "annotations": [], "logprobs": []}
                        ],
                    }
                )
            elif isinstance(part, Reasoning):
                output.append(
                    {
                        "id": unique_id(f"rs_{token}{item_token}", output),
                        "type": "reasoning",
                        "status": "completed",
                        "summary": [{"type": "summary_text", "text": part.text}],
                    }
                )
            elif isinstance(part, Call):
                output.append(_call(part, results.get(part.id)))
    usage = conversation.usage_of([message for _, message in answers])
    return {
        "id": response_id,
        "object": "response",
        "created_at": 0,
        "completed_at": None,
        "status": "cancelled" if interrupted else "completed",
        "background": False,
        "store": True,
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "max_output_tokens": None,
        "metadata": {},
        "model": model,
        "output": output,
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "temperature": None,
        "top_p": None,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "truncation": "disabled",
        "usage": usage_body(usage),
        "user": None,
        "session_id": session_id,
    }


def _call(call: Call, result: conversation.Result | None) -> dict[str, Any]:
    """A call with a result the service ran (its own tool); one without was handed back."""
    arguments = jsonsafe.arguments_text(call.input)
    if result is None:
        return {
            "id": f"fc_{call.id}",
            "type": "function_call",
            "status": "completed",
            "call_id": call.id,
            "name": call.name,
            "arguments": arguments,
        }
    return {
        "id": f"mcp_{call.id}",
        "type": "mcp_call",
        "status": "failed" if result.is_error else "completed",
        "server_label": SERVER_LABEL,
        "name": call.name,
        "arguments": arguments,
        "output": result.text,
        "error": tool_error(result.text) if result.is_error else None,
    }
