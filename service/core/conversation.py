"""A conversation's messages, their stable ids, and cutting it back (a rewind).

The conversation stays in Bedrock's message format, and each message carries its id under
``"id"`` (and ``"interrupted": true`` on an answer cut short by a cancel), which
:func:`for_model` leaves out of what a model is sent. The ids are stable across runs and faces:

- a user's message has the client's own id where it sent one (an AI SDK or AG-UI message id),
  else one made when its query started (:attr:`~service.core.events.RunStarted.message_id`);
- a query's answer has the id its run streamed (``reply_id``): its first assistant message has it
  as it is, a later model turn's ``<reply_id>-<turn>``, and the tool results a turn led to
  ``<reply_id>-<turn>-results``, so a face derives each one from the events alone.

Messages stored before ids existed get ``m<index>``.

A rewind cuts the conversation back to before one message. It is done by the run that follows
it (:meth:`~service.core.runs.RunManager.start`), after the run holds the session, and logged as
``conversation_rewound`` so every face and viewer sees it; the store keeps the cut conversation
when the run ends, as it keeps any other.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from service.core.events import ConversationRewound, Usage

Message = dict[str, Any]
# The keys of a stored message that are the service's, not the model's.
_OWN_KEYS = ("id", "interrupted", "usage")
# Bedrock's tool-use ids; a client's id of another form is mapped to one (the same one wherever
# it appears, so a call and its result still match).
_TOOL_USE_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


def new_message_id() -> str:
    """A fresh message id, in the alphabet of a client's."""
    return f"msg_{secrets.token_urlsafe(12)}"


def tool_use_id(client_id: str) -> str:
    """A client's tool-call id as a tool-use id Bedrock takes (letters, digits, ``_``, ``-``)."""
    if _TOOL_USE_ID.fullmatch(client_id):
        return client_id
    return "call_" + hashlib.sha256(client_id.encode()).hexdigest()[:40]


def turn_message_id(reply_id: str, turn: int) -> str:
    """The id of the assistant message of a query's model turn ``turn`` (from 1)."""
    return reply_id if turn <= 1 else f"{reply_id}-{turn}"


def results_message_id(reply_id: str, turn: int) -> str:
    """The id of the user message holding the tool results of a query's model turn ``turn``."""
    return f"{reply_id}-{turn}-results"


def message_id(messages: list[Message], index: int) -> str:
    """The id of ``messages[index]``."""
    held = messages[index].get("id")
    return held if isinstance(held, str) and held else f"m{index}"


def ids(messages: list[Message]) -> Iterator[tuple[int, str]]:
    """``(index, id)`` of every message."""
    for index in range(len(messages)):
        yield index, message_id(messages, index)


def find(messages: list[Message], wanted: str) -> int | None:
    """The index of the message with that id, or None."""
    for index, held in ids(messages):
        if held == wanted:
            return index
    return None


def is_user_text(message: Message) -> bool:
    """True for a message the user wrote (not one carrying tool results)."""
    return message.get("role") == "user" and not any(
        isinstance(block, dict) and "toolResult" in block for block in message.get("content", [])
    )


def text_of(message: Message) -> str:
    """The text blocks of a message, joined."""
    return "".join(
        block["text"]
        for block in message.get("content", [])
        if isinstance(block, dict) and isinstance(block.get("text"), str)
    )


def answer_starts(messages: list[Message], index: int) -> bool:
    """True when ``messages[index]`` is the first message of an answer (an assistant message
    right after the user's)."""
    return messages[index].get("role") == "assistant" and index > 0 and is_user_text(messages[index - 1])


def for_model(messages: list[Message]) -> list[Message]:
    """The messages as a model is sent them: role and content only."""
    if not any(key in message for message in messages for key in _OWN_KEYS):
        return messages
    return [{"role": message["role"], "content": message["content"]} for message in messages]


def usage_of(messages: list[Message]) -> Usage:
    """The usage the answers among ``messages`` recorded (those stored before it was recorded
    count nothing)."""
    total = Usage()
    for message in messages:
        usage = message.get("usage")
        if isinstance(usage, dict):
            total = total + Usage.model_validate(usage)
    return total


def rewind(messages: list[Message], index: int, usage: Usage) -> ConversationRewound:
    """Cut ``messages`` back to before ``messages[index]``, in place; the event that says so,
    with ``usage`` less what the removed answers used."""
    removed = messages[index:]
    wanted = message_id(messages, index)
    spent = usage_of(removed)
    del messages[index:]
    kept = Usage(
        input_tokens=max(0, usage.input_tokens - spent.input_tokens),
        output_tokens=max(0, usage.output_tokens - spent.output_tokens),
        total_tokens=max(0, usage.total_tokens - spent.total_tokens),
    )
    return ConversationRewound(message_id=wanted, kept=index, removed=len(removed), usage=kept)


# What a message holds, read out of its Bedrock blocks once here, so that the faces that show a
# conversation (the AI SDK's history, AG-UI's snapshot) read parts rather than a model's wire.


@dataclass(frozen=True, slots=True)
class Text:
    text: str


@dataclass(frozen=True, slots=True)
class Reasoning:
    text: str


@dataclass(frozen=True, slots=True)
class Call:
    """A tool call an assistant message made."""

    id: str
    name: str
    input: Any


@dataclass(frozen=True, slots=True)
class Result:
    """A tool call's result, as a user message carries it back."""

    id: str
    text: str
    is_error: bool


def parts_of(message: Message) -> Iterator[Text | Reasoning | Call]:
    """The text (non-empty), reasoning and tool calls of a message, in order."""
    for block in message.get("content", []):
        if not isinstance(block, dict):
            continue
        if isinstance(block.get("text"), str):
            if block["text"]:
                yield Text(block["text"])
        elif isinstance(block.get("reasoningContent"), dict):
            reasoning = block["reasoningContent"].get("reasoningText")
            if isinstance(reasoning, dict) and isinstance(reasoning.get("text"), str):
                yield Reasoning(reasoning["text"])
        elif isinstance(block.get("toolUse"), dict):
            use = block["toolUse"]
            yield Call(str(use.get("toolUseId", "")), str(use.get("name", "")), use.get("input"))


def calls_of(message: Message) -> list[Call]:
    """The tool calls of a message."""
    return [part for part in parts_of(message) if isinstance(part, Call)]


def results_of(message: Message) -> list[Result]:
    """The tool results a message carries."""
    found = []
    for block in message.get("content", []):
        result = block.get("toolResult") if isinstance(block, dict) else None
        if isinstance(result, dict) and isinstance(result.get("toolUseId"), str):
            text = "".join(
                item["text"]
                for item in result.get("content") or []
                if isinstance(item, dict) and isinstance(item.get("text"), str)
            )
            found.append(Result(result["toolUseId"], text, result.get("status") == "error"))
    return found
