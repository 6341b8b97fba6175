"""What the run manager needs from outside the core: the agent, an observer and a gate.

Protocols only (and the do-nothing observer and gate), so :mod:`service.core.runs` stays about
driving runs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from typing import Any, Protocol

from service.core.events import Event, Usage
from service.core.options import RunOptions


class Agent(Protocol):
    """What the run manager needs of an agent: a stream of canonical events for one query."""

    def run(
        self,
        messages: list[dict[str, Any]],
        user_text: str,
        max_turns: int,
        options: RunOptions | None = None,
    ) -> AsyncIterator[Event]:
        """Append the user's text to ``messages`` (unless ``options.resume``), work, and yield
        events ending with done/error.

        A run manager with an :class:`~service.core.approvals.ApprovalDesk` also passes
        ``approve=`` (an :data:`~service.core.approvals.Approver`), which the agent awaits with
        the tool uses that need a person's approval before they run. Where the run's log can take
        an event at once it passes ``sink=`` (a :data:`~service.core.events.Sink`), which the
        agent offers its text deltas to first, yielding only those it declines. It always passes
        ``charge=``, a callable the agent tells the estimated :class:`Usage` of a model turn that
        a cancel cut short (the model reports usage only at a turn's end).
        """
        ...


class Agents(Protocol):
    """The agents a run manager serves, by the name a session is bound to."""

    def resolve(self, name: str) -> tuple[Agent, int]:
        """The agent of that name as it is defined now, and its most turns per query;
        :class:`~service.errors.UnknownAgent` when none has it."""
        ...


class RunObserver(Protocol):
    """Told what the runs do, for metrics; every call is cheap and synchronous."""

    def run_started(self, run_id: str, appended: int, agent: str = "") -> None: ...

    def event_logged(self, run_id: str, event: Event) -> None: ...

    def run_finished(self, run_id: str, terminal: Event, appended: int) -> None: ...


class RunGate(Protocol):
    """Per-owner limits on runs (quotas); every call is cheap and returns at once.

    ``admit`` refuses a run before anything of it exists by raising (the transports' quotas
    raise :class:`~service.errors.QuotaExceeded`); a gate that must ask elsewhere (quotas shared
    through Redis) returns an awaitable instead, which raises the same way. Each admitted run is
    ``release``d exactly once, however it ends; a gate may return an awaitable from it that
    completes once the run's slot is free everywhere (the manager waits for it before the run's
    terminal event is logged, so a client that has read ``done`` may start its next query), and
    that never raises. ``used`` hears the model tokens of each turn as it is logged.
    """

    def admit(self, owner: str) -> Awaitable[None] | None: ...

    def used(self, owner: str, usage: Usage) -> None: ...

    def release(self, owner: str) -> Awaitable[None] | None: ...


class NoGate:
    """The gate of a manager without quotas: admits every run."""

    def admit(self, owner: str) -> None:
        pass

    def used(self, owner: str, usage: Usage) -> None:
        pass

    def release(self, owner: str) -> None:
        pass


class NoObserver:
    """The observer of a manager without metrics."""

    def run_started(self, run_id: str, appended: int, agent: str = "") -> None:
        pass

    def event_logged(self, run_id: str, event: Event) -> None:
        pass

    def run_finished(self, run_id: str, terminal: Event, appended: int) -> None:
        pass
