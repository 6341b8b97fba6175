"""Sessions, event logs and run claims on Redis, shared by every instance of the service.

- Each session's event log is a Redis Stream whose entry ids are the events' integer ids
  (``<n>-0``), so ids are exact and the same on every instance; appends go through one Lua
  script that also keeps the log under its byte bound (see :mod:`service.store.scripts`).
- Each instance runs **one** reader (:class:`Fanout`): a blocking ``XREAD`` over the logs its
  clients follow, decoding each new entry once and waking the local subscribers, which read
  from a shared in-memory tail (or from Redis when they are further behind).
- A run claims its session with a key that expires (``AGENT_REDIS_LOCK_TTL_S``) and is renewed
  while the run lives; every append of the run checks the claim (a fence). When an instance
  dies, its claims expire; the instances following that session (or the next one to load it)
  end the query with an ``error`` event coded ``interrupted``.
- A cancel for a query running elsewhere is published to the owning instance's channel.
- When Redis cannot be reached, or does not answer within ``AGENT_REDIS_DEADLINE_S`` (a hung
  Redis), calls raise :class:`~service.errors.StoreUnavailable` (a 503 for new work) and open
  subscriptions end with it; the clients resume with their last id. A running query's writes are
  retried while its claim may still hold, so it rides out an outage shorter than the claim's
  lifetime; a session that Redis lost (a restart without persistence) ends its query with
  :class:`~service.errors.RunLost`.
"""

from __future__ import annotations

from service.store.backend import RedisBackend
from service.store.connection import INTERRUPTED_MESSAGE, REDIS_CONNECTIONS, RedisConnections
from service.store.log import RedisEventLog
from service.store.sessions import RedisSessionStore, make_store

__all__ = [
    "INTERRUPTED_MESSAGE",
    "REDIS_CONNECTIONS",
    "RedisBackend",
    "RedisConnections",
    "RedisEventLog",
    "RedisSessionStore",
    "make_store",
]
