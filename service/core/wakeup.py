"""How a log's subscribers wait for its next append, and for the keep-alive when nothing comes.

Every append wakes every subscriber of its log, so this is per token and per subscriber: a
:class:`Wakeup` hands each waiting task a bare future and resolves them all at once, where an
``asyncio.Event`` replaced on each append would cost an object per append; an :class:`IdleWait`
keeps one timer per subscription, moved only when it fires early, where an ``asyncio.timeout``
around each wait would arm and cancel a timer per token.
"""

from __future__ import annotations

import asyncio


class Wakeup:
    """Wakes, on :meth:`notify`, every task that took a :meth:`waiter` before it."""

    __slots__ = ("_waiters",)

    def __init__(self) -> None:
        self._waiters: list[asyncio.Future[bool]] = []

    def waiter(self) -> asyncio.Future[bool]:
        """A future the next :meth:`notify` resolves (take it before looking for news, so that
        news arriving after the look still wakes the task)."""
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        return future

    def notify(self) -> None:
        """Wake every task waiting now."""
        if not self._waiters:  # per token, and mostly no one is waiting: no list made for nothing
            return
        waiters, self._waiters = self._waiters, []
        for future in waiters:
            if not future.done():
                future.set_result(True)


class IdleWait:
    """A subscription's waits, each ending after ``timeout`` seconds without news (the keep-alive),
    counted from when the subscription started waiting after its last news, as a timeout around
    each wait would count it."""

    __slots__ = ("_deadline", "_handle", "_loop", "_moved", "_timeout", "_waiter")

    def __init__(self, timeout: float) -> None:
        self._timeout = timeout
        self._loop = asyncio.get_running_loop()
        self._deadline = 0.0
        self._moved = True  # the next wait starts a fresh idle period
        self._handle: asyncio.TimerHandle | None = None
        self._waiter: asyncio.Future[bool] | None = None

    def news(self) -> None:
        """Something came: the next wait starts a fresh idle period."""
        self._moved = True

    def touch(self) -> None:
        """Something came during the wait (handed over without waking the waiter): the idle
        period starts again now."""
        self._deadline = self._loop.time() + self._timeout

    async def wait(self, waiter: asyncio.Future[bool]) -> bool:
        """Wait on ``waiter``: True when it was resolved, False when the idle period ran out."""
        if self._moved:
            self._moved = False
            self._deadline = self._loop.time() + self._timeout
        if self._handle is None:
            self._handle = self._loop.call_at(self._deadline, self._fire)
        self._waiter = waiter
        try:
            return await waiter
        finally:
            self._waiter = None

    def _fire(self) -> None:
        self._handle = None
        if self._loop.time() < self._deadline:  # news came meanwhile: wait out the new period
            self._handle = self._loop.call_at(self._deadline, self._fire)
            return
        self._moved = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(False)

    def close(self) -> None:
        """Drop the timer (the subscription ended)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
