"""Redis connections for the store: the clients, scripts and key names one instance shares with all
its sessions, and the deadline every call keeps (see :mod:`service.store.redis`)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import secrets
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import hiredis
import redis.asyncio as aioredis
from redis.asyncio.connection import Connection
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from service.core.events import EVENT_ADAPTER, Event, RunError, StatusChange
from service.core.log import LogEntry
from service.core.sessions import (
    IDLE,
)
from service.errors import StoreUnavailable
from service.store import scripts

log = logging.getLogger(__name__)

T = TypeVar("T")

INTERRUPTED_MESSAGE = "the query was interrupted: the instance running it stopped"
_INTERRUPTED_STATUS = StatusChange(status=IDLE).model_dump_json()
_INTERRUPTED_ERROR = RunError(
    error=INTERRUPTED_MESSAGE, code="interrupted", recoverable=True
).model_dump_json()
# Decoded entries each instance keeps per followed log, shared by its subscribers.
TAIL_ENTRIES = 4096
READ_BATCH = 1000
# Connections per instance for commands (the reader and the cancel listener have their own).
REDIS_CONNECTIONS = 16


def unavailable(exc: BaseException) -> StoreUnavailable:
    return StoreUnavailable(f"session storage (Redis) is unavailable: {exc}")


@contextlib.asynccontextmanager
async def store_call(deadline_s: float) -> AsyncIterator[None]:
    """One call to Redis, retries included: a connection failure, or no answer within
    ``deadline_s`` (a hung Redis), raises :class:`StoreUnavailable`.

    The deadline is the only bound (the clients have no read timeout, see RedisBackend). A
    command cut off by it is not left half-read on its connection: redis-py drops a connection
    whose read or write is interrupted, and the pool checks a connection for unread data before
    lending it again.
    """
    try:
        async with asyncio.timeout(deadline_s):
            yield
    except TimeoutError as exc:  # before OSError, of which it is a kind
        raise StoreUnavailable(f"session storage (Redis) did not answer within {deadline_s:g} s") from exc
    except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
        raise unavailable(exc) from exc


async def held(client: aioredis.Redis) -> Connection:
    """A connection of ``client``'s pool for one task's use alone, kept (never given back): the hot
    paths (the appender, the reader) send on it with :func:`send_commands`."""
    return await client.connection_pool.get_connection()


async def send_commands(
    connection: Connection, commands: list[tuple[Any, ...]], *, retry: bool = False
) -> list[Any]:
    """Send ``commands`` in one write and read their replies, an error reply as its exception.

    What a pipeline does, without the layers redis-py adds to each call (a pipeline object, the
    pool, its metrics), which are a large part of a round trip's CPU (measured:
    docs/benchmarks.md, section Several instances on Redis). hiredis packs the commands as
    redis-py would. A send or a read that fails or is cut off (the deadline) disconnects the
    connection, so no reply is ever left on it for the next command; the next send reconnects.
    With ``retry``, a connection error sends them all again, under the connection's retry policy,
    as redis-py's pipeline does.
    """
    if retry:
        return await connection.retry.call_with_retry(
            lambda: send_commands(connection, commands), lambda _error: connection.disconnect()
        )
    await connection.send_packed_command(
        b"".join([hiredis.pack_command(command) for command in commands]), check_health=False
    )
    replies: list[Any] = []
    for _ in commands:
        try:
            replies.append(await connection.read_response())
        except ResponseError as exc:
            replies.append(exc)
    return replies


def stream_entry_id(stream_id: str) -> int:
    return int(stream_id.partition("-")[0])


def decode_entry(
    stream_id: str, fields: dict[str, str], known: dict[str, Event] | None = None
) -> LogEntry | None:
    """A stream entry as a log entry; ``None`` for the mark of a deleted session.

    ``known`` maps JSON to the events this instance is appending: those are not decoded again.
    """
    if "c" in fields:
        return None
    raw = fields["e"]
    event = known.get(raw) if known else None
    if event is None:
        event = EVENT_ADAPTER.validate_json(raw)
    return LogEntry(stream_entry_id(stream_id), event, int(fields["n"]), float(fields["t"]))


class RedisConnections:
    """The connections, scripts, keys and deadline one instance shares with all its sessions."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "agentstream",
        instance_id: str = "",
        lock_ttl_s: float = 10.0,
        session_ttl_s: float = 3600.0,
        max_bytes: int = 10 * 1024 * 1024,
        max_sessions: int = 10_000,
        deadline_s: float = 2.0,
    ) -> None:
        self.url = url
        self.prefix = prefix
        self.instance_id = instance_id or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self.lock_ttl_ms = max(100, int(lock_ttl_s * 1000))
        self.session_ttl_ms = max(1000, int(session_ttl_s * 1000))
        self.max_bytes = max_bytes
        self.max_sessions = max_sessions
        self.deadline_s = deadline_s
        # How long the reader's XREAD blocks: the claim checks ride on its wake-ups.
        self.check_interval_s = min(5.0, max(0.05, self.lock_ttl_ms / 4000))
        retry = Retry(ExponentialBackoff(cap=0.5, base=0.02), retries=8)
        common: dict[str, Any] = {
            "decode_responses": True,
            "socket_connect_timeout": 2.0,
            # No read timeout of redis-py's: every call is bounded by the deadline instead (see
            # _store_call). With one, redis-py sends through asyncio.wait_for, which on Python
            # 3.11 can swallow the deadline's cancellation; the call then outlives its deadline
            # by up to nine of those timeouts.
            "socket_timeout": None,
            "retry": retry,
            "retry_on_error": [RedisConnectionError, RedisTimeoutError],
            # Named, so CLIENT LIST shows which instance holds which connections.
            "client_name": f"agentstream:{self.instance_id}",
        }
        # A bounded pool: requests and subscribers queue for one of a few connections rather
        # than opening one each, so a thousand clients cost Redis no more sockets than ten.
        pool = aioredis.BlockingConnectionPool.from_url(
            url, max_connections=REDIS_CONNECTIONS, timeout=5.0, **common
        )
        self.redis = aioredis.Redis(connection_pool=pool)
        # The reader blocks in XREAD, so it has a connection of its own; each of its reads is
        # bounded by the block time plus the deadline.
        self.reader_redis = aioredis.Redis.from_url(
            url, **{**common, "retry": Retry(ExponentialBackoff(), 0)}
        )
        self.scripts = {
            name: self.redis.register_script(getattr(scripts, name))
            for name in (
                "APPEND",
                "CREATE",
                "RESTORE",
                "LOAD",
                "REAP",
                "CLAIM",
                "FINISH",
                "RENEW",
                "DELETE",
                "STATUS",
                "ANSWER",
            )
        }
        # Claim renewals and session checks have connections of their own, so a busy pool of
        # appends can never starve them (a claim that is not renewed in time interrupts a query).
        self.control = aioredis.Redis.from_url(url, **common)
        self.control_scripts = {
            name: self.control.register_script(getattr(scripts, name)) for name in ("RENEW", "REAP")
        }
        self._tokens = itertools.count(1)
        self.connected = False
        self.stopping = False

    # -- keys -------------------------------------------------------------------------------

    def meta_key(self, session_id: str) -> str:
        return f"{self.prefix}:s:{session_id}"

    def log_key(self, session_id: str) -> str:
        return f"{self.prefix}:s:{session_id}:log"

    def lock_key(self, session_id: str) -> str:
        return f"{self.prefix}:s:{session_id}:run"

    def owner_key(self, owner: str) -> str:
        return f"{self.prefix}:owner:{owner}"

    @property
    def sessions_key(self) -> str:
        return f"{self.prefix}:sessions"

    def cancel_channel(self, instance_id: str) -> str:
        return f"{self.prefix}:cancel:{instance_id}"

    def session_keys(self, session_id: str) -> list[str]:
        """meta, log, lock: the keys most scripts take first."""
        return [self.meta_key(session_id), self.log_key(session_id), self.lock_key(session_id)]

    def next_token(self) -> str:
        """A token naming one append, so a retried append is not stored twice."""
        return f"{self.instance_id}:{next(self._tokens)}"

    def interrupt_args(self) -> list[Any]:
        """The arguments the scripts need to end an orphaned query."""
        return [self.max_bytes, f"{time.time():.6f}", _INTERRUPTED_STATUS, _INTERRUPTED_ERROR]

    # -- calls ------------------------------------------------------------------------------

    def call(self, extra_s: float = 0.0) -> contextlib.AbstractAsyncContextManager[None]:
        """Bound one call to Redis by the deadline (plus ``extra_s``, for a blocking read)."""
        return store_call(self.deadline_s + extra_s)

    async def outlast(self, write: Callable[[], Awaitable[T]]) -> T:
        """A write of a run that holds a claim, tried again while Redis is unavailable for less than
        the claim's lifetime (the claim outlives such an outage, so the run goes on); past that
        the claim is gone, and :class:`StoreUnavailable` is raised.

        ``write`` must be safe to repeat: an attempt cut off by the deadline may still be carried
        out once Redis answers again (appends carry a token, finishes are recognised).
        """
        give_up = time.monotonic() + self.lock_ttl_ms / 1000
        delay = 0.05
        while True:
            try:
                return await write()
            except StoreUnavailable:
                if time.monotonic() + delay >= give_up:
                    raise
            await asyncio.sleep(delay)  # a refused connection fails at once: back off a little
            delay = min(delay * 2, 0.5)
