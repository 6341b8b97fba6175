"""Admission of new upstream requests, a few per turn of the event loop.

Building and sending a model request is the costliest single step of a run (for Bedrock,
botocore's serialising, the endpoint rules, SigV4, the user agent), and requests come in
bursts: a page of a hundred users, a load balancer that sends a reconnected client's queries
together. asyncio runs every ready task of one loop turn before it looks at its timers and
sockets again, so two hundred requests arriving together would make one long turn, during which
no token of any stream already running goes out (measured: docs/benchmarks.md, sections
Write-through delivery and the per-token work (89119d6), and Bedrock intake against its baseline
and a bare relay).

:class:`Admission` lets at most ``per_turn`` requests start in one turn of the loop; the rest wait,
first come first served, for the following turns. Between two turns the loop writes the tokens
that arrived meanwhile, so the streams in flight keep their pace while a burst is admitted, and
the burst itself is admitted in the same total time.
"""

from __future__ import annotations

import asyncio
import collections

# Upstream requests per turn. Each costs the loop aiobotocore's work and a new connection's, so
# the turns that admit a burst set the loop lag's p99 under paced load; two per turn keep those
# turns shorter than four do, for the same CPU per token. One per turn does not delay a burst's
# last request either, but its lower loop lag does not hold up with the order of the benchmark's
# targets swapped, and first tokens come later at 500 runs (measured: docs/benchmarks.md,
# sections Counters and JSON off the per-token path (6034038), "Two upstream requests per loop
# turn", and A burst's connections, the time to upstream, a noisy day (724aefa), "Fewer upstream
# requests admitted per turn").
UPSTREAM_PER_TURN = 2


class Admission:
    """A gate that opens for ``per_turn`` callers per turn of the running event loop."""

    def __init__(self, per_turn: int = UPSTREAM_PER_TURN) -> None:
        if per_turn < 1:
            raise ValueError("per_turn must be at least 1")
        self.per_turn = per_turn
        self._admitted = 0  # callers let through since the last turn began
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()
        self._turn_scheduled = False

    @property
    def waiting(self) -> int:
        """How many callers wait for a later turn."""
        return len(self._waiting)

    async def enter(self) -> None:
        """Return now if this turn has room and nobody waits, else at a later turn (FIFO)."""
        if not self._waiting and self._admitted < self.per_turn:
            self._admitted += 1
            self._next_turn()
            return
        future = asyncio.get_running_loop().create_future()
        self._waiting.append(future)
        self._next_turn()
        try:
            await future
        except asyncio.CancelledError:
            if not future.done():
                self._waiting.remove(future)
            raise

    def _next_turn(self) -> None:
        if not self._turn_scheduled:
            self._turn_scheduled = True
            asyncio.get_running_loop().call_soon(self._turn)

    def _turn(self) -> None:
        """A new turn of the loop: admit the next few in line."""
        self._turn_scheduled = False
        self._admitted = 0
        while self._waiting and self._admitted < self.per_turn:
            future = self._waiting.popleft()
            if not future.done():
                future.set_result(None)
                self._admitted += 1
        if self._waiting or self._admitted:
            self._next_turn()
