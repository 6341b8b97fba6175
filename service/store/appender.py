"""Appends of every run of this instance, sent to Redis together in pipelines."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from redis.asyncio.connection import Connection
from redis.exceptions import NoScriptError, RedisError

from service.errors import StoreUnavailable
from service.store import scripts
from service.store.connection import RedisConnections, held, send_commands

log = logging.getLogger(__name__)


class Appender:
    """Sends the appends of all this instance's runs to Redis together.

    Each run awaits its own append, but while one pipeline of appends is on the wire, the appends
    of every other run queue up and go in the next one: under load one round trip carries dozens
    of events (and needs one connection, not dozens); alone, an append costs one round trip as
    before. Appends of one session are never reordered (its run awaits each in turn).
    """

    MAX_BATCH = 512

    def __init__(self, backend: RedisConnections) -> None:
        self._backend = backend
        self._queue: list[tuple[list[str], list[Any], asyncio.Future[Any]]] = []
        self._flusher: asyncio.Task[None] | None = None
        self.batches = 0  # pipelines sent, to see the batching at work
        self.appends = 0
        # One of the pool's connections, kept: the appender sends one batch at a time.
        self._connection: Connection | None = None

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
            # EVALSHA directly: redis-py's script objects would check with SCRIPT EXISTS first,
            # a round trip per pipeline.
            commands = [("EVALSHA", script.sha, len(keys), *keys, *args) for keys, args, _future in pending]
            try:
                async with backend.call():
                    connection = self._connection
                    if connection is None:
                        connection = self._connection = await held(backend.redis)
                    # Tried again on a connection error, as redis-py's own pipeline would: each
                    # append carries a token, so one carried out twice is stored once.
                    results = await send_commands(connection, commands, retry=True)
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
