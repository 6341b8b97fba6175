"""The service in process on a Redis of the test's own that hangs (``SIGSTOP``) or forgets (a
restart without persistence): health answers at once, new work gets a prompt 503, a running
query rides a short outage out, and nothing is logged at ERROR.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from service.errors import StoreUnavailable
from service.store.redis import REDIS_CONNECTIONS, RedisBackend
from tests.conftest import ClientFactory, services_of, sse_events
from tests.support.redis_server import RedisServer, require_redis_server
from tests.transports.test_metrics import scrape, value

# AGENT_REDIS_DEADLINE_S's default: how long a store call may take before it is a 503.
DEFAULT_DEADLINE_S = 2.0
# What /healthz promises whatever Redis does.
HEALTH_S = 1.0
# Room for a loaded test machine on top of a deadline.
MARGIN_S = 1.0


@pytest.fixture
def volatile_redis() -> Iterator[RedisServer]:
    """A redis-server of this test's own that keeps nothing across a restart."""
    require_redis_server()
    with RedisServer(persistent=False) as server:
        yield server


def errors_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What the test's service logged at ERROR or above."""
    return [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR]


async def timed(client: TestClient, method: str, path: str, limit: float) -> tuple[int, Any, float]:
    """``(status, JSON body, seconds)`` of one request; a failure, not a hang, past ``limit`` x 5."""
    started = time.monotonic()
    try:
        async with asyncio.timeout(limit * 5):
            async with client.request(method, path) as response:
                body = await response.json()
    except TimeoutError:
        pytest.fail(f"{method} {path} gave no answer within {limit * 5:.0f} s")
    return response.status, body, time.monotonic() - started


async def until_healthy(client: TestClient) -> None:
    """Probe /healthz until it says 200 (each probe is a round trip: no busy loop)."""
    async with asyncio.timeout(15):
        while (await timed(client, "GET", "/healthz", HEALTH_S))[0] != 200:
            pass


async def query_done(client: TestClient) -> None:
    """A new session takes a short query, which ends with ``done``."""
    status, body, _ = await timed(client, "POST", "/sessions", DEFAULT_DEADLINE_S)
    assert status == 201, body
    session_id = body["id"]
    async with client.post(
        f"/sessions/{session_id}/messages", json={"content": "hi [emu:tokens=3]"}
    ) as response:
        assert response.status == 202, await response.text()
    follower = Follower(client, session_id)
    async with asyncio.timeout(15):
        await follower.run()
    assert follower.terminal is not None and follower.terminal["type"] == "done", follower.terminal


@dataclass
class Follower:
    """A client following a session's query over SSE and resuming with its last id (as a browser's
    EventSource does), until the query's terminal event or until the session is gone."""

    client: TestClient
    session_id: str
    flowing: asyncio.Event = field(default_factory=asyncio.Event)
    events: list[dict[str, Any]] = field(default_factory=list)  # the logged events, with ids
    notices: list[dict[str, Any]] = field(default_factory=list)  # errors that ended a stream
    statuses: list[int] = field(default_factory=list)
    waits: list[float] = field(default_factory=list)  # seconds until each request was answered
    terminal: dict[str, Any] | None = None
    ended_at: float = 0.0

    async def run(self) -> None:
        while self.terminal is None:
            last = self.events[-1]["id"] if self.events else 0
            started = time.monotonic()
            async with self.client.get(
                f"/sessions/{self.session_id}/events", headers={"Last-Event-ID": str(last)}
            ) as response:
                self.waits.append(time.monotonic() - started)
                self.statuses.append(response.status)
                if response.status == 404:
                    break
                if response.status == 503:
                    continue  # the store is away: try again (each try takes up to the deadline)
                assert response.status == 200, await response.text()
                async for event in sse_events(response):
                    if "id" not in event:
                        self.notices.append(event["data"])
                        continue
                    self.events.append({"id": int(event["id"]), **event["data"]})
                    if event["data"]["type"] == "assistant_text":
                        self.flowing.set()
                    if event["data"]["type"] in {"done", "error"}:
                        self.terminal = event["data"]
                        break
        self.ended_at = time.monotonic()


@contextlib.asynccontextmanager
async def following(
    client: TestClient, session_id: str
) -> AsyncIterator[tuple[Follower, asyncio.Task[None]]]:
    """A :class:`Follower` at work in the background, yielded once the answer's text flows; it is
    stopped if the test leaves before it ends."""
    follower = Follower(client, session_id)
    task = asyncio.create_task(follower.run())
    try:
        await asyncio.wait_for(asyncio.shield(follower.flowing.wait()), 10)
        yield follower, task
    finally:
        task.cancel()
        await asyncio.wait([task])
        if not task.cancelled():
            task.exception()  # seen here, or already raised to the test


async def test_calls_cut_off_by_the_deadline_leave_no_reply_behind(own_redis: RedisServer) -> None:
    backend = RedisBackend(own_redis.url, prefix="cut", deadline_s=0.5)
    await backend.start()

    async def get(key: str) -> str | None:
        async with backend.call():
            return await backend.redis.get(key)

    try:
        keys = [f"cut:{n}" for n in range(REDIS_CONNECTIONS * 2)]  # every pooled connection, twice
        await backend.redis.mset({key: key for key in keys})
        own_redis.pause()
        try:
            started = time.monotonic()
            cut = await asyncio.gather(*(get(key) for key in keys), return_exceptions=True)
            took = time.monotonic() - started
        finally:
            own_redis.resume()
        assert all(isinstance(result, StoreUnavailable) for result in cut), cut
        assert took < 0.5 + MARGIN_S, took
        # Redis answers the cut-off commands now, to sockets that were closed: no connection
        # lent again holds one of those replies, so every answer is the one asked for.
        for _ in range(3):
            keys.reverse()
            assert await asyncio.gather(*(get(key) for key in keys)) == keys
    finally:
        await backend.stop()


async def test_a_paused_redis_gets_prompt_503s_and_healthz_answers_within_a_second(
    own_redis: RedisServer, make_client: ClientFactory
) -> None:
    client = await make_client(redis_url=own_redis.url, redis_prefix="pause")
    assert (await timed(client, "GET", "/healthz", HEALTH_S))[0] == 200
    own_redis.pause()
    try:
        # Probe after probe for a few seconds of pause: each one answers within a second.
        probes: list[float] = []
        paused_at = time.monotonic()
        while time.monotonic() - paused_at < 3.0:
            status, body, took = await timed(client, "GET", "/healthz", HEALTH_S)
            probes.append(took)
            assert took < HEALTH_S, probes
            assert status == 503 and body["status"] == "degraded", body
            assert body["store"]["connected"] is False
        assert len(probes) >= 3, probes
        # New work is refused within about the deadline, with the body clients know.
        status, body, took = await timed(client, "POST", "/sessions", DEFAULT_DEADLINE_S)
        assert status == 503 and body["code"] == "store_unavailable", body
        assert took < DEFAULT_DEADLINE_S + MARGIN_S, took
    finally:
        own_redis.resume()
    await until_healthy(client)
    # Connections cut mid-command were not reused with half a reply in them: the answers fit.
    await query_done(client)
    await query_done(client)


async def test_a_query_that_loses_redis_briefly_goes_on_or_ends_promptly(
    own_redis: RedisServer, make_client: ClientFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    deadline, pause_s = 1.0, 4.0  # a pause past the deadline, well within the claim's 10 s
    client = await make_client(redis_url=own_redis.url, redis_prefix="blip", redis_deadline_s=deadline)
    status, body, _ = await timed(client, "POST", "/sessions", deadline)
    assert status == 201, body
    session_id = body["id"]
    message = {"content": "a story [emu:tokens=150] [emu:tps=50]"}
    async with client.post(f"/sessions/{session_id}/messages", json=message) as response:
        assert response.status == 202, await response.text()
    async with following(client, session_id) as (follower, task):
        own_redis.pause()
        try:
            # A client asking about the query meanwhile is answered, not held until Redis is back.
            paused_at = time.monotonic()
            waits = []
            while time.monotonic() - paused_at < pause_s:
                status, body, took = await timed(client, "GET", f"/sessions/{session_id}", deadline)
                waits.append(took)
                assert status in {200, 503}, body
                assert took < deadline + MARGIN_S, waits
        finally:
            own_redis.resume()
        resumed_at = time.monotonic()
        async with asyncio.timeout(30):
            await task
    terminal = follower.terminal
    assert terminal is not None
    assert terminal["type"] == "done" or terminal.get("code") == "store_unavailable", terminal
    # The query went on where it was (or ended) soon after Redis came back: the rest of a 3 s
    # answer, not a claim's lifetime or more.
    assert follower.ended_at - resumed_at < 3.0 + deadline + MARGIN_S, follower.ended_at - resumed_at
    ids = [event["id"] for event in follower.events]
    assert ids == list(range(1, len(ids) + 1))
    assert all(wait < deadline + MARGIN_S for wait in follower.waits), follower.waits
    assert errors_logged(caplog) == []
    assert services_of(client).runs.active == 0


async def test_a_redis_that_restarts_empty_mid_query_loses_the_session_with_a_warning(
    volatile_redis: RedisServer, make_client: ClientFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    client = await make_client(redis_url=volatile_redis.url, redis_prefix="amnesia")
    status, body, _ = await timed(client, "POST", "/sessions", DEFAULT_DEADLINE_S)
    assert status == 201, body
    session_id = body["id"]
    message = {"content": "a long story [emu:tokens=400] [emu:tps=50]"}
    async with client.post(f"/sessions/{session_id}/messages", json=message) as response:
        assert response.status == 202, await response.text()
    async with following(client, session_id) as (follower, task):
        await asyncio.to_thread(volatile_redis.restart)
        async with asyncio.timeout(20):
            await task
            await services_of(client).runs.wait_idle()
    # The follower was told why its stream ended, then found the session gone.
    assert follower.terminal is None
    assert follower.notices and follower.notices[-1]["code"] in {"store_unavailable", "session_lost"}
    assert follower.statuses[-1] == 404
    # The operator sees one clear warning about that session, and nothing at ERROR.
    assert errors_logged(caplog) == []
    lost = [
        record.getMessage()
        for record in caplog.records
        if record.levelno == logging.WARNING and session_id in record.getMessage()
    ]
    assert len(lost) == 1 and "lost" in lost[0], lost
    # The run ended, and the operator's count of ended runs says so.
    samples = await scrape(client)
    assert (
        value(samples, "agentstream_runs_finished_total", outcome="error", code="run_lost", agent="default")
        == 1
    )
    # The service serves on.
    await query_done(client)
