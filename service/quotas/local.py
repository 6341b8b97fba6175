"""Per-key quotas: open streams, running queries, requests per minute, model tokens per day.

Each API key (its *owner*, see :func:`service.transports.edge.auth.owner_of`; with no keys configured
every request belongs to the one anonymous owner ``""``) has, apart from every other key:

- ``AGENT_QUOTA_STREAMS`` streams open at once: SSE responses (``POST /agent/stream``,
  ``GET /sessions/{id}/events``, ``GET /sessions/{id}/stream``, ``GET /mcp``) and WebSockets;
  a slot is taken before the response starts and freed when the handler ends.
- ``AGENT_QUOTA_RUNS`` queries running at once, however they were started; a slot is held from
  the run's start to its terminal event (the run manager consults this class as its
  :class:`~service.core.runs.RunGate`), so a client that has read ``done`` may start the next.
- ``AGENT_QUOTA_REQUESTS_PER_MINUTE`` HTTP requests, and WebSocket messages other than
  ``ping``, in any sliding minute (counted per second).
- ``AGENT_QUOTA_TOKENS_PER_DAY`` model tokens (input + output of every model turn) per UTC day:
  checked when a query starts, counted as each turn's usage is logged, so the query that crosses
  the limit runs to its end and the next one is refused until 00:00 UTC.

With no keys configured every caller is that one owner, so the per-key quotas apply then only
when set explicitly (:meth:`~service.config.Settings.quota`); ``AGENT_MAX_STREAMS`` (streams open
on the instance, whoever holds them: a 503) and ``AGENT_MAX_CONCURRENT_RUNS`` protect the process
instead. ``AGENT_QUOTA_SESSIONS`` (sessions held at once) is kept by the session store, which
knows every instance's sessions.

0 means unlimited. A refusal is :class:`~service.errors.QuotaExceeded`: over HTTP a 429 with a
``Retry-After`` header (whole seconds) and the body ``{"error", "code": "quota_exceeded",
"quota", "limit", "retry_after"}``; on a WebSocket an ``error`` frame with the same fields, and
the socket stays open. What needs no key (``/healthz``, the browser page and its static files) is
not counted, so a page shared by many users under keys is never refused; requests without a valid
key are refused (401) before they are counted; refused attempts do not count.

The counters of this class live in this process's memory. With keys configured and several
instances on one Redis (``AGENT_REDIS_URL``), :class:`~service.quotas.shared.SharedQuotas`
(the same interface) keeps them in Redis, so each key's quotas hold across every instance
together. The transports call the ``async`` methods (:meth:`Quotas.count_request`,
:meth:`Quotas.open_stream`, :meth:`Quotas.close_stream`, and the run gate's ``admit``); the
synchronous ones are this process's own counting. The clock (``clock``, epoch seconds) is
injectable, so tests move time instead of sleeping.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from service.config import Settings
from service.core.events import Usage
from service.errors import QuotaExceeded, StreamLimitReached

STREAMS = "streams"
RUNS = "runs"
REQUESTS_PER_MINUTE = "requests_per_minute"
TOKENS_PER_DAY = "tokens_per_day"

WINDOW_S = 60
DAY_S = 86_400
# A concurrency quota frees as soon as one of the owner's streams or queries ends.
CONCURRENCY_RETRY_S = 1


@dataclass
class _Owner:
    """One owner's counters."""

    streams: int = 0
    runs: int = 0
    # [second, requests in that second], oldest first, only seconds inside the sliding minute.
    seconds: deque[list[int]] = field(default_factory=deque)
    requests: int = 0
    day: int = -1  # the UTC day the tokens were counted on (days since the epoch)
    tokens: int = 0


class Quotas:
    """The per-owner quotas of one instance (0 = unlimited); also the run manager's gate."""

    def __init__(
        self,
        *,
        streams: int = 0,
        runs: int = 0,
        requests_per_minute: int = 0,
        tokens_per_day: int = 0,
        max_streams: int = 0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.max_streams = max_streams  # instance-wide, every owner together
        self.total_streams = 0
        self.streams = streams
        self.runs = runs
        self.requests_per_minute = requests_per_minute
        self.tokens_per_day = tokens_per_day
        self.clock = clock
        self._owners: dict[str, _Owner] = {}
        self._changed: asyncio.Event | None = None

    @classmethod
    def from_settings(cls, settings: Settings, clock: Callable[[], float] = time.time) -> Quotas:
        """The quotas ``AGENT_QUOTA_*`` ask for."""
        return cls(
            streams=settings.quota("streams"),
            runs=settings.quota("runs"),
            requests_per_minute=settings.quota("requests_per_minute"),
            tokens_per_day=settings.quota("tokens_per_day"),
            max_streams=settings.max_streams,
            clock=clock,
        )

    def _of(self, owner: str) -> _Owner:
        state = self._owners.get(owner)
        if state is None:
            state = self._owners[owner] = _Owner()
        return state

    def _freed(self) -> None:
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        """Return once ``predicate()`` holds; it is tried again each time a slot is freed."""
        while not predicate():
            if self._changed is None:
                self._changed = asyncio.Event()
            await self._changed.wait()

    # -- what an owner holds ---------------------------------------------------------------

    def open_streams(self, owner: str) -> int:
        """How many streams ``owner`` has open on this instance."""
        state = self._owners.get(owner)
        return state.streams if state else 0

    def running(self, owner: str) -> int:
        """How many queries of ``owner`` run on this instance."""
        state = self._owners.get(owner)
        return state.runs if state else 0

    def tokens_today(self, owner: str) -> int:
        """The model tokens ``owner`` used on this instance since 00:00 UTC."""
        state = self._owners.get(owner)
        if state is None or state.day != self._day(self.clock()):
            return 0
        return state.tokens

    # -- what the transports call ---------------------------------------------------------

    async def count_request(self, owner: str) -> None:
        """:meth:`check_request`, as the transports call it (shared quotas ask Redis)."""
        self.check_request(owner)

    async def open_stream(self, owner: str) -> None:
        """:meth:`acquire_stream`, as the transports call it (shared quotas ask Redis)."""
        self.acquire_stream(owner)

    async def close_stream(self, owner: str) -> None:
        """:meth:`release_stream`, as the transports call it: returns once the slot is free for
        the owner's next stream (on shared quotas, on every instance)."""
        self.release_stream(owner)

    # -- requests per minute ---------------------------------------------------------------

    def check_request(self, owner: str) -> None:
        """Count one request of ``owner``; :class:`QuotaExceeded` (not counted) when the last
        minute already holds ``requests_per_minute`` of them."""
        limit = self.requests_per_minute
        if not limit:
            return
        now = self.clock()
        state = self._of(owner)
        seconds = state.seconds
        second = math.floor(now)
        if seconds and second < seconds[-1][0]:
            second = seconds[-1][0]  # the wall clock stepped back: keep the window in order
        while seconds and seconds[0][0] <= second - WINDOW_S:
            state.requests -= seconds.popleft()[1]
        if state.requests >= limit:
            # Free again once enough of the oldest seconds have left the window.
            raise self._requests_refused(self._frees_at(seconds, state.requests - limit + 1), now)
        if seconds and seconds[-1][0] == second:
            seconds[-1][1] += 1
        else:
            seconds.append([second, 1])
        state.requests += 1

    def _requests_refused(self, frees_at: float, now: float) -> QuotaExceeded:
        limit = self.requests_per_minute
        retry_after = max(1, math.ceil(frees_at - now))
        return QuotaExceeded(
            f"too many requests for this API key: at most {limit} per minute; retry in {retry_after} s",
            quota=REQUESTS_PER_MINUTE,
            limit=limit,
            retry_after=retry_after,
        )

    @staticmethod
    def _frees_at(seconds: deque[list[int]], excess: int) -> int:
        """When the oldest seconds holding ``excess`` requests will have left the window."""
        for second, count in seconds:
            excess -= count
            if excess <= 0:
                return second + WINDOW_S
        return seconds[-1][0] + WINDOW_S

    # -- streams ---------------------------------------------------------------------------

    def acquire_stream(self, owner: str) -> None:
        """Take one of ``owner``'s stream slots; :class:`QuotaExceeded` when none is free, and
        :class:`StreamLimitReached` when the instance holds ``max_streams`` already."""
        self._check_instance_streams()
        if self.streams and self.open_streams(owner) >= self.streams:
            raise self._streams_refused()
        self._hold_stream(owner)

    def _check_instance_streams(self) -> None:
        if self.max_streams and self.total_streams >= self.max_streams:
            raise StreamLimitReached(f"{self.max_streams} streams are open on this instance")

    def _streams_refused(self) -> QuotaExceeded:
        return QuotaExceeded(
            f"too many open streams for this API key: at most {self.streams} at once; close one and retry",
            quota=STREAMS,
            limit=self.streams,
            retry_after=CONCURRENCY_RETRY_S,
        )

    def _hold_stream(self, owner: str) -> None:
        self._of(owner).streams += 1
        self.total_streams += 1

    def release_stream(self, owner: str) -> None:
        """Give back a slot :meth:`acquire_stream` took."""
        state = self._of(owner)
        state.streams = max(0, state.streams - 1)
        self.total_streams = max(0, self.total_streams - 1)
        self._freed()

    @contextmanager
    def stream(self, owner: str) -> Iterator[None]:
        """Hold one of ``owner``'s stream slots for the block."""
        self.acquire_stream(owner)
        try:
            yield
        finally:
            self.release_stream(owner)

    # -- runs (the run manager's gate) -----------------------------------------------------

    def admit(self, owner: str) -> None:
        """Let a query of ``owner`` start, or refuse it: too many running, or today's tokens
        spent."""
        state = self._of(owner)
        if self.runs and state.runs >= self.runs:
            raise self._runs_refused()
        used = self.tokens_today(owner)
        if self.tokens_per_day and used >= self.tokens_per_day:
            raise self._tokens_refused(used)
        state.runs += 1

    def _runs_refused(self) -> QuotaExceeded:
        return QuotaExceeded(
            f"too many queries running for this API key: at most {self.runs} at once; "
            "wait for one to finish and retry",
            quota=RUNS,
            limit=self.runs,
            retry_after=CONCURRENCY_RETRY_S,
        )

    def _tokens_refused(self, used: int) -> QuotaExceeded:
        limit, now = self.tokens_per_day, self.clock()
        retry_after = max(1, math.ceil((self._day(now) + 1) * DAY_S - now))
        return QuotaExceeded(
            f"this API key has used its {limit} model tokens for today ({used} used); "
            f"retry after 00:00 UTC, in {retry_after} s",
            quota=TOKENS_PER_DAY,
            limit=limit,
            retry_after=retry_after,
        )

    def used(self, owner: str, usage: Usage) -> None:
        """Count a model turn's tokens (input + output) against today's quota."""
        tokens = usage.input_tokens + usage.output_tokens
        if tokens <= 0:
            return
        state = self._of(owner)
        today = self._day(self.clock())
        if state.day != today:
            state.day, state.tokens = today, 0
        state.tokens += tokens

    def release(self, owner: str) -> None:
        """A query :meth:`admit` let start has ended."""
        state = self._of(owner)
        state.runs = max(0, state.runs - 1)
        self._freed()

    @staticmethod
    def _day(now: float) -> int:
        return math.floor(now / DAY_S)
