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

import asyncio
import contextlib
import itertools
import json
import logging
import os
import secrets
import socket
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from service.core.events import EVENT_ADAPTER, Event, RunError, StatusChange, Usage, is_terminal
from service.core.log import EventLog, LogEntry, entry_bytes
from service.core.sessions import (
    IDLE,
    RUNNING,
    MemorySessionStore,
    Session,
    SessionStore,
    new_session_id,
    session_quota_exceeded,
)
from service.errors import RunInProgress, RunLost, SessionLimitReached, SessionNotFound, StoreUnavailable
from service.store import scripts

if TYPE_CHECKING:
    from service.core.runs import RunManager

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
# /healthz's probe of Redis gets at most this long (or the deadline, when shorter).
PROBE_S = 0.5


def _unavailable(exc: BaseException) -> StoreUnavailable:
    return StoreUnavailable(f"session storage (Redis) is unavailable: {exc}")


@contextlib.asynccontextmanager
async def _store_call(deadline_s: float) -> AsyncIterator[None]:
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
        raise _unavailable(exc) from exc


def _entry_id(stream_id: str) -> int:
    return int(stream_id.partition("-")[0])


def _decode(stream_id: str, fields: dict[str, str]) -> LogEntry | None:
    """A stream entry as a log entry; ``None`` for the mark of a deleted session."""
    if "c" in fields:
        return None
    raw = fields["e"]
    return LogEntry(
        _entry_id(stream_id), EVENT_ADAPTER.validate_json(raw), int(fields["n"]), float(fields["t"])
    )


class RedisBackend:
    """The connections, scripts and background tasks one instance shares with all its sessions."""

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
            for name in ("APPEND", "CREATE", "LOAD", "REAP", "CLAIM", "FINISH", "RENEW", "DELETE")
        }
        # Claim renewals and session checks have connections of their own, so a busy pool of
        # appends can never starve them (a claim that is not renewed in time interrupts a query).
        self.control = aioredis.Redis.from_url(url, **common)
        self.control_scripts = {
            name: self.control.register_script(getattr(scripts, name)) for name in ("RENEW", "REAP")
        }
        self.appender = _Appender(self)
        self.fanout = Fanout(self)
        self.runs: RunManager | None = None
        self._tasks: list[asyncio.Task[None]] = []
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
        return _store_call(self.deadline_s + extra_s)

    @property
    def probe_s(self) -> float:
        """How long a health probe waits for Redis: short, so /healthz always answers at once."""
        return min(PROBE_S, self.deadline_s)

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

    # -- life -------------------------------------------------------------------------------

    async def start(self, runs: RunManager | None = None) -> None:
        """Start the reader, the cancel listener and the claim renewer; Redis may be down now."""
        self.runs = runs
        try:
            async with self.call():
                await self.redis.ping()
            self.connected = True
        except (StoreUnavailable, RedisError) as exc:
            log.warning("Redis at %s is not reachable yet (%s); retrying in the background", self.url, exc)
        self._tasks = [
            asyncio.create_task(self.fanout.run(), name="redis-fanout"),
            asyncio.create_task(self._listen_for_cancels(), name="redis-cancels"),
            asyncio.create_task(self._renew_claims(), name="redis-renew"),
        ]

    async def stop(self) -> None:
        # redis-py may swallow a cancellation that lands in a blocking read, so the loops also
        # watch a flag, and closing the reader's sockets ends those reads at once.
        self.stopping = True
        for task in self._tasks:
            task.cancel()
        await self.reader_redis.connection_pool.disconnect()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5)
        self._tasks = []
        self.fanout.fail_all(StoreUnavailable("the service is shutting down"))
        await self.reader_redis.aclose()
        await self.control.aclose()
        await self.redis.aclose()

    async def _listen_for_cancels(self) -> None:
        """Cancel this instance's queries when another instance asks (a cancel sent to it)."""
        channel = self.cancel_channel(self.instance_id)
        delay = 0.05
        while not self.stopping:
            pubsub = self.reader_redis.pubsub(ignore_subscribe_messages=True)
            try:
                async with self.call():
                    await pubsub.subscribe(channel)
                delay = 0.05
                while not self.stopping:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if message and message.get("type") == "message" and self.runs is not None:
                        asyncio.create_task(self.runs.cancel(str(message["data"])))
            except (StoreUnavailable, RedisError, OSError) as exc:
                if self.stopping:
                    return
                log.warning("cancel listener lost Redis (%s); reconnecting in %.2f s", exc, delay)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    async def _renew_claims(self) -> None:
        """Keep the claims of this instance's running queries alive; stop a query whose claim
        was lost (another instance declared it interrupted)."""
        interval = self.lock_ttl_ms / 3000
        wait = retry = interval
        while not self.stopping:
            await asyncio.sleep(wait)
            wait = interval
            if self.runs is None:
                continue
            claims = self.runs.claims()
            if not claims:
                continue
            now = int(time.time() * 1000)
            try:
                async with self.call(), self.control.pipeline(transaction=False) as pipe:
                    for session_id, fence in claims:
                        await self.control_scripts["RENEW"](
                            keys=[
                                self.lock_key(session_id),
                                self.meta_key(session_id),
                                self.log_key(session_id),
                                self.sessions_key,
                            ],
                            args=[session_id, fence, self.lock_ttl_ms, self.session_ttl_ms, now],
                            client=pipe,
                        )
                    kept = await pipe.execute()
            except (StoreUnavailable, RedisError) as exc:
                log.warning("could not renew %d run claim(s): %s", len(claims), exc)
                # The claims run out while Redis is away: try again soon, so that they are
                # renewed as soon as it answers, not up to a third of their lifetime later.
                retry = wait = 0.05 if retry >= interval else min(retry * 2, interval)
                continue
            retry = interval
            for (session_id, fence), ok in zip(claims, kept, strict=True):
                run = self.runs.get(session_id)
                # A run that found out first (its own write was refused) has stopped and said so.
                if not ok and run is not None and run.fence == fence:
                    log.warning(
                        "session %s: this instance lost its claim (it expired, or the session is gone); "
                        "stopping its query",
                        session_id,
                    )
                    asyncio.create_task(self.runs.cancel(session_id))


class _Appender:
    """Sends the appends of all this instance's runs to Redis together.

    Each run awaits its own append, but while one pipeline of appends is on the wire, the appends
    of every other run queue up and go in the next one: under load one round trip carries dozens
    of events (and needs one connection, not dozens); alone, an append costs one round trip as
    before. Appends of one session are never reordered (its run awaits each in turn).
    """

    MAX_BATCH = 512

    def __init__(self, backend: RedisBackend) -> None:
        self._backend = backend
        self._queue: list[tuple[list[str], list[Any], asyncio.Future[Any]]] = []
        self._flusher: asyncio.Task[None] | None = None
        self.batches = 0  # pipelines sent, to see the batching at work
        self.appends = 0

    async def append(self, keys: list[str], args: list[Any]) -> Any:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append((keys, args, future))
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush(), name="redis-appender")
        return await future

    async def _flush(self) -> None:
        try:
            while self._queue:
                batch, self._queue = self._queue[: self.MAX_BATCH], self._queue[self.MAX_BATCH :]
                await self._send(batch)
        finally:
            self._flusher = None
            if self._queue:  # an append arrived as this task was ending
                self._flusher = asyncio.create_task(self._flush(), name="redis-appender")

    async def _send(self, batch: list[tuple[list[str], list[Any], asyncio.Future[Any]]]) -> None:
        backend = self._backend
        script = backend.scripts["APPEND"]
        pending = batch
        for _ in range(2):  # a second pass after Redis lost its scripts (a restart)
            try:
                async with backend.call(), backend.redis.pipeline(transaction=False) as pipe:
                    for keys, args, _future in pending:
                        # EVALSHA directly: redis-py's script objects would check with
                        # SCRIPT EXISTS first, a round trip per pipeline.
                        pipe.evalsha(script.sha, len(keys), *keys, *args)
                    results = await pipe.execute(raise_on_error=False)
            except BaseException as exc:
                for _keys, _args, future in pending:
                    if not future.done():
                        future.set_exception(
                            exc if isinstance(exc, Exception) else StoreUnavailable(str(exc))
                        )
                if not isinstance(exc, Exception):
                    raise
                return
            self.batches += 1
            self.appends += len(pending)
            missing = []
            for (keys, args, future), result in zip(pending, results, strict=True):
                if isinstance(result, NoScriptError):
                    missing.append((keys, args, future))
                elif future.done():
                    continue
                elif isinstance(result, Exception):
                    future.set_exception(result)
                else:
                    future.set_result(result)
            if not missing:
                return
            with contextlib.suppress(StoreUnavailable, RedisError):
                async with backend.call():
                    await backend.redis.script_load(scripts.APPEND)
            pending = missing
        for _keys, _args, future in pending:
            if not future.done():
                future.set_exception(StoreUnavailable("Redis refused the append script"))


class _Tail:
    """One followed log on this instance: the newest entries, decoded once, and a wake-up."""

    __slots__ = (
        "session_id",
        "key",
        "cursor",
        "entries",
        "changed",
        "closed",
        "failed",
        "refs",
        "status",
        "appended",
    )

    def __init__(self, session_id: str, key: str, cursor: int, status: str) -> None:
        self.session_id = session_id
        self.key = key
        self.cursor = cursor  # the newest id the reader has seen
        self.entries: deque[LogEntry] = deque(maxlen=TAIL_ENTRIES)
        self.changed = asyncio.Event()
        self.closed = False
        self.failed: StoreUnavailable | None = None
        self.refs = 0
        self.status = status
        # Entries this instance appended, by id: the reader takes them instead of decoding the
        # same JSON again.
        self.appended: dict[int, LogEntry] = {}

    def wake(self) -> None:
        changed, self.changed = self.changed, asyncio.Event()
        changed.set()

    def after(self, cursor: int) -> list[LogEntry] | None:
        """The cached entries after ``cursor``; ``None`` when the cache does not reach back."""
        if cursor >= self.cursor:
            return []
        entries = self.entries
        if not entries or entries[0].id > cursor + 1:
            return None
        # The newest ``self.cursor - cursor`` entries, taken from the right end: O(batch).
        wanted = self.cursor - cursor
        if wanted == 1:
            return [entries[-1]]
        batch = list(itertools.islice(reversed(entries), wanted))
        batch.reverse()
        return batch


class Fanout:
    """The one Redis reader of an instance, feeding every local subscriber of every session."""

    def __init__(self, backend: RedisBackend) -> None:
        self.backend = backend
        self.tails: dict[str, _Tail] = {}
        self._by_key: dict[str, _Tail] = {}
        self._wake_key = f"{backend.prefix}:wake:{backend.instance_id}"
        self._wake_cursor = "$"
        self._check_interval = backend.check_interval_s
        self._last_check = time.monotonic()
        self._last_exists_check = time.monotonic()
        self.subscribers = 0
        self._subscribers_changed = asyncio.Event()

    def _count(self, change: int) -> None:
        self.subscribers += change
        changed, self._subscribers_changed = self._subscribers_changed, asyncio.Event()
        changed.set()

    def subscribers_of(self, session_id: str) -> int:
        tail = self.tails.get(session_id)
        return tail.refs if tail is not None else 0

    async def wait_subscribers(self, session_id: str, count: int) -> None:
        while self.subscribers_of(session_id) != count:
            await self._subscribers_changed.wait()

    async def watch(self, session_id: str, status: str) -> _Tail:
        tail = self.tails.get(session_id)
        if tail is None:
            backend = self.backend
            async with backend.call():
                last = int(await backend.redis.hget(backend.meta_key(session_id), "last_id") or 0)
            tail = self.tails.get(session_id)  # another subscriber may have won the race
            if tail is None:
                tail = _Tail(session_id, backend.log_key(session_id), last, status)
                self.tails[session_id] = tail
                self._by_key[tail.key] = tail
                await self._poke()
        tail.refs += 1
        self._count(+1)
        return tail

    def unwatch(self, tail: _Tail) -> None:
        tail.refs -= 1
        if tail.refs <= 0 and self.tails.get(tail.session_id) is tail:
            del self.tails[tail.session_id]
            self._by_key.pop(tail.key, None)
        self._count(-1)

    async def _poke(self) -> None:
        """Make the blocked XREAD return, so it picks up a newly followed log."""
        with contextlib.suppress(StoreUnavailable, RedisError):
            async with self.backend.call():
                await self.backend.redis.xadd(self._wake_key, {"w": "1"}, maxlen=16, approximate=True)

    def fail_all(self, error: StoreUnavailable) -> None:
        for tail in list(self.tails.values()):
            tail.failed = error
            tail.wake()
        # Failed tails are dropped: a resuming client starts a fresh one.
        self.tails.clear()
        self._by_key.clear()

    async def run(self) -> None:
        backend = self.backend
        delay = 0.05
        while not backend.stopping:
            streams: dict[str, str] = {self._wake_key: self._wake_cursor}
            for tail in self.tails.values():
                streams[tail.key] = f"{tail.cursor}-0"
            try:
                if self._wake_cursor == "$":
                    # Learn the wake stream's position first, so no poke is missed later.
                    async with backend.call():
                        newest = await backend.reader_redis.xrevrange(self._wake_key, count=1)
                    self._wake_cursor = newest[0][0] if newest else "0-0"
                    continue
                # A Redis that hangs ends the followed logs too, once the block plus the deadline
                # is over, and its subscribers resume once it answers again.
                async with backend.call(extra_s=self._check_interval):
                    result = await backend.reader_redis.xread(
                        streams, block=int(self._check_interval * 1000), count=READ_BATCH
                    )
                delay = 0.05
                backend.connected = True
            except asyncio.CancelledError:
                raise
            except (StoreUnavailable, RedisError) as exc:
                if backend.stopping:
                    return
                backend.connected = False
                if self.tails:
                    log.warning("lost Redis (%s): ending %d followed log(s); retrying", exc, len(self.tails))
                self.fail_all(exc if isinstance(exc, StoreUnavailable) else _unavailable(exc))
                self._wake_cursor = "$"
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            for key, items in result or ():
                if key == self._wake_key:
                    self._wake_cursor = items[-1][0]
                    continue
                tail = self._by_key.get(key)
                if tail is not None:
                    self._deliver(tail, items)
            if time.monotonic() - self._last_check >= self._check_interval:
                await self._check()

    def _deliver(self, tail: _Tail, items: list[tuple[str, dict[str, str]]]) -> None:
        for stream_id, fields in items:
            entry_id = _entry_id(stream_id)
            if entry_id <= tail.cursor:
                continue
            if entry_id != tail.cursor + 1:
                # Entries were purged before this reader saw them: the cache must stay
                # contiguous, so it starts over (readers further back go to Redis).
                tail.entries.clear()
                tail.appended.clear()
            entry = tail.appended.pop(entry_id, None) or _decode(stream_id, fields)
            if entry is None:
                # The mark of a deleted session is not an event: the cursor stays on the last one.
                tail.closed = True
                break
            tail.cursor = entry_id
            event = entry.event
            if isinstance(event, StatusChange):
                tail.status = RUNNING if event.status == RUNNING else IDLE
            tail.entries.append(entry)
        tail.wake()

    async def _check(self) -> None:
        """End the queries of followed sessions whose claims expired; notice deleted sessions."""
        self._last_check = time.monotonic()
        backend = self.backend
        running = [tail for tail in self.tails.values() if tail.status == RUNNING]
        try:
            if running:
                async with backend.call(), backend.control.pipeline(transaction=False) as pipe:
                    for tail in running:
                        await backend.control_scripts["REAP"](
                            keys=backend.session_keys(tail.session_id),
                            args=[*backend.interrupt_args(), ""],
                            client=pipe,
                        )
                    await pipe.execute()
            if time.monotonic() - self._last_exists_check >= 5.0 and self.tails:
                self._last_exists_check = time.monotonic()
                tails = list(self.tails.values())
                async with backend.call(), backend.control.pipeline(transaction=False) as pipe:
                    for tail in tails:
                        pipe.exists(backend.meta_key(tail.session_id))
                    found = await pipe.execute()
                for tail, exists in zip(tails, found, strict=True):
                    if not exists:
                        tail.closed = True
                        tail.wake()
        except (StoreUnavailable, RedisError) as exc:
            log.warning("session check failed: %s", exc)


class RedisEventLog(EventLog):
    """A session's event log as a Redis Stream (see the module docstring)."""

    def __init__(self, backend: RedisBackend, session_id: str, status: str = IDLE) -> None:
        self._backend = backend
        self._session_id = session_id
        self._status = status
        self._closed = False
        # The keys every call names, made once per log rather than once per event.
        self._keys = backend.session_keys(session_id)
        self._meta_key, self._log_key = self._keys[0], self._keys[1]

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def subscribers(self) -> int:
        """Subscriptions open on this instance now."""
        return self._backend.fanout.subscribers_of(self._session_id)

    async def wait_subscribers(self, count: int) -> None:
        """Return once exactly ``count`` subscriptions are open on this instance."""
        await self._backend.fanout.wait_subscribers(self._session_id, count)

    async def kept_bytes(self) -> int:
        backend = self._backend
        async with backend.call():
            value = await backend.redis.hget(self._meta_key, "bytes")
        return int(value or 0)

    async def append(self, event: Event, *, fence: str | None = None) -> LogEntry:
        backend = self._backend
        raw = event.model_dump_json()
        size = entry_bytes(len(raw))
        ts = time.time()
        # Sized as the memory log sizes it, so the one bound keeps the same history in both
        # stores (an entry takes less in Redis, so Redis stays well within it). The token makes
        # a repeated append (redis-py's retries, or a run's below) count once.
        args = [fence or "", raw, f"{ts:.6f}", size, backend.max_bytes, backend.next_token()]
        try:
            if fence:
                entry_id = await backend.outlast(lambda: backend.appender.append(self._keys, args))
            else:
                entry_id = await backend.appender.append(self._keys, args)
        except ResponseError as exc:
            if "RUNLOST" in str(exc):
                raise RunLost(f"session {self._session_id}: the run's claim expired") from None
            if "NOSESSION" in str(exc):
                self._closed = True
                if fence:
                    # The session vanished under its query: deleted, or Redis came back without
                    # its data. Losing it is not a failure of this service.
                    raise RunLost(
                        f"session {self._session_id} was lost from the store while its query ran "
                        "(deleted, or Redis restarted without its data)"
                    ) from None
                raise RuntimeError("event log is closed") from None
            raise
        entry = LogEntry(int(entry_id), event, size, ts)
        tail = backend.fanout.tails.get(self._session_id)
        if tail is not None and entry.id > tail.cursor and len(tail.appended) < TAIL_ENTRIES:
            tail.appended[entry.id] = entry
        return entry

    async def _range(self, after_id: int, limit: int | None) -> list[LogEntry]:
        backend = self._backend
        async with backend.call():
            items = await backend.redis.xrange(self._log_key, min=f"{after_id + 1}-0", count=limit or None)
        entries = []
        for stream_id, fields in items:
            entry = _decode(stream_id, fields)
            if entry is None:
                self._closed = True
                break
            entries.append(entry)
        return entries

    async def read(self, after_id: int, limit: int | None = None, *, strict: bool = True) -> list[LogEntry]:
        after_id = max(after_id, 0)
        entries = await self._range(after_id, limit)
        if entries and entries[0].id > after_id + 1 and strict:
            from service.errors import EventsPurged

            raise EventsPurged(after_id, entries[0].id)
        return entries

    async def subscribe(
        self, after_id: int = 0, *, idle_timeout: float | None = None
    ) -> AsyncIterator[list[LogEntry]]:
        fanout = self._backend.fanout
        cursor = max(after_id, 0)
        tail = await fanout.watch(self._session_id, self._status)
        try:
            while True:
                changed = tail.changed
                if tail.failed is not None:
                    raise tail.failed
                batch = tail.after(cursor)
                if batch is None:
                    batch = await self.read(cursor, READ_BATCH)
                if batch:
                    cursor = batch[-1].id
                    yield batch
                    continue
                if tail.closed or self._closed:
                    return
                try:
                    async with asyncio.timeout(idle_timeout):
                        await changed.wait()
                except TimeoutError:
                    yield []
        finally:
            fanout.unwatch(tail)

    async def last_id(self) -> int:
        backend = self._backend
        async with backend.call():
            value = await backend.redis.hget(self._meta_key, "last_id")
        return int(value or 0)

    async def first_id(self) -> int:
        backend = self._backend
        async with backend.call():
            async with backend.redis.pipeline(transaction=False) as pipe:
                pipe.xrange(self._log_key, count=1)
                pipe.hget(self._meta_key, "last_id")
                first, last = await pipe.execute()
        if first and "c" not in first[0][1]:
            return _entry_id(first[0][0])
        return int(last or 0) + 1

    async def close(self) -> None:
        self._closed = True


class RedisSessionStore(SessionStore):
    """Sessions on Redis, shared by every instance; short-lived sessions stay in memory.

    ``POST /agent/stream`` and the WebSocket ``run`` command use a session that lives for one
    request on one instance; keeping those local costs Redis nothing.
    """

    def __init__(self, backend: RedisBackend, local: MemorySessionStore, *, max_per_owner: int = 0) -> None:
        self.backend = backend
        self.local = local
        self.max_per_owner = max_per_owner  # lasting sessions per owner, on every instance together
        self.max_sessions = backend.max_sessions
        self.ttl_s = backend.session_ttl_ms / 1000

    def _is_local(self, session: Session) -> bool:
        return session.ephemeral

    async def create(self, *, ephemeral: bool = False, owner: str = "") -> Session:
        if ephemeral:
            return await self.local.create(ephemeral=True, owner=owner)
        backend = self.backend
        session_id = new_session_id()
        created = time.time()
        try:
            async with backend.call():
                await backend.scripts["CREATE"](
                    keys=[backend.meta_key(session_id), backend.sessions_key, backend.owner_key(owner)],
                    args=[
                        session_id,
                        owner,
                        f"{created:.6f}",
                        backend.session_ttl_ms,
                        int(created * 1000),
                        backend.max_sessions,
                        self.max_per_owner,
                        backend.meta_key(""),
                    ],
                )
        except ResponseError as exc:
            if "SESSIONLIMIT" in str(exc):
                raise SessionLimitReached(f"{backend.max_sessions} sessions are open") from None
            if "OWNERLIMIT" in str(exc):
                raise session_quota_exceeded(self.max_per_owner) from None
            raise
        return Session(id=session_id, log=RedisEventLog(backend, session_id), owner=owner, created_at=created)

    async def get(self, session_id: str) -> Session:
        with contextlib.suppress(SessionNotFound):
            return await self.local.get(session_id)
        backend = self.backend
        try:
            async with backend.call():
                flat = await backend.scripts["LOAD"](
                    keys=backend.session_keys(session_id), args=backend.interrupt_args()
                )
        except ResponseError as exc:
            if "NOSESSION" in str(exc):
                raise SessionNotFound(session_id) from None
            raise
        fields = dict(zip(flat[::2], flat[1::2], strict=True))
        status = fields.get("status", IDLE)
        return Session(
            id=session_id,
            log=RedisEventLog(backend, session_id, status),
            messages=json.loads(fields.get("messages") or "[]"),
            status=status,
            owner=fields.get("owner", ""),
            usage=Usage.model_validate_json(fields.get("usage") or "{}"),
            created_at=float(fields.get("created") or 0),
            run_id=fields.get("run_id", ""),
            run_message=fields.get("run_msg", ""),
            run_start_id=int(fields.get("run_start") or 0),
        )

    async def delete(self, session_id: str) -> None:
        with contextlib.suppress(SessionNotFound):
            await self.local.delete(session_id)
            return
        backend = self.backend
        keys = [*backend.session_keys(session_id), backend.sessions_key]
        async with backend.call():
            deleted = await backend.scripts["DELETE"](keys=keys, args=[session_id, f"{time.time():.6f}"])
        if not deleted:
            raise SessionNotFound(session_id)

    async def count(self) -> int:
        backend = self.backend
        async with backend.call():
            shared = await backend.redis.zcount(backend.sessions_key, int(time.time() * 1000), "+inf")
        return int(shared) + await self.local.count()

    async def expire_idle(self, now: float | None = None) -> list[str]:
        # Redis expires idle sessions by itself; only the local short-lived ones need a sweep.
        expired = await self.local.expire_idle(now)
        backend = self.backend
        with contextlib.suppress(StoreUnavailable, RedisError):
            async with backend.call():
                await backend.redis.zremrangebyscore(backend.sessions_key, "-inf", int(time.time() * 1000))
        return expired

    async def claim_run(self, session: Session, run_id: str) -> str | None:
        if self._is_local(session):
            return None
        backend = self.backend
        fence = f"{backend.instance_id}:{run_id}"
        now = time.time()
        try:
            async with backend.call():
                messages = await backend.scripts["CLAIM"](
                    keys=[*backend.session_keys(session.id), backend.sessions_key],
                    args=[
                        session.id,
                        fence,
                        backend.lock_ttl_ms,
                        run_id,
                        session.run_message,
                        backend.session_ttl_ms,
                        int(now * 1000),
                        *backend.interrupt_args(),
                    ],
                )
        except ResponseError as exc:
            if "CLAIMED" in str(exc):
                raise RunInProgress(session.id) from None
            if "NOSESSION" in str(exc):
                raise SessionNotFound(session.id) from None
            raise
        # The run continues the conversation as it stands now, not as this copy was read.
        session.messages[:] = json.loads(messages or "[]")
        return fence

    async def finish_run(self, session: Session, fence: str | None, events: list[Event]) -> None:
        if self._is_local(session) or fence is None:
            await super().finish_run(session, fence, events)
            return
        backend = self.backend
        now = time.time()
        args: list[Any] = [
            session.id,
            fence,
            json.dumps(session.messages, separators=(",", ":")),
            session.usage.model_dump_json(),
            backend.session_ttl_ms,
            int(now * 1000),
            backend.max_bytes,
        ]
        for event in events:
            args += [event.model_dump_json(), f"{now:.6f}"]
        keys = [*backend.session_keys(session.id), backend.sessions_key]

        async def finish() -> None:
            async with backend.call():
                await backend.scripts["FINISH"](keys=keys, args=args)

        try:
            # Tried again through a short outage, like the run's appends: the script knows a
            # finish it already carried out.
            await backend.outlast(finish)
        except ResponseError as exc:
            if "RUNLOST" in str(exc):
                raise RunLost(f"session {session.id}: the run's claim expired") from None
            raise

    async def cancel_elsewhere(self, session_id: str) -> bool:
        if session_id in self.local:
            return False
        backend = self.backend
        lock_key = backend.lock_key(session_id)
        async with backend.call():
            fence = await backend.redis.get(lock_key)
            if not fence:
                return False
            after = await RedisEventLog(backend, session_id).last_id()
            owner = fence.rpartition(":")[0]
            receivers = await backend.redis.publish(backend.cancel_channel(owner), session_id)
            if not receivers:
                # Its instance is gone: end the query here rather than wait for the claim to expire.
                await backend.scripts["REAP"](
                    keys=backend.session_keys(session_id), args=[*backend.interrupt_args(), fence]
                )
                return True
        await self._wait_for_end(session_id, lock_key, fence, after)
        return True

    async def _wait_for_end(self, session_id: str, lock_key: str, fence: str, after: int) -> None:
        """Wait (at most twice the claim's lifetime) until the query's terminal event is logged."""
        backend = self.backend
        log_ = RedisEventLog(backend, session_id, RUNNING)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(backend.lock_ttl_ms * 2 / 1000):
                async with contextlib.aclosing(log_.subscribe(after, idle_timeout=0.25)) as batches:
                    async for batch in batches:
                        if any(is_terminal(entry.event) for entry in batch):
                            return
                        if not batch:
                            async with backend.call():
                                if await backend.redis.get(lock_key) != fence:
                                    return


def make_store(
    settings: Any, local_factory: Callable[[], MemorySessionStore]
) -> tuple[RedisBackend, RedisSessionStore]:
    """The backend and store the settings ask for (``AGENT_REDIS_URL`` and friends)."""
    backend = RedisBackend(
        settings.redis_url,
        prefix=settings.redis_prefix,
        instance_id=settings.instance_id,
        lock_ttl_s=settings.redis_lock_ttl_s,
        session_ttl_s=settings.session_ttl_s,
        max_bytes=settings.session_events_max_bytes,
        max_sessions=settings.max_sessions,
        deadline_s=settings.redis_deadline_s,
    )
    return backend, RedisSessionStore(backend, local_factory(), max_per_owner=settings.quota("sessions"))
