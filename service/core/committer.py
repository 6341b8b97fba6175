"""A run's appends to a log on a shared store, sent in groups: one round trip for a burst of tokens.

On a log whose every append waits on a round trip (``EventLog.round_trips``: Redis), a run that
awaited each append before taking the agent's next event would cost a round trip per event, and
its subscribers would get a burst one event at a time. The :class:`Committer` lets the run go on
taking events while one append is on its way, and sends what came meanwhile in the next one
(``append_many``: one script call, stored together, retried as one).

A *burst* is what the agent yields at once (in one step of the run's task, without waiting: the
tokens of one read of the model's stream). A burst is stored whole, so its subscribers get it in
one batch, as from the memory log. Bursts that queued up one by one while an append was slow (a
paced stream while the store stalled) go together only up to :attr:`Committer.MAX_JOINED` events,
so that such a backlog reaches the readers who follow live in pieces, as the stream came.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from service.core.events import Event
from service.core.log import EventLog


class Committer:
    """Appends a run's events in order, a group per call; ``logged`` hears each group once stored.

    ``add`` never waits; :meth:`drain` waits until everything added is stored, and raises what
    made an append fail (which also drops what was still queued: the run is over then). So what
    the run reports (its progress, the metrics, the usage) never runs ahead of the log.
    """

    # Events queued before the run waits for them to be stored: a store that falls behind slows
    # the run rather than letting its queue grow, and no call gets longer than this (Redis runs
    # one script at a time).
    MAX_QUEUED = 256
    # Separate bursts that one call may join.
    MAX_JOINED = 16

    def __init__(self, log: EventLog, fence: str | None, logged: Callable[[list[Event]], None]) -> None:
        self._log = log
        self._fence = fence
        self._logged = logged
        self._bursts: list[list[Event]] = []
        self._queued = 0
        self._open = False  # the last burst still takes events (this step of the run goes on)
        self._sending: asyncio.Task[None] | None = None
        self._failed: BaseException | None = None

    def add(self, event: Event) -> bool:
        """Queue ``event``; True when the caller should :meth:`drain` before adding more."""
        if self._failed is not None:
            raise self._failed
        if self._open:
            self._bursts[-1].append(event)
        else:
            self._bursts.append([event])
            self._open = True
            # Runs once the run's task waits: the burst ends there.
            asyncio.get_running_loop().call_soon(self._close_burst)
        self._queued += 1
        if self._sending is None:
            self._sending = asyncio.create_task(self._send(), name="run-appends")
        return self._queued >= self.MAX_QUEUED

    def _close_burst(self) -> None:
        self._open = False

    def _next_group(self) -> list[Event]:
        bursts = self._bursts
        group = bursts.pop(0)
        while bursts and len(group) + len(bursts[0]) <= self.MAX_JOINED:
            group += bursts.pop(0)
        self._queued -= len(group)
        return group

    async def _send(self) -> None:
        try:
            while self._bursts:
                group = self._next_group()
                await self._log.append_many(group, fence=self._fence)
                self._logged(group)
        except Exception as exc:
            self._failed = exc
            self._bursts, self._queued = [], 0
        finally:
            self._sending = None

    async def drain(self) -> None:
        """Return once everything added is stored; raise what made an append fail."""
        while self._sending is not None:
            # Shielded: a cancel of the run must not cut its appends short (the run then logs
            # how it stopped after them).
            await asyncio.shield(self._sending)
        if self._failed is not None:
            raise self._failed
