"""Per-key quotas that hold across every instance: the counters of :class:`Quotas` kept in Redis.

With keys configured and ``AGENT_REDIS_URL`` set, each key's streams, runs, requests per minute
and model tokens per day are counted once for all instances together (the sessions quota is
kept by the session store already). Each check is one round trip (a Lua script of
:mod:`service.store.quotas`); this class decides what its answer means and keeps, beside it,
this instance's own share (the in-process counters of :class:`Quotas`: what ``open_streams``,
``running`` and ``tokens_today`` report, and what the tests wait on).

- Streams and runs are *leases*: a slot is a member of a sorted set whose score is its deadline,
  renewed by this instance every third of ``AGENT_REDIS_LOCK_TTL_S`` while it holds the slot and
  removed when it is given back. An instance that dies stops renewing, so its slots come back
  within that lifetime. A slot is given back before anything else can see that it ended (a run's
  before its terminal event is logged, a stream's before its handler returns).
- Model tokens are counted as each turn's usage is logged, sent in the background in one round
  trip; the next admission of the same key on this instance carries whatever was not sent yet,
  so this instance never admits on a stale count of its own.
- Requests per minute are counted per second of the instance's clock (the instances' clocks are
  taken to agree, as NTP keeps them, to within a second or so).

Failing open: when Redis does not answer (within :data:`~service.store.quotas.QUOTA_DEADLINE_S`),
a WARNING is logged once and, for :data:`RETRY_S` after each failure, the checks do not wait on
Redis: each instance enforces the quotas on its own work, as without Redis. Nobody is refused
because Redis is down. The first answer after that logs that the quotas are shared again and
adds the slots taken meanwhile back to Redis, so they count from then on.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

from service.config import Settings
from service.core.events import Usage
from service.errors import StoreUnavailable
from service.quotas.local import RUNS, STREAMS, WINDOW_S, Quotas

log = logging.getLogger(__name__)

# After Redis failed to answer, checks use the instance's own counters for this long before
# asking Redis again (so a hung Redis costs one deadline per this long, not one per request).
RETRY_S = 1.0


class QuotaCounters(Protocol):
    """What the shared quotas need of the store (:class:`service.store.quotas.RedisQuotaCounters`).
    Every call raises :class:`~service.errors.StoreUnavailable` when the store cannot answer."""

    lease_ms: int

    @property
    def instance_id(self) -> str: ...

    async def take(self, kind: str, owner: str, limit: int, member: str) -> bool: ...

    async def admit(
        self, owner: str, *, runs: int, member: str, tokens: int, day: int, pending: int
    ) -> tuple[str, int]: ...

    async def release(self, kind: str, owner: str, member: str) -> None: ...

    async def add_tokens(self, counts: Iterable[tuple[str, int, int]]) -> None: ...

    async def renew(self, held: dict[tuple[str, str], list[str]], *, add_back: bool) -> None: ...

    async def request(self, owner: str, limit: int, second: int, window: int) -> int: ...


class SharedQuotas(Quotas):
    """:class:`Quotas` counted in Redis for every instance together (see the module docstring)."""

    def __init__(self, counters: QuotaCounters, **limits: Any) -> None:
        super().__init__(**limits)
        self.counters = counters
        # (kind, owner) -> the members of the slots this instance holds.
        self._held: dict[tuple[str, str], list[str]] = {}
        self._serial = itertools.count(1)
        self._pending: dict[tuple[str, int], int] = {}  # (owner, day) -> tokens not sent yet
        self._sending: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._retry_at = 0.0  # monotonic: Redis is not asked before then
        self.degraded = False  # Redis did not answer the last time it was asked
        self._renewer: asyncio.Task[None] | None = None

    @classmethod
    def shared_from_settings(
        cls, settings: Settings, counters: QuotaCounters, clock: Callable[[], float] = time.time
    ) -> SharedQuotas:
        """The quotas ``AGENT_QUOTA_*`` ask for, counted through ``counters``."""
        local = Quotas.from_settings(settings, clock)
        return cls(
            counters,
            streams=local.streams,
            runs=local.runs,
            requests_per_minute=local.requests_per_minute,
            tokens_per_day=local.tokens_per_day,
            max_streams=local.max_streams,
            clock=clock,
        )

    # -- life -------------------------------------------------------------------------------

    def start(self) -> None:
        """Start renewing this instance's leases (and sending the tokens Redis missed)."""
        self._renewer = asyncio.create_task(self._renew_forever(), name="quota-leases")

    async def stop(self) -> None:
        """Stop renewing; wait (briefly) for the releases and counts still on their way."""
        if self._renewer is not None:
            self._renewer.cancel()
            await asyncio.gather(self._renewer, return_exceptions=True)
            self._renewer = None
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=2)

    async def _renew_forever(self) -> None:
        interval = self.counters.lease_ms / 3000
        while True:
            await asyncio.sleep(interval)
            if self._pending:
                self._send_tokens()
            await self._renew(add_back=False)

    async def _renew(self, *, add_back: bool) -> None:
        held = {key: list(members) for key, members in self._held.items() if members}
        if not held or not self._may_ask():
            return
        try:
            await self.counters.renew(held, add_back=add_back)
        except StoreUnavailable as exc:
            self._failed(exc)
        else:
            self._answered()

    # -- Redis's health ---------------------------------------------------------------------

    def _may_ask(self) -> bool:
        return time.monotonic() >= self._retry_at

    def _failed(self, exc: StoreUnavailable) -> None:
        self._retry_at = time.monotonic() + RETRY_S
        if not self.degraded:
            self.degraded = True
            log.warning(
                "quotas: Redis is unavailable (%s); each instance enforces the per-key quotas on its "
                "own work until it is back",
                exc,
            )

    def _answered(self) -> None:
        if self.degraded:
            self.degraded = False
            log.warning("quotas: Redis answers again; the per-key quotas hold across instances again")
            # The slots taken meanwhile count from now on; the tokens counted meanwhile are sent.
            self._spawn(self._renew(add_back=True))
            self._send_tokens()

    def _spawn(self, work: Awaitable[Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- the slots this instance holds ------------------------------------------------------

    def _member(self) -> str:
        return f"{self.counters.instance_id}:{next(self._serial)}"

    def _keep(self, kind: str, owner: str, member: str) -> None:
        self._held.setdefault((kind, owner), []).append(member)

    def _drop(self, kind: str, owner: str) -> str | None:
        members = self._held.get((kind, owner))
        if not members:
            return None
        member = members.pop()
        if not members:
            del self._held[(kind, owner)]
        return member

    async def _give_back(self, kind: str, owner: str, member: str | None) -> None:
        try:
            if member is not None and self._may_ask():
                await self.counters.release(kind, owner, member)
                self._answered()
        except StoreUnavailable as exc:
            self._failed(exc)  # its lease runs out instead
        except Exception:  # a release never raises: at worst the lease runs out
            log.warning("quotas: could not give a %s slot back; its lease will run out", kind, exc_info=True)
        finally:
            # This instance's count drops once the slot is free everywhere.
            (Quotas.release_stream if kind == STREAMS else Quotas.release)(self, owner)

    # -- requests per minute ----------------------------------------------------------------

    async def count_request(self, owner: str) -> None:
        """Count one request of ``owner`` on every instance; refused as :meth:`check_request`."""
        limit = self.requests_per_minute
        if not limit:
            return
        if self._may_ask():
            now = self.clock()
            try:
                frees_at = await self.counters.request(owner, limit, math.floor(now), WINDOW_S)
            except StoreUnavailable as exc:
                self._failed(exc)
            else:
                self._answered()
                if frees_at:
                    raise self._requests_refused(frees_at, now)
                return
        self.check_request(owner)

    # -- streams ----------------------------------------------------------------------------

    async def open_stream(self, owner: str) -> None:
        """Take one of ``owner``'s stream slots on every instance (and one of this instance's)."""
        self._check_instance_streams()
        if not self.streams:
            self._hold_stream(owner)
            return
        member = self._member()
        if self._may_ask():
            try:
                taken = await self.counters.take(STREAMS, owner, self.streams, member)
            except StoreUnavailable as exc:
                self._failed(exc)
            else:
                self._answered()
                if not taken:
                    raise self._streams_refused()
                self._keep(STREAMS, owner, member)
                self._hold_stream(owner)
                return
        self.acquire_stream(owner)  # this instance's own count, while Redis is away
        self._keep(STREAMS, owner, member)

    def release_stream(self, owner: str) -> asyncio.Task[None]:  # type: ignore[override]
        """Give a stream slot back (in the background: await the task to know it is free)."""
        return self._spawn(self._give_back(STREAMS, owner, self._drop(STREAMS, owner)))

    async def close_stream(self, owner: str) -> None:
        """Give a stream slot back and return once it is free on every instance."""
        await asyncio.shield(self.release_stream(owner))

    # -- runs (the run manager's gate) ------------------------------------------------------

    def admit(self, owner: str) -> Awaitable[None]:  # type: ignore[override]
        """Let a query of ``owner`` start, or refuse it, counting every instance's (awaitable)."""
        return self._admit(owner)

    async def _admit(self, owner: str) -> None:
        if not self.runs and not self.tokens_per_day:
            self._of(owner).runs += 1
            return
        member = self._member()
        if self._may_ask():
            if self._sending is not None:
                await asyncio.wait([self._sending])  # what this instance counted is sent first
            day = self._day(self.clock())
            pending = self._pending.pop((owner, day), 0)
            try:
                verdict, used = await self.counters.admit(
                    owner, runs=self.runs, member=member, tokens=self.tokens_per_day, day=day, pending=pending
                )
            except StoreUnavailable as exc:
                self._add_pending(owner, day, pending)
                self._failed(exc)
            else:
                self._answered()
                if verdict == "runs":
                    raise self._runs_refused()
                if verdict == "tokens":
                    raise self._tokens_refused(used)
                self._keep(RUNS, owner, member)
                self._of(owner).runs += 1
                return
        Quotas.admit(self, owner)  # this instance's own count, while Redis is away
        self._keep(RUNS, owner, member)

    def used(self, owner: str, usage: Usage) -> None:
        """Count a model turn's tokens here at once, and on Redis in the background."""
        super().used(owner, usage)
        tokens = usage.input_tokens + usage.output_tokens
        if tokens > 0 and self.tokens_per_day:
            self._add_pending(owner, self._day(self.clock()), tokens)
            self._send_tokens()

    def release(self, owner: str) -> asyncio.Task[None]:  # type: ignore[override]
        """A query ended: its slot is given back; the task completes once it is free everywhere."""
        return self._spawn(self._give_back(RUNS, owner, self._drop(RUNS, owner)))

    def _add_pending(self, owner: str, day: int, tokens: int) -> None:
        if tokens:
            self._pending[(owner, day)] = self._pending.get((owner, day), 0) + tokens

    def _send_tokens(self) -> None:
        if self._sending is None and self._pending:
            self._sending = self._spawn(self._send_pending())

    async def _send_pending(self) -> None:
        try:
            while self._pending and self._may_ask():
                counts, self._pending = self._pending, {}
                try:
                    await self.counters.add_tokens((owner, day, n) for (owner, day), n in counts.items())
                except StoreUnavailable as exc:
                    for (owner, day), n in counts.items():
                        self._add_pending(owner, day, n)
                    self._failed(exc)
                    return
                self._answered()
        finally:
            self._sending = None
