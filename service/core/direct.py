"""Write-through delivery: the subscriptions of a log that wait with a ``deliver``, fed from the
task that appends, and, when a log has many of them, fed a window of entries at a time.

One entry to one subscriber costs a chain of calls and a write to its socket. With a few hundred
subscribers that is cheap next to what a client needs; with ten thousand watching one answer, the
core spends its time on these per-entry, per-subscriber steps (measured: docs/benchmarks.md,
section Ten thousand viewers). So a log with many waiting subscribers holds its new entries for a
short window and then hands each subscriber all of them at once (:data:`DeliverMany`): one call
chain and one write per subscriber per window instead of per entry, and one encoding of the
window for every subscriber of a dialect (the ``shared`` dict each call is given). The window
grows with the number of subscribers (:class:`Coalescing`), so a small audience sees each token at
once and a large one sees text within a bounded delay while the core keeps up.

A subscription that is not caught up, or whose ``deliver`` declines, is woken and reads a batch as
before; nothing here changes what a subscriber receives, only when and in how many writes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from service.core.entry import LogEntry

if TYPE_CHECKING:
    from service.core.wakeup import IdleWait

logger = logging.getLogger(__name__)

Deliver = Callable[[LogEntry], bool]
"""Takes one new entry synchronously, on the appending task: True when it dealt with the entry
(wrote it to its client, say), False to have it, and all after it, come as a batch as usual.

A subscriber that has caught up waits for the next append; waking its task for every token (a
future, a callback, the task's whole stack resumed, then a new future to wait on) is work of its
own per token, comparable to what the task then does with the token (measured: docs/benchmarks.md,
section Write-through delivery and the per-token work (89119d6)). A transport whose client can
take a write at once gives the log a ``deliver`` and its task sleeps until something needs it: an
entry ``deliver`` declines (the end of a run, a socket with a backlog), a keep-alive, the close.
``deliver`` must not raise and must not block; whatever it declines the subscription yields next.
"""

DeliverMany = Callable[[list[LogEntry], dict[Any, Any]], bool]
"""Takes several new entries at once (a coalescing window's), as :data:`Deliver` takes one: True
when it dealt with all of them, False to have them come as a batch. ``shared`` is the same dict
for every subscriber given these entries in this window: what a dialect encodes of them once can
be kept there for the next subscriber of that dialect."""


@dataclass(frozen=True, slots=True)
class Coalescing:
    """How long a log holds its new entries before handing them to its waiting subscribers:
    ``per_subscriber_s`` times their number, up to ``max_window_s``; not at all while that is
    under ``min_window_s`` (a small audience gets each entry at once). ``max_window_s`` 0: never.
    """

    max_window_s: float = 0.1
    per_subscriber_s: float = 10e-6
    min_window_s: float = 0.002

    def window(self, subscribers: int) -> float:
        window = min(self.max_window_s, subscribers * self.per_subscriber_s)
        return window if window >= self.min_window_s else 0.0


NO_COALESCING = Coalescing(max_window_s=0.0)


class Direct:
    """A subscription waiting with a :data:`Deliver`: where it stands, and the future that wakes it."""

    __slots__ = ("_deliver", "_idle", "_many", "_waiter", "cursor")

    def __init__(self, deliver: Deliver, idle: IdleWait | None, many: DeliverMany | None = None) -> None:
        self._deliver = deliver
        self._many = many
        self._idle = idle
        self._waiter: asyncio.Future[bool] | None = None
        self.cursor = 0

    def wait_from(self, cursor: int) -> asyncio.Future[bool]:
        """Wait, caught up to ``cursor``: the future :meth:`wake` resolves."""
        self.cursor = cursor
        self._waiter = waiter = asyncio.get_running_loop().create_future()
        return waiter

    def take(self, entry: LogEntry) -> bool:
        """Offer ``entry`` to ``deliver``; True when it took it (the cursor moves past it)."""
        try:
            taken = self._deliver(entry)
        except Exception:  # a transport's bug must not fail the run that appends
            logger.exception("a subscriber's deliver failed; it reads the entry as a batch instead")
            return False
        if taken:
            self.cursor = entry.id
            if self._idle is not None:
                self._idle.touch()
        return taken

    def take_many(self, entries: list[LogEntry], shared: dict[Any, Any]) -> bool:
        """Offer ``entries`` (following the cursor) all at once; True when all were taken."""
        if self._many is None:
            return all(self.take(entry) for entry in entries)
        try:
            taken = self._many(entries, shared)
        except Exception:
            logger.exception("a subscriber's deliver failed; it reads the entries as a batch instead")
            return False
        if taken:
            self.cursor = entries[-1].id
            if self._idle is not None:
                self._idle.touch()
        return taken

    def wake(self) -> None:
        """Wake the subscription: it reads from its cursor as a batch."""
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(True)


class DirectSet:
    """A log's waiting :class:`Direct` subscriptions, and the entries held for them (see the
    module docstring). The log calls :meth:`offer` with each new entry, in id order."""

    __slots__ = ("_held", "_timer", "coalescing", "waiting", "windows")

    def __init__(self, coalescing: Coalescing = NO_COALESCING) -> None:
        self.coalescing = coalescing
        self.waiting: list[Direct] = []
        self._held: list[LogEntry] = []
        self._timer: asyncio.TimerHandle | None = None
        self.windows = 0  # how many windows were handed over (to see that they are used)

    def __bool__(self) -> bool:
        return bool(self.waiting) or bool(self._held)

    def add(self, direct: Direct) -> None:
        self.waiting.append(direct)

    def discard(self, direct: Direct) -> None:
        if direct in self.waiting:
            self.waiting.remove(direct)

    def offer(self, entry: LogEntry) -> None:
        """A new entry: handed over now, or held for the window under way (or one it starts)."""
        if self._held:
            if entry.id == self._held[-1].id + 1:
                self._held.append(entry)
                return
            self.flush()  # not contiguous (a shared log's reader skipped purged ids): start over
        window = self.coalescing.window(len(self.waiting))
        if window:
            self._held.append(entry)
            self._timer = asyncio.get_running_loop().call_later(window, self.flush)
            return
        declined: list[Direct] = []
        before = entry.id - 1
        for direct in self.waiting:
            if direct.cursor != before or not direct.take(entry):
                direct.wake()
                declined.append(direct)
        if declined:
            self._drop(declined)

    def flush(self) -> None:
        """Hand the held entries to every waiting subscription (each from its cursor)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        held, self._held = self._held, []
        if not held:
            return
        self.windows += 1
        first, last = held[0].id, held[-1].id
        shared: dict[Any, Any] = {}
        declined: list[Direct] = []
        for direct in self.waiting:
            cursor = direct.cursor
            if cursor >= last:
                continue  # it read the held entries as a batch meanwhile
            if cursor < first - 1 or not direct.take_many(held[cursor - first + 1 :], shared):
                direct.wake()
                declined.append(direct)
        if declined:
            self._drop(declined)

    def wake_all(self) -> None:
        """Wake every waiting subscription and let go of them (the log closed)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._held = []
        waiting, self.waiting = self.waiting, []
        for direct in waiting:
            direct.wake()

    def _drop(self, declined: list[Direct]) -> None:
        if len(declined) == len(self.waiting):
            self.waiting = []
        else:
            gone = set(map(id, declined))
            self.waiting = [direct for direct in self.waiting if id(direct) not in gone]
