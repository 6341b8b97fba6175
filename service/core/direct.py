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

    max_window_s: float = 0.2
    per_subscriber_s: float = 20e-6
    min_window_s: float = 0.002

    def window(self, subscribers: int) -> float:
        window = min(self.max_window_s, subscribers * self.per_subscriber_s)
        return window if window >= self.min_window_s else 0.0


NO_COALESCING = Coalescing(max_window_s=0.0)

# The most subscriptions handed a window's entries in one go (see DirectSet).
GROUP_SIZE = 500


class Direct:
    """A subscription waiting with a :data:`Deliver`: where it stands, and the future that wakes it."""

    __slots__ = ("_deliver", "_idle", "_many", "_waiter", "cursor", "group")

    def __init__(self, deliver: Deliver, idle: IdleWait | None, many: DeliverMany | None = None) -> None:
        self._deliver = deliver
        self._many = many
        self._idle = idle
        self._waiter: asyncio.Future[bool] | None = None
        self.cursor = 0
        self.group = 0  # its group in the DirectSet it waits in

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
    module docstring). The log calls :meth:`offer` with each new entry, in id order.

    The subscriptions are kept in groups of at most :data:`GROUP_SIZE`, and a window's groups are
    handed the held entries one after the other, ``window / groups`` apart, each group once per
    window. Handing them to everyone at once would hold the event loop for as long as ten
    thousand writes take (on loopback about 12 µs each, the receiver's TCP work included): the
    model's next tokens would wait that long to be read, and the last subscribers of the round
    would get theirs that much later. In turns, the loop is held a group's writes at a time, and
    each subscriber waits at most a window.
    """

    __slots__ = ("_due", "_flushed", "_held", "_timer", "_turn", "coalescing", "groups", "windows")

    def __init__(self, coalescing: Coalescing = NO_COALESCING) -> None:
        self.coalescing = coalescing
        self.groups: list[list[Direct]] = [[]]
        self._flushed: list[int] = [0]  # per group: the last id it was handed in a window
        self._held: list[LogEntry] = []  # what some group has not been handed yet, in id order
        self._timer: asyncio.TimerHandle | None = None
        self._turn = 0  # the group the next tick hands the held entries to
        self._due = 0.0  # when that tick is due (the loop's clock)
        self.windows = 0  # how many groups were handed a window's entries (to see that it works)

    def __bool__(self) -> bool:
        return bool(self._held) or any(self.groups)

    def __len__(self) -> int:
        return sum(map(len, self.groups))

    def add(self, direct: Direct) -> None:
        group = min(range(len(self.groups)), key=lambda index: len(self.groups[index]))
        if len(self.groups[group]) >= GROUP_SIZE:
            self.groups.append([])
            self._flushed.append(self._held[-1].id if self._held else 0)
            group = len(self.groups) - 1
        direct.group = group
        self.groups[group].append(direct)

    def discard(self, direct: Direct) -> None:
        group = self.groups[direct.group] if direct.group < len(self.groups) else []
        if direct in group:
            group.remove(direct)

    def offer(self, entry: LogEntry) -> None:
        """A new entry: handed over now, or held until each group's turn (ticks it starts)."""
        held = self._held
        if held:
            if entry.id == held[-1].id + 1:
                held.append(entry)
                return
            self.flush()  # not contiguous (a shared log's reader skipped purged ids): start over
            held = self._held
        window = self.coalescing.window(len(self))
        if window:
            held.append(entry)
            if self._timer is None:
                loop = asyncio.get_running_loop()
                self._turn = 0
                self._due = loop.time() + window / len(self.groups)
                self._timer = loop.call_at(self._due, self._tick)
            return
        before = entry.id - 1
        for group in self.groups:
            declined = [d for d in group if d.cursor != before or not d.take(entry)]
            self._drop(group, declined)

    def _tick(self) -> None:
        """One group's turn: hand it what is held; then the next group's turn, a slice of the
        window later, while anything is held."""
        self._timer = None
        groups = self.groups
        turn = self._turn % len(groups)
        self._hand(turn)
        self._turn = turn + 1
        # What every group was handed is held no more.
        oldest = min(self._flushed)
        held = self._held
        if held and held[-1].id <= oldest:
            self._held = []
        elif held and held[0].id <= oldest:
            del held[: oldest - held[0].id + 1]
        if self._held:
            # Due a slice of the window after the last one was due, not after it ended: the
            # writes of a turn take time, and each group's turn must still come once a window.
            window = self.coalescing.window(len(self)) or self.coalescing.min_window_s
            self._due += window / len(groups)
            self._timer = asyncio.get_running_loop().call_at(self._due, self._tick)

    def _hand(self, turn: int) -> None:
        held = self._held
        if not held:
            return
        first, last = held[0].id, held[-1].id
        self._flushed[turn] = last
        group = self.groups[turn]
        if not group:
            return
        self.windows += 1
        shared: dict[Any, Any] = {}
        declined: list[Direct] = []
        for direct in group:
            cursor = direct.cursor
            if cursor >= last:
                continue  # it read the held entries as a batch meanwhile
            part = held if cursor == first - 1 else held[cursor - first + 1 :]
            if cursor < first - 1 or not direct.take_many(part, shared):
                direct.wake()
                declined.append(direct)
        self._drop(group, declined)

    def flush(self) -> None:
        """Hand everything held to every group now."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for turn in range(len(self.groups)):
            self._hand(turn)
        self._held = []

    def wake_all(self) -> None:
        """Wake every waiting subscription and let go of them (the log closed)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._held = []
        groups, self.groups, self._flushed = self.groups, [[]], [0]
        for group in groups:
            for direct in group:
                direct.wake()

    @staticmethod
    def _drop(group: list[Direct], declined: list[Direct]) -> None:
        """Wake the ``declined`` of ``group`` (they read a batch next) and let go of them."""
        if not declined:
            return
        for direct in declined:
            direct.wake()
        if len(declined) == len(group):
            group.clear()
        else:
            gone = set(map(id, declined))
            group[:] = [direct for direct in group if id(direct) not in gone]
