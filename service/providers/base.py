"""What every model provider offers the agent loop: a raw event stream and the parser for it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from service.core.events import Event


@dataclass(frozen=True)
class ModelRequest:
    """One model turn: the conversation in Bedrock's message format, tools and limits."""

    messages: list[dict[str, Any]]
    system: str = ""
    tool_specs: tuple[dict[str, Any], ...] = ()
    max_tokens: int = 4096


class StreamParser(Protocol):
    """Turns a provider's raw stream events into canonical events and a turn result."""

    def feed(self, event: Any) -> list[Event]:
        """Canonical events to emit for one raw event."""
        ...

    def result(self) -> Any:
        """The finished turn (a ``TurnResult``)."""
        ...

    def text_so_far(self) -> str:
        """The answer's text so far, for a turn that will not finish."""
        ...


class ModelProvider(Protocol):
    """A model behind a streaming API."""

    name: str

    def new_parser(self, turn: int) -> StreamParser:
        """A fresh parser for one turn's stream."""
        ...

    def stream(self, request: ModelRequest) -> AsyncIterator[Any]:
        """The raw events of one model turn; closing the iterator closes the upstream stream."""
        ...

    async def close(self) -> None:
        """Free threads and connections."""
        ...


def alternate_roles(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Merge neighbouring messages of the same role, as Bedrock requires strict alternation.

    A failed or cancelled query can leave two user messages in a row (its question and the
    next one); merging keeps every word and makes the conversation valid again.
    """
    merged: list[dict[str, Any]] = []
    for message in messages:
        if merged and merged[-1]["role"] == message["role"]:
            merged[-1] = {
                "role": message["role"],
                "content": [*merged[-1]["content"], *message["content"]],
            }
        else:
            merged.append(message)
    return merged
