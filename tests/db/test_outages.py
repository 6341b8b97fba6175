"""The session database down or stalled: every request answers within a few seconds (a 503 that
names the database, or what memory holds), ``/healthz`` says which part is down, and nothing a
query completed is lost once the database is back.

These run on a PostgreSQL of their own, which they stop (SIGTERM) or stall (SIGSTOP on the
postmaster and its children) without touching the suite's shared one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from tests.conftest import ClientFactory, services_of, sse_events
from tests.db.helpers import ask, new_session, session_body, texts
from tests.support._pipes import ProcessStartError
from tests.support.postgres_server import PostgresServer, PostgresUnavailable, postgres_unavailable


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL server of this test's own, to stop or stall at will."""
    try:
        server = PostgresServer().start()
    except (PostgresUnavailable, ProcessStartError) as error:
        postgres_unavailable(str(error))
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.slow
async def test_a_database_that_is_down_is_named_in_the_503_not_redis(
    make_client: ClientFactory, own_postgres: PostgresServer
) -> None:
    client = await make_client(database_url=own_postgres.create_database())
    own_postgres.stop(remove=False)
    async with client.post("/sessions", json={}) as response:
        assert response.status == 503
        body = await response.json()
    assert body["code"] == "database_unavailable"
    assert "database" in body["error"] and "Redis" not in body["error"]
    assert response.headers["Retry-After"] == "1"


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        if int(stat.rpartition(")")[2].split()[1]) == pid:
            found.append(int(entry.name))
    return found


@contextlib.contextmanager
def stalled(server: PostgresServer) -> Iterator[None]:
    """The server stopped in its tracks (SIGSTOP on the postmaster and every process under it),
    its connections open and silent, as a hung host's are; SIGCONT on the way out."""
    assert server.process is not None
    stopped: list[int] = []
    try:
        todo = [server.process.pid]  # runuser (when root), then the postmaster, then its backends
        while todo:
            pid = todo.pop()
            os.kill(pid, signal.SIGSTOP)  # a parent stopped first forks no child meanwhile
            stopped.append(pid)
            todo += [child for child in _children(pid) if child not in stopped]
        yield
    finally:
        for pid in reversed(stopped):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


ANSWER_S = 5.0  # what every request gets while the database is stalled


@contextlib.asynccontextmanager
async def answered_in_time() -> AsyncIterator[None]:
    started = time.monotonic()
    async with asyncio.timeout(ANSWER_S):
        yield
    assert time.monotonic() - started < ANSWER_S


async def request(client: TestClient, method: str, path: str, **options: Any) -> tuple[int, Any]:
    async with answered_in_time(), client.request(method, path, **options) as response:
        return response.status, await response.json()


@pytest.mark.slow
async def test_a_stalled_database_gets_503s_in_time_and_loses_nothing_completed(
    make_client: ClientFactory, own_postgres: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    url = own_postgres.create_database()
    client = await make_client(database_url=url, database_deadline_s=1.0, tools_require_approval="calculator")
    sid = await new_session(client)
    await ask(client, sid, "Hello")
    # A query waiting for a person's approval: it ends while the database is stalled.
    async with client.post(
        f"/sessions/{sid}/messages",
        json={"content": 'Sum [emu:tool=calculator] [emu:tool_input={"expression": "6*7"}]'},
    ) as response:
        assert response.status == 202
        after = (await response.json())["after_id"]
    session = await services_of(client).sessions.get(sid)
    approval_id = ""
    async for batch in session.log.subscribe(after):  # the log, whichever store keeps the session
        requests = [entry.event for entry in batch if entry.event.type == "tool_approval_request"]
        if requests:
            approval_id = requests[0].approval_id
            break

    with stalled(own_postgres):
        status, body = await request(client, "GET", f"/sessions/{sid}")  # held in memory
        assert status == 200 and body["status"] == "waiting" and texts(body["messages"])[0] == "Hello"
        creates = await asyncio.gather(*(request(client, "POST", "/sessions", json={}) for _ in range(20)))
        assert {status for status, _ in creates} == {503}
        assert {body["code"] for _, body in creates} == {"database_unavailable"}
        assert all("database" in body["error"] for _, body in creates)
        status, health = await request(client, "GET", "/healthz")
        assert (status, health["status"], health["unavailable"]) == (503, "degraded", ["database"])
        assert health["database"] == {"kind": "postgresql", "connected": False}
        for method, path in (("GET", "/sessions"), ("GET", "/sessions/not-held-here")):
            status, body = await request(client, method, path)
            assert (status, body["code"]) == (503, "database_unavailable"), (method, path)

        async with answered_in_time(), client.ws_connect("/ws") as ws:
            await ws.send_json({"type": "message", "session_id": "not-held-here", "content": "Hi"})
            refused = await ws.receive_json()
            assert (refused["type"], refused["code"]) == ("error", "database_unavailable")
            await ws.send_json({"type": "ping"})
            assert (await ws.receive_json())["type"] == "pong"  # the socket stays open

        # The query ends: its stream gets `done` at once, the record waits for the database.
        status, _ = await request(
            client, "POST", f"/sessions/{sid}/approvals/{approval_id}", json={"approved": True}
        )
        assert status == 200
        async with (
            answered_in_time(),
            client.get(f"/sessions/{sid}/events", params={"last_event_id": str(after)}) as response,
        ):
            kinds = [event.get("event") async for event in sse_events(response)]
        assert kinds[-1] == "done"
        status, body = await request(client, "POST", f"/sessions/{sid}/messages", json={"content": "More"})
        assert (status, body["code"]) == (503, "database_unavailable")
    held = (await session_body(client, sid))["messages"]
    assert len(held) == 6  # Hello, its answer; the sum, the tool use, its result, the answer

    # Back: the end is recorded by the retries, and a service that starts afresh finds it all.
    records = services_of(client).sessions.records
    for _attempt in range(400):
        record = await records.load(sid)
        if record is not None and record.status == "idle":
            break
        await asyncio.sleep(0.05)
    assert record is not None and record.status == "idle" and record.messages == held
    async with client.get("/healthz") as response:
        assert response.status == 200
    again = await make_client(database_url=url)
    assert (await session_body(again, sid))["messages"] == held
    await ask(client, sid, "And now?")
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [
        r.getMessage() for r in caplog.records
    ]
