"""What AG-UI's ``RunAgentInput`` brings, as the service reads it (the new query), and the
session's conversation as AG-UI messages (for ``MESSAGES_SNAPSHOT``)."""

from __future__ import annotations

import json
from typing import Any

from ag_ui.core import AssistantMessage, FunctionCall, RunAgentInput, ToolCall, ToolMessage, UserMessage

from service.transports.edge.inputs import query_text

Message = UserMessage | AssistantMessage | ToolMessage


def query_of(body: RunAgentInput) -> str:
    """The new query: the text of the last message, which must be the user's (``ValueError``)."""
    if not body.messages:
        raise ValueError("messages is empty; the last one must be the user's new message")
    last = body.messages[-1]
    if not isinstance(last, UserMessage):
        raise ValueError(f"the last message must be the user's, not {last.role!r}")
    content = last.content
    text = (
        content if isinstance(content, str) else "".join(getattr(part, "text", "") or "" for part in content)
    )
    return query_text(text)


# -- the conversation, as AG-UI messages ----------------------------------------------------------


def _text(blocks: list[dict[str, Any]]) -> str:
    return "".join(block["text"] for block in blocks if isinstance(block.get("text"), str))


def messages_of(conversation: list[dict[str, Any]]) -> list[Message]:
    """A session's conversation (Bedrock's message format) as AG-UI messages, ids ``m<index>``."""
    out: list[Message] = []
    for index, message in enumerate(conversation):
        blocks = message.get("content") or []
        message_id = f"m{index}"
        if message.get("role") == "assistant":
            calls = [
                ToolCall(
                    id=block["toolUse"]["toolUseId"],
                    function=FunctionCall(
                        name=block["toolUse"]["name"],
                        arguments=json.dumps(block["toolUse"].get("input"), allow_nan=False),
                    ),
                )
                for block in blocks
                if "toolUse" in block
            ]
            out.append(
                AssistantMessage(id=message_id, content=_text(blocks) or None, tool_calls=calls or None)
            )
            continue
        results = [block["toolResult"] for block in blocks if "toolResult" in block]
        for number, result in enumerate(results):
            error = result.get("status") == "error"
            content = _text(result.get("content") or [])
            out.append(
                ToolMessage(
                    id=f"{message_id}-{number}",
                    tool_call_id=result["toolUseId"],
                    content=content,
                    error=content if error else None,
                )
            )
        text = _text(blocks)
        if text or not results:
            out.append(UserMessage(id=message_id, content=text))
    return out


def history_before(conversation: list[dict[str, Any]], query: str) -> list[dict[str, Any]]:
    """The conversation before the running query's user message (a live session's conversation
    may already hold the query and part of its answer)."""
    for index in range(len(conversation) - 1, -1, -1):
        message = conversation[index]
        if message.get("role") == "user" and message.get("content") == [{"text": query}]:
            return conversation[:index]
    return conversation
