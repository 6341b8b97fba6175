"""Sessions on Redis, shared by every instance; short-lived sessions stay in memory."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from redis.exceptions import RedisError, ResponseError

from service.core.events import EVENT_ADAPTER, Event, StatusChange, Usage, is_terminal
from service.core.log import LogEntry, entry_bytes
from service.core.records import SessionRecord
from service.core.sessions import (
    DEFAULT_AGENT,
    IDLE,
    PENDING,
    RUNNING,
    Answer,
    MemorySessionStore,
    Request,
    Session,
    SessionStore,
    answered_state,
    new_session_id,
    session_quota_exceeded,
)
from service.errors import (
    RunInProgress,
    RunLost,
    SessionExists,
    SessionLimitReached,
    SessionNotFound,
    StoreUnavailable,
)
from service.store.backend import RedisBackend
from service.store.log import RedisEventLog

log = logging.getLogger(__name__)


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

    async def create(
        self,
        *,
        ephemeral: bool = False,
        owner: str = "",
        session_id: str | None = None,
        agent: str = DEFAULT_AGENT,
    ) -> Session:
        if ephemeral:
            return await self.local.create(ephemeral=True, owner=owner, session_id=session_id, agent=agent)
        backend = self.backend
        session_id = session_id or new_session_id()
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
                        agent,
                    ],
                )
        except ResponseError as exc:
            if "SESSIONLIMIT" in str(exc):
                raise SessionLimitReached(f"{backend.max_sessions} sessions are open") from None
            if "OWNERLIMIT" in str(exc):
                raise session_quota_exceeded(self.max_per_owner) from None
            if "EXISTS" in str(exc):
                raise SessionExists(session_id) from None
            raise
        return Session(
            id=session_id,
            log=RedisEventLog(backend, session_id),
            owner=owner,
            created_at=created,
            agent=agent,
        )

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
        approvals = {name[3:]: value for name, value in fields.items() if name.startswith("ap:")}
        requests = {
            name[3:]: EVENT_ADAPTER.validate_json(value)
            for name, value in fields.items()
            if name.startswith("aq:")
        }
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
            approvals=approvals,
            approval_requests=dict(sorted(requests.items(), key=lambda item: item[1].expires_at)),
            # A session made before agents had names has no such field: it was the one agent's.
            agent=fields.get("agent") or DEFAULT_AGENT,
        )

    async def restore(self, record: SessionRecord) -> tuple[Session, bool]:
        backend = self.backend
        now = time.time()
        async with backend.call():
            fresh = await backend.scripts["RESTORE"](
                keys=[backend.meta_key(record.id), backend.log_key(record.id), backend.sessions_key],
                args=[
                    record.id,
                    record.owner,
                    f"{record.created_at:.6f}",
                    backend.session_ttl_ms,
                    int(now * 1000),
                    json.dumps(record.messages, separators=(",", ":"), allow_nan=False),
                    record.usage.model_dump_json(),
                    record.resume_after,
                    record.agent,
                ],
            )
        return await self.get(record.id), bool(fresh)

    async def delete(self, session_id: str) -> None:
        with contextlib.suppress(SessionNotFound):
            await self.local.delete(session_id)
            return
        backend = self.backend
        keys = [*backend.session_keys(session_id), backend.sessions_key]
        async with backend.call():
            deleted = await backend.scripts["DELETE"](keys=keys, args=[session_id, f"{time.time():.6f}"])
        backend.fanout.reread(session_id)  # the mark of the deletion comes through the reader
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
        backend.fanout.reread(session.id)  # an interrupted query's ending comes through the reader
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
            json.dumps(session.messages, separators=(",", ":"), allow_nan=False),
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
            backend.fanout.reread(session.id)  # its last events come through the reader

        try:
            # Tried again through a short outage, like the run's appends: the script knows a
            # finish it already carried out.
            await backend.outlast(finish)
        except ResponseError as exc:
            if "RUNLOST" in str(exc):
                raise RunLost(f"session {session.id}: the run's claim expired") from None
            raise

    async def set_status(
        self, session: Session, fence: str | None, status: str, requests: Sequence[Request] = ()
    ) -> list[LogEntry]:
        if self._is_local(session) or fence is None:
            return await super().set_status(session, fence, status, requests)
        backend = self.backend
        events: list[Event] = [*requests, StatusChange(status=status)]
        raws = [event.model_dump_json() for event in events]
        sizes = [entry_bytes(len(raw)) for raw in raws]
        ts = time.time()
        args: list[Any] = [fence, status, f"{ts:.6f}", backend.max_bytes, len(requests)]
        for request, raw in zip(requests, raws, strict=False):
            args += (request.approval_id, raw)
        for raw, size in zip(raws, sizes, strict=True):
            args += (raw, size)

        try:
            # Sent once: unlike an append it carries no token, so a retry could log it twice.
            async with backend.call():
                last_id = int(
                    await backend.scripts["STATUS"](keys=backend.session_keys(session.id), args=args)
                )
        except ResponseError as exc:
            if "RUNLOST" in str(exc) or "NOSESSION" in str(exc):
                raise RunLost(f"session {session.id}: the run's claim expired") from None
            raise
        for request in requests:
            session.approvals[request.approval_id] = PENDING
            session.approval_requests[request.approval_id] = request
        session.status = status
        first = last_id - len(events) + 1
        entries = [
            LogEntry(first + n, event, size, ts)
            for n, (event, size) in enumerate(zip(events, sizes, strict=True))
        ]
        tail = backend.fanout.tails.get(session.id)
        if tail is not None:
            tail.stored(entries)  # as an append's: the followers have them at once
        return entries

    async def answer_approval(self, session: Session, response: Answer) -> str | None:
        if self._is_local(session):
            return await super().answer_approval(session, response)
        backend = self.backend
        raw = response.model_dump_json()
        args = [
            response.approval_id,
            answered_state(response),
            raw,
            f"{time.time():.6f}",
            entry_bytes(len(raw)),
            backend.max_bytes,
        ]
        try:
            async with backend.call():
                taken = await backend.scripts["ANSWER"](keys=backend.session_keys(session.id)[:2], args=args)
        except ResponseError as exc:
            if "NOSESSION" in str(exc):
                raise SessionNotFound(session.id) from None
            raise
        backend.fanout.reread(session.id)  # the answer comes to this instance's followers through the reader
        return None if taken == "ok" else str(taken)

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
