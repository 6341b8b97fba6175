"""A clock that tests move by hand, for timeouts without sleeping (see service/core/approvals.py)."""

from __future__ import annotations

import asyncio
import time


class ManualClock:
    """Epoch seconds that only :meth:`advance` moves; ``sleep_until`` returns once it is moved past."""

    def __init__(self, now: float | None = None) -> None:
        self._now = time.time() if now is None else now
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []
        self._changed = asyncio.Event()

    def now(self) -> float:
        """The clock's time."""
        return self._now

    async def sleep_until(self, when: float) -> None:
        """Wait until the clock reads ``when`` or later."""
        if when <= self._now:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (when, waiter)
        self._sleepers.append(entry)
        self._wake()
        try:
            await waiter
        finally:
            self._sleepers.remove(entry)
            self._wake()

    def advance(self, seconds: float) -> None:
        """Move the clock on; sleepers whose time has come return."""
        self._now += seconds
        for when, waiter in self._sleepers:
            if when <= self._now and not waiter.done():
                waiter.set_result(None)

    @property
    def sleepers(self) -> int:
        """How many are sleeping on the clock now."""
        return len(self._sleepers)

    async def wait_sleepers(self, count: int) -> None:
        """Return once ``count`` sleepers wait on the clock."""
        while len(self._sleepers) != count:
            await self._changed.wait()

    def _wake(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
