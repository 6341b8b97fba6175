"""A run's appends to a log on a shared store, sent in groups: one round trip for a burst of tokens.

On a log whose every append waits on a round trip (``EventLog.round_trips``: Redis), a run that
awaited each append before taking the agent's next event would cost a round trip per event, and
its subscribers would get a burst one event at a time. The :class:`Committer` lets the run go on
taking events while one append is on its way, and sends whatever came meanwhile in the next one
(``append_many``: one script call, stored together, retried as one).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from service.core.events import Event
from service.core.log import EventLog


class Committer:
    """Appends a run's events in order, each group in one call; ``logged`` hears each group once stored.

    ``add`` never waits; :meth:`drain` waits until everything added is stored, and raises what
    made an append fail (which also drops what was still queued: the run is over then). So what
    the run reports (its progress, the metrics, the usage) never runs ahead of the log.
    """

    # Events queued before the run waits for them to be stored: a store that falls behind slows
    # the run rather than letting its queue grow, each call stays short (Redis runs one script
    # at a time), and a backlog (after a stall of the store) reaches the log, and the readers
    # following it live, in pieces of this size, as a paced stream would.
    MAX_QUEUED = 16

    def __init__(self, log: EventLog, fence: str | None, logged: Callable[[list[Event]], None]) -> None:
        self._log = log
        self._fence = fence
        self._logged = logged
        self._queued: list[Event] = []
        self._sending: asyncio.Task[None] | None = None
        self._failed: BaseException | None = None

    def add(self, event: Event) -> bool:
        """Queue ``event``; True when the caller should :meth:`drain` before adding more."""
        if self._failed is not None:
            raise self._failed
        self._queued.append(event)
        if self._sending is None:
            self._sending = asyncio.create_task(self._send(), name="run-appends")
        return len(self._queued) >= self.MAX_QUEUED

    async def _send(self) -> None:
        try:
            while self._queued:
                group, self._queued = self._queued, []
                await self._log.append_many(group, fence=self._fence)
                self._logged(group)
        except Exception as exc:
            self._failed = exc
            self._queued = []
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
