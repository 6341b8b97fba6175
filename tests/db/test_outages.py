"""The session database down or stalled: every request answers within a few seconds (a 503 that
names the database, or what memory holds), ``/healthz`` says which part is down, and nothing a
query completed is lost once the database is back.

These run on a PostgreSQL of their own, which they stop (SIGTERM) or stall (SIGSTOP on the
postmaster and its children) without touching the suite's shared one.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import ClientFactory
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
