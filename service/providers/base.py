"""What every model provider offers the agent loop: one model turn as canonical events, then its result.

A provider owns its wire. It reads its upstream's raw stream (ConverseStream events, chat
completion chunks) and feeds it to its own parser, beside it in this package, and
:meth:`ModelProvider.stream` yields what the loop needs: the turn's canonical events as they
arrive, then one :class:`TurnResult` (the assistant message in Bedrock's format, the stop reason,
the usage, the tool uses to run). Errors are raised as :class:`~service.errors.ProviderError`.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Protocol

from service.core.events import Event, Sink, TextDelta, Usage

# How long a pooled upstream connection may sit idle before the pool closes it. aiohttp's and
# aiobotocore's defaults (15 and 12 s) close the pool between two bursts of queries a quarter of a
# minute apart, and every query of the next burst then opens a connection again (with TLS to
# Bedrock, a handshake each), which shows in the CPU per token (measured: docs/benchmarks.md,
# section Counters and JSON off the per-token path (6034038), "Idle upstream connections kept a
# minute"). A minute matches common server-side idle timeouts (an upstream that closes sooner says
# so, and the pool drops the connection); botocore's own pool keeps them until then.
POOL_IDLE_S = 60.0


@dataclass(frozen=True)
class ModelRequest:
    """One model turn: the conversation in Bedrock's message format, tools and limits."""

    messages: list[dict[str, Any]]
    system: str = ""
    tool_specs: tuple[dict[str, Any], ...] = ()
    max_tokens: int = 4096
    # The model to ask (the provider's own when empty): agents that share an upstream share its
    # provider, and with it one connection pool, each naming its own model.
    model: str = ""
    temperature: float | None = None
    # Headers for the upstream request: the turn's trace context (``traceparent``) when traces
    # are on (service.agent.spans.carry).
    headers: tuple[tuple[str, str], ...] = ()


@dataclass
class PendingToolUse:
    """A complete tool-use block the agent loop has to run."""

    tool: str
    tool_use_id: str
    input: Any
    input_error: str | None = None


@dataclass
class TurnResult:
    """Everything one model turn produced, ready for the agent loop."""

    message: dict[str, Any]
    stop_reason: str
    usage: Usage
    latency_ms: int | None
    tool_uses: list[PendingToolUse]
    text: str
    # The upstream's id of the response (an OpenAI chunk's ``id``; Bedrock's request id) and the
    # model that answered, as far as the wire tells them (the turn's span shows them).
    response_id: str = ""
    response_model: str = ""


class ModelProvider(Protocol):
    """A model behind a streaming API.

    ``stream`` may be given ``sink=`` (a :data:`~service.core.events.Sink`): it then offers each
    text delta to the sink first and yields only those the sink declines (did not append).
    """

    name: str

    def stream(
        self, request: ModelRequest, turn: int = 1, sink: Sink | None = None
    ) -> AsyncGenerator[Event | TurnResult, None]:
        """One model turn: its canonical events as they arrive, then its :class:`TurnResult`.

        Closing the iterator closes the upstream stream at once.
        """
        ...

    async def close(self) -> None:
        """Free connections (and any threads)."""
        ...


class StreamParser(Protocol):
    """Turns a provider's raw stream items into canonical events and a turn result."""

    def feed(self, item: Any) -> list[Event]:
        """Canonical events to emit for one raw item."""
        ...

    def result(self) -> TurnResult:
        """The finished turn; raises ProviderError if the stream ended too early."""
        ...


def appended_by_sink(event: Any, sink: Sink | None) -> bool:
    """Offer a text delta to ``sink``, which appends it to the run's log if it can: True when it
    did (the provider then does not yield it)."""
    return sink is not None and type(event) is TextDelta and sink(event)


async def parse_stream(
    raw: AsyncGenerator[Any, None], parser: StreamParser, sink: Sink | None = None
) -> AsyncGenerator[Event | TurnResult, None]:
    """A provider's raw stream through its parser: the canonical events, then the turn's result;
    with ``sink``, the text deltas it takes are not yielded."""
    # Closing this generator (the run was cancelled, the client left) closes the raw one at once.
    async with aclosing(raw) as items:
        async for item in items:
            for event in parser.feed(item):
                if not appended_by_sink(event, sink):
                    yield event
    yield parser.result()


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
