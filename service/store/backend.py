"""The Redis backend of one instance: its connections, plus the background work they carry (the
reader that fans new entries out, the appender, the cancel listener and the claim renewer)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from redis.exceptions import RedisError

from service.core.runs import RunManager
from service.errors import StoreUnavailable
from service.store.appender import Appender
from service.store.connection import RedisConnections
from service.store.fanout import Fanout

log = logging.getLogger(__name__)


class RedisBackend(RedisConnections):
    """The connections, scripts and background tasks one instance shares with all its sessions."""

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(url, **options)
        self.appender = Appender(self)
        self.fanout = Fanout(self)
        self.runs: RunManager | None = None
        self._tasks: list[asyncio.Task[None]] = []

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
