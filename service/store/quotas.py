"""Per-key quota counters on Redis, shared by every instance: each check is one script, one round
trip (see :class:`service.quotas.shared.SharedQuotas`, which decides what to do with
the answers and falls back to the instance's own counters while Redis is away).

Keys of an owner ``O`` (``P`` is ``AGENT_REDIS_PREFIX``):

- ``P:q:O:streams``, ``P:q:O:runs``  sorted sets of the slots held: member ``<instance>:<n>``,
  score the lease's deadline (epoch ms, Redis's own clock). The holder renews its leases every
  third of their lifetime (``AGENT_REDIS_LOCK_TTL_S``, as run claims) and removes them when done;
  the slots of an instance that died run out with their leases, and every take first drops the
  expired ones.
- ``P:q:O:rpm``  hash: second (epoch, the instance's clock) -> requests counted in it; the
  seconds that left the sliding minute are deleted by the next check.
- ``P:q:O:tok:<day>``  string: the model tokens counted on that UTC day (days since the epoch),
  kept two days.

Every call raises :class:`~service.errors.StoreUnavailable` when Redis cannot answer within the
quota deadline (short: a request waits on it).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable
from typing import Any

from redis.exceptions import RedisError

from service.store.connection import RedisConnections, store_call, unavailable

# A request waits at most this long on a quota check before it goes ahead without it.
QUOTA_DEADLINE_S = 0.5
DAY_KEPT_MS = 2 * 86_400_000

_NOW_MS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# take(slots; limit, member, lease_ms) -> 1 taken, 0 refused (limit slots held already).
TAKE = (
    _NOW_MS
    + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local limit = tonumber(ARGV[1])
if limit > 0 and redis.call('ZCARD', KEYS[1]) >= limit then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""
)

# admit(slots, tokens; runs limit, member, lease_ms, tokens limit, pending tokens, day ttl) ->
# {verdict, tokens used today}: the tokens this instance counted but had not sent yet are added
# first; then 'runs' (no slot free), 'tokens' (the day's tokens spent) or 'ok' (a slot taken).
ADMIT = (
    _NOW_MS
    + """
local used
local pending = tonumber(ARGV[5])
if pending > 0 then
  used = redis.call('INCRBY', KEYS[2], pending)
  redis.call('PEXPIRE', KEYS[2], ARGV[6])
else
  used = tonumber(redis.call('GET', KEYS[2]) or '0')
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local limit = tonumber(ARGV[1])
if limit > 0 and redis.call('ZCARD', KEYS[1]) >= limit then return {'runs', used} end
local tokens = tonumber(ARGV[4])
if tokens > 0 and used >= tokens then return {'tokens', used} end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {'ok', used}
"""
)

# renew(slots; lease_ms, only_existing, member...) -> how many were renewed. After an outage the
# holder adds them back (only_existing = 0): slots taken while Redis was away count from then on.
RENEW = (
    _NOW_MS
    + """
local deadline = now + tonumber(ARGV[1])
local renewed = 0
for i = 3, #ARGV do
  if ARGV[2] == '1' then
    renewed = renewed + redis.call('ZADD', KEYS[1], 'XX', 'CH', deadline, ARGV[i])
  else
    redis.call('ZADD', KEYS[1], deadline, ARGV[i])
    renewed = renewed + 1
  end
end
if renewed > 0 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return renewed
"""
)

# request(seconds; limit, second, window) -> 0 counted, or (refused) the second at which enough
# of the oldest requests will have left the window for one more.
REQUEST = """
local limit, second, window = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local s = tonumber(all[i])
  if s > second then second = s end  -- a clock behind the others: keep the window in order
end
local kept, stale, total = {}, {}, 0
for i = 1, #all, 2 do
  local s, c = tonumber(all[i]), tonumber(all[i + 1])
  if s <= second - window then
    stale[#stale + 1] = all[i]
  else
    total = total + c
    kept[#kept + 1] = {s, c}
  end
end
if #stale > 0 then redis.call('HDEL', KEYS[1], unpack(stale)) end
if total >= limit then
  table.sort(kept, function(a, b) return a[1] < b[1] end)
  local excess = total - limit + 1
  for _, entry in ipairs(kept) do
    excess = excess - entry[2]
    if excess <= 0 then return entry[1] + window end
  end
  return kept[#kept][1] + window
end
redis.call('HINCRBY', KEYS[1], second, 1)
redis.call('EXPIRE', KEYS[1], window * 2)
return 0
"""


class RedisQuotaCounters:
    """The shared counters of every owner, on the store's Redis."""

    def __init__(self, connections: RedisConnections, deadline_s: float = QUOTA_DEADLINE_S) -> None:
        self.connections = connections
        self.lease_ms = connections.lock_ttl_ms
        self.deadline_s = min(deadline_s, connections.deadline_s)
        redis = connections.redis
        self._scripts = {
            name: redis.register_script(source)
            for name, source in (("TAKE", TAKE), ("ADMIT", ADMIT), ("RENEW", RENEW), ("REQUEST", REQUEST))
        }

    @property
    def instance_id(self) -> str:
        """Names this instance's slots (``<instance>:<n>``)."""
        return self.connections.instance_id

    def _key(self, owner: str, name: str) -> str:
        return f"{self.connections.prefix}:q:{owner}:{name}"

    @contextlib.asynccontextmanager
    async def _call(self) -> AsyncIterator[None]:
        try:
            async with store_call(self.deadline_s):
                yield
        except RedisError as exc:  # a script error, a full Redis: the same to a quota
            raise unavailable(exc) from exc

    async def take(self, kind: str, owner: str, limit: int, member: str) -> bool:
        """Take a slot of ``kind`` (``streams``, ``runs``) for ``owner`` unless ``limit`` are
        held (0: no limit, only counted)."""
        async with self._call():
            taken = await self._scripts["TAKE"](
                keys=[self._key(owner, kind)], args=[limit, member, self.lease_ms]
            )
        return bool(taken)

    async def admit(
        self, owner: str, *, runs: int, member: str, tokens: int, day: int, pending: int
    ) -> tuple[str, int]:
        """Count ``pending`` tokens of today, then take a run slot unless ``runs`` are held or the
        day's ``tokens`` are spent: ``("ok" | "runs" | "tokens", tokens used today)``."""
        async with self._call():
            verdict, used = await self._scripts["ADMIT"](
                keys=[self._key(owner, "runs"), self._key(owner, f"tok:{day}")],
                args=[runs, member, self.lease_ms, tokens, pending, DAY_KEPT_MS],
            )
        return str(verdict), int(used)

    async def release(self, kind: str, owner: str, member: str) -> None:
        """Give a slot back."""
        async with self._call():
            await self.connections.redis.zrem(self._key(owner, kind), member)

    async def add_tokens(self, counts: Iterable[tuple[str, int, int]]) -> None:
        """Count model tokens: ``(owner, day, tokens)`` each, in one round trip."""
        async with self._call(), self.connections.redis.pipeline(transaction=False) as pipe:
            for owner, day, tokens in counts:
                key = self._key(owner, f"tok:{day}")
                pipe.incrby(key, tokens)
                pipe.pexpire(key, DAY_KEPT_MS)
            await pipe.execute()

    async def renew(self, held: dict[tuple[str, str], list[str]], *, add_back: bool) -> None:
        """Renew the leases of the slots this instance holds, ``(kind, owner) -> members``, in one
        round trip; with ``add_back``, slots Redis does not know (taken while it was away, or
        lost with its data) are added."""
        if not held:
            return
        async with self._call(), self.connections.redis.pipeline(transaction=False) as pipe:
            for (kind, owner), members in held.items():
                await self._scripts["RENEW"](
                    keys=[self._key(owner, kind)],
                    args=[self.lease_ms, "0" if add_back else "1", *members],
                    client=pipe,
                )
            await pipe.execute()

    async def request(self, owner: str, limit: int, second: int, window: int) -> int:
        """Count a request in ``second`` unless the window already holds ``limit``: 0, or the
        second at which one more would fit."""
        async with self._call():
            return int(
                await self._scripts["REQUEST"](keys=[self._key(owner, "rpm")], args=[limit, second, window])
            )

    async def held(self, kind: str, owner: str) -> int:
        """How many live slots of ``kind`` ``owner`` holds on every instance together."""
        async with self._call():
            now_ms = int(await self._now_ms())
            return int(await self.connections.redis.zcount(self._key(owner, kind), f"({now_ms}", "+inf"))

    async def _now_ms(self) -> Any:
        seconds, micros = await self.connections.redis.time()
        return seconds * 1000 + micros // 1000
