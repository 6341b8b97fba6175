"""Fixtures for tests against a real Redis and service processes.

Load with ``pytest_plugins = ["tests.support.fixtures"]`` (in the top conftest or a test module).

- ``redis_url`` (session): the Redis on 127.0.0.1:6379 when it answers, else one redis-server
  started for the run. Without either: a failure when ``CI=true``, a skip elsewhere.
- ``postgres`` (session): a PostgreSQL server started for the run; ``database_url``: a fresh
  database for one test, on SQLite and (a second parameter) on that PostgreSQL.
- ``own_redis``: a private :class:`RedisServer` for one test, to restart or kill at will.
- ``redis_prefix``: a unique key prefix for one test; its keys are deleted from ``redis_url``
  afterwards.
- ``service_process``: ``await service_process(env)`` starts ``python -m service`` and returns
  the :class:`ServiceProcess` once it listens; every one still running is terminated afterwards.
- ``pools``: ``pools(WorkerPool(...))`` or ``pools(Calculator(...))`` returns its argument and
  closes it after the test, so no worker process outlives the test.
- ``emulator`` (module): one :class:`EmbeddedEmulator` (a thread of its own on a real port) shared
  by a module's tests; tell their requests apart by their text.
- ``emulator_server``: the standalone emulator app, unpaced, on a real port of the test's loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any
from uuid import uuid4

import pytest
from aiohttp.test_utils import TestServer

from service.emulator import EmbeddedEmulator, EmulatorConfig, create_emulator_app
from service.sandbox import WorkerPool
from tests.support._pipes import ProcessStartError
from tests.support.instances import EnvValue, ServiceFactory, ServiceProcess
from tests.support.postgres_server import PostgresServer, PostgresUnavailable, postgres_unavailable
from tests.support.redis_server import (
    RedisServer,
    RedisUnavailable,
    delete_prefix,
    redis_unavailable,
    redis_url_for_tests,
    require_redis_server,
    stop_session_redis,
)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A Redis URL shared by the whole run (see :func:`redis_url_for_tests`)."""
    try:
        url = redis_url_for_tests()
    except RedisUnavailable as error:
        redis_unavailable(str(error))
    yield url
    stop_session_redis()


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """One PostgreSQL started for the run (Debian's binaries, a temp dir, a free port); each test
    takes a database of its own from it. Without the binaries: a failure when ``CI=true``, a skip
    elsewhere."""
    try:
        server = PostgresServer().start()
    except (PostgresUnavailable, ProcessStartError) as error:
        postgres_unavailable(str(error))
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    """A fresh, empty database for one test: a SQLite file in its temp dir, or a database of its
    own on the run's PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'agentstream.db'}"
    return request.getfixturevalue("postgres").create_database()


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A redis-server of this test's own (free port, temp dir, AOF fsynced always), removed afterwards."""
    require_redis_server()
    with RedisServer() as server:
        yield server


@pytest.fixture
def redis_prefix(redis_url: str) -> Iterator[str]:
    """A key prefix no other test uses; the keys under it are UNLINKed from ``redis_url`` afterwards."""
    prefix = f"t{uuid4().hex[:12]}"
    yield prefix
    delete_prefix(redis_url, prefix)


@pytest.fixture
async def service_process() -> AsyncIterator[ServiceFactory]:
    """``await service_process(env=None, *, port=None, args=(), ready_timeout=30)``: a started ServiceProcess."""
    started: list[ServiceProcess] = []

    async def start(env: Mapping[str, EnvValue] | None = None, **options: Any) -> ServiceProcess:
        process = ServiceProcess(env, **options)
        started.append(process)
        return await process.astart()

    yield start
    await asyncio.gather(*(process.aterminate() for process in started))


@pytest.fixture
async def pools() -> Any:
    """Make pools and calculators that are closed after the test, so no worker outlives it."""
    made: list[Any] = []

    def track(thing: Any) -> Any:
        made.append(thing)
        return thing

    yield track
    for thing in made:
        await (thing.close() if isinstance(thing, WorkerPool) else thing.aclose())


@pytest.fixture(scope="module")
def emulator() -> Iterator[EmbeddedEmulator]:
    """One embedded emulator shared by the module's tests (each tells its requests apart by text)."""
    with EmbeddedEmulator() as emu:
        yield emu


@pytest.fixture
async def emulator_server(aiohttp_server: Any) -> TestServer:
    """The standalone emulator app, unpaced, on a real port."""
    return await aiohttp_server(create_emulator_app(EmulatorConfig()))
