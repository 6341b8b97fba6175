"""Bursts: the events of one upstream read handed on together, their writes made together.

A model's stream comes a socket read at a time. While the service keeps up, a read carries one
token; once it is busy, reads come less often and most carry several (measured at 500 paced runs
on one core: docs/benchmarks.md, section Bursts, request admission and the middle GC generation
(16612c5)). Every subscriber that takes entries as they are appended (write-through delivery,
:data:`~service.core.log.Deliver`) would then write once per token where one write per read
would do.

A provider that hands on several events from one read opens a :class:`Burst` around them. A
subscriber's writer that sees a burst open (:func:`current_burst`) keeps its bytes and asks to be
called when the burst ends; it then writes them in one go. The burst is the current task's alone
(a context variable), so what another task writes is never held by it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextvars import ContextVar

__all__ = ["Burst", "current_burst"]

_CURRENT: ContextVar[Burst | None] = ContextVar("burst", default=None)


class Burst:
    """Opened by the task handing on several events at once; :meth:`end` when they are handed on.

    Made current on creation for the creating task; :meth:`end` makes the one it replaced current
    again and calls every ``flush`` given to :meth:`on_end`, in order. A flush must not raise.
    """

    __slots__ = ("_flushes", "_outer", "_task")

    def __init__(self) -> None:
        self._flushes: list[Callable[[], None]] = []
        self._outer = _CURRENT.get()
        # A task started inside the burst copies the context, and the burst with it: the burst is
        # still this task's alone (see current_burst).
        self._task = asyncio.current_task()
        _CURRENT.set(self)

    def on_end(self, flush: Callable[[], None]) -> None:
        """Call ``flush`` when the burst ends."""
        self._flushes.append(flush)

    def end(self) -> None:
        """The events are handed on: write what was held."""
        _CURRENT.set(self._outer)
        flushes, self._flushes = self._flushes, []
        for flush in flushes:
            flush()


def current_burst() -> Burst | None:
    """The burst the current task has open, if any."""
    burst = _CURRENT.get()
    if burst is None or burst._task is not asyncio.current_task():
        return None
    return burst
