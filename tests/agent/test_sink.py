"""Text deltas handed down to the provider (:data:`~service.core.events.Sink`): the run sees the
same events in the same order as when every delta climbs the agent's generators, and the loop
knows what the client saw of a turn, whichever way its deltas went.

The provider is a script that offers its text deltas to the sink when it takes one; each test runs
the same script with the sink and without, and compares.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import pytest

from service.agent.loop import AgentLoop
from service.agent.tools import ToolExecutor
from service.core.events import Event, RunDone, RunError, Sink, StepCompleted, TextDelta, text_delta
from service.errors import ModelStreamError
from service.providers.base import ModelRequest, TurnResult
from tests.agent.test_loop_client_tools import text_turn

Step = Event | TurnResult | ModelStreamError


class SinkProvider:
    """Plays one script per turn: events (text deltas offered to ``sink`` first), a result, or an
    error raised where it stands."""

    name = "scripted"

    def __init__(self, *turns: list[Step]) -> None:
        self.turns = list(turns)
        self.offered = 0

    async def stream(
        self, request: ModelRequest, turn: int = 1, sink: Sink | None = None
    ) -> AsyncGenerator[Event | TurnResult, None]:
        for step in self.turns.pop(0):
            if isinstance(step, ModelStreamError):
                raise step
            if sink is not None and type(step) is TextDelta:
                self.offered += 1
                if sink(step):
                    continue
            yield step

    async def close(self) -> None:
        pass


async def run(
    turns: list[list[Step]], sink: Sink | None, messages: list[dict[str, Any]] | None = None
) -> tuple[list[Event], SinkProvider]:
    """The events of one query over ``turns``, in the order the run would log them."""
    provider = SinkProvider(*turns)
    agent = AgentLoop(provider, ToolExecutor([]), throttle_retries=1)
    agent.retry_delay = lambda attempt: 0.0  # type: ignore[method-assign]
    logged: list[Event] = []

    def take(event: Event) -> bool:
        if sink is None or not sink(event):
            return False
        logged.append(event)  # logged where the provider read it, as the run manager's sink does
        return True

    events = agent.run(messages if messages is not None else [], "hi", 3, sink=take if sink else None)
    async for event in events:
        logged.append(event)
    return logged, provider


def without_times(events: list[Event]) -> list[dict[str, Any]]:
    return [event.model_dump(exclude={"at"}) for event in events]


def takes_all(event: Event) -> bool:
    return True


def takes_every_other(event: Event) -> bool:
    takes_every_other.n = getattr(takes_every_other, "n", 0) + 1  # type: ignore[attr-defined]
    return takes_every_other.n % 2 == 0  # type: ignore[attr-defined]


@pytest.mark.parametrize("sink", [takes_all, takes_every_other], ids=["takes all", "takes every other"])
async def test_the_run_sees_the_same_events_in_the_same_order(sink: Sink) -> None:
    script = [[text_delta("Hel", 1), text_delta("lo", 1), text_delta("!", 1), text_turn("Hello!")]]
    through_generators, _ = await run([list(script[0])], None)
    handed_down, provider = await run([list(script[0])], sink)
    assert without_times(handed_down) == without_times(through_generators)
    assert provider.offered == 3
    assert isinstance(handed_down[-1], RunDone)


async def test_text_the_sink_took_counts_as_seen_a_later_error_is_not_retried() -> None:
    """The client saw the deltas the sink took: a stream error after them ends the turn (a retry
    would show them twice), and the conversation keeps them as the assistant's partial answer."""
    failing = ModelStreamError("slow down", code="throttlingException", retryable=True)
    turns: list[list[Step]] = [
        [text_delta("Half ", 1), text_delta("an answer", 1), failing],
        [text_turn("x")],
    ]
    messages: list[dict[str, Any]] = []
    events, provider = await run(turns, takes_all, messages)
    assert isinstance(events[-1], RunError) and events[-1].code == "throttlingException"
    step = next(e for e in events if isinstance(e, StepCompleted))
    assert step.text == "Half an answer"
    assert messages[-1] == {"role": "assistant", "content": [{"text": "Half an answer"}]}
    assert len(provider.turns) == 1  # the retry's script was never asked for


async def test_an_error_before_any_text_is_still_retried_with_a_sink() -> None:
    failing = ModelStreamError("slow down", code="throttlingException", retryable=True)
    events, provider = await run([[failing], [text_delta("ok", 1), text_turn("ok")]], takes_all)
    assert isinstance(events[-1], RunDone)
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["ok"]
    assert not provider.turns
