"""Shared fixtures: the service on a real port, talking to the emulator over real HTTP via boto3."""

from __future__ import annotations

import asyncio
import atexit
import json
import logging
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import aiohttp
import aiohttp.web_app
import pytest
from aiohttp.test_utils import TestClient

from service.agent.tools import FunctionTool, Tool
from service.app import SERVICES, create_app
from service.config import Settings

pytest_plugins = ["tests.support.fixtures"]

# No test writes a database unless it asks for one (tests/db gives each its own): every Settings
# the tests build, here or in a service process they start, keeps sessions in memory/Redis only,
# and the suite leaves no ./data behind.
os.environ["AGENT_DATABASE_URL"] = ""

# With AGENT_TEST_REDIS_URL set, every service the tests start keeps its sessions on that Redis
# ("auto": the local one on 6379, or a redis-server started for the run).
SUITE_REDIS_URL = os.environ.get("AGENT_TEST_REDIS_URL", "")
if SUITE_REDIS_URL == "auto":
    from tests.support.redis_server import redis_url_for_tests, stop_session_redis

    SUITE_REDIS_URL = redis_url_for_tests()
    atexit.register(stop_session_redis)
_SUITE_PREFIXES: list[str] = []
# The tests of several processes and of the test support choose their own stores.
collect_ignore = ["cluster", "support"] if SUITE_REDIS_URL else []


@atexit.register
def _forget_suite_keys() -> None:
    """Take the keys the suite's services left on a shared Redis away again."""
    if SUITE_REDIS_URL and _SUITE_PREFIXES:
        from tests.support.redis_server import delete_prefix, reachable

        if reachable(SUITE_REDIS_URL):
            for prefix in _SUITE_PREFIXES:
                delete_prefix(SUITE_REDIS_URL, prefix)


# --- the test tiers ----------------------------------------------------------------------------
# Every test is ``unit`` or ``service``: a service test starts an HTTP server (the service, the
# emulator) or a process of the service, through one of SERVER_FIXTURES or a ServiceProcess, or is
# in tests/browser or tests/cluster, or is marked so by hand. ``browser`` and ``cluster`` come from
# the folder, ``node`` from a module that runs the npm clients (tests/support/node.py). ``slow`` is
# marked in the test files, after a ``--durations=0`` run, and set here on the tests that take the
# run's PostgreSQL (tests/db is not marked by hand). ``fast`` is what is left once the slow,
# browser, node and cluster tests are taken away: ``python -m pytest -m fast`` is the developer's
# tier. Without ``-m`` everything runs.
TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
SERVER_FIXTURES = frozenset(
    {
        "make_client",
        "client",
        "aiohttp_client",
        "aiohttp_server",
        "aiohttp_raw_server",
        "service_process",
        "emulator",
        "emulator_server",
    }
)
FOLDER_MARKERS = {"browser": "browser", "cluster": "cluster"}
NOT_FAST = ("slow", "browser", "node", "cluster")


def _uses(module: Any, support: str) -> bool:
    """True when the test's module holds something of ``support`` (a module of tests/support)."""
    return module is not None and any(
        getattr(value, "__module__", None) == support for value in vars(module).values()
    )


def _on_postgres(item: pytest.Item) -> bool:
    """True when the test takes the run's PostgreSQL (``postgres``, or ``database_url``'s second parameter)."""
    callspec = getattr(item, "callspec", None)
    on_param = callspec is not None and callspec.params.get("database_url") == "postgresql"
    return on_param or "postgres" in getattr(item, "fixturenames", ())


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by these marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        folder = os.path.relpath(str(item.path), TESTS_DIR).split(os.sep)[0]
        if folder in FOLDER_MARKERS:
            item.add_marker(FOLDER_MARKERS[folder])
        module = getattr(item, "module", None)
        if _uses(module, "tests.support.node"):
            item.add_marker("node")
        if not (item.get_closest_marker("unit") or item.get_closest_marker("service")):
            servers = (
                folder in FOLDER_MARKERS
                or _uses(module, "tests.support.instances")  # ServiceProcess: python -m service
                or SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ()))
            )
            item.add_marker("service" if servers else "unit")
        if _on_postgres(item):
            item.add_marker("slow")  # the run's PostgreSQL: initdb and a server start first
        if not any(item.get_closest_marker(name) for name in NOT_FAST):
            item.add_marker("fast")


TEST_SETTINGS: dict[str, Any] = {
    "provider": "emulator",
    "emulator_ttft_ms": 0,
    "emulator_tokens_per_second": 0,
    "bedrock_max_attempts": 2,
    "throttle_backoff_s": 0.01,
    "tool_timeout_s": 0.3,
    # Every request of a test is one anonymous owner: the per-key quotas stay off unless a test
    # asks for them (tests/transports/test_quotas.py).
    "quota_streams": 0,
    "quota_runs": 0,
    "quota_requests_per_minute": 0,
    "quota_tokens_per_day": 0,
    "database_url": "",
}


def _explode(_: dict[str, Any]) -> str:
    raise RuntimeError("the tool blew up")


async def _never(_: dict[str, Any]) -> str:
    await asyncio.Event().wait()
    return "unreachable"


def test_tools() -> list[Tool]:
    """Tools a test may ask the emulator to call besides the calculator."""
    schema = {"type": "object", "properties": {}}
    return [
        FunctionTool("explode", "Always fails.", schema, _explode),
        FunctionTool("sleepy", "Never answers.", schema, _never),
    ]


test_tools.__test__ = False  # type: ignore[attr-defined]

ClientFactory = Callable[..., Awaitable[TestClient]]

# Every route that names a session, as (method, path after /sessions/{id}).
SESSION_ROUTES = [
    ("GET", ""),
    ("DELETE", ""),
    ("POST", "/messages"),
    ("POST", "/cancel"),
    ("GET", "/events"),
    ("GET", "/events/poll"),
    ("GET", "/stream?query=x"),
]


@pytest.fixture(autouse=True)
def _forget_built_middlewares() -> Iterator[None]:
    """Let each test's applications go once it is over.

    aiohttp keeps the middleware chain it builds for a handler and its applications in a
    process-wide cache of 1,024 entries (``aiohttp.web_app._cached_build_middleware``), made for a
    server whose application lives as long as the process. Here almost every test makes a service
    of its own, and each entry kept it whole (its botocore session's models, its emulator, its
    logs): the suite's process grew to 3.8 GB and spent minutes in its last garbage collection at
    exit. The cache is private to aiohttp, hence the ``getattr``.
    """
    yield
    cache = getattr(aiohttp.web_app, "_cached_build_middleware", None)
    if cache is not None:
        cache.cache_clear()


class _Tracebacks(logging.Handler):
    """Keeps the records that carry a traceback, from the service and from aiohttp's server."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if (
            record.exc_info
            and record.exc_info[0] is not None
            and record.name.startswith(("service", "aiohttp"))
        ):
            self.records.append(record)


@pytest.fixture(autouse=True)
def _no_traceback_in_the_service_log(request: pytest.FixtureRequest) -> Iterator[None]:
    """A traceback in the service's log is a fault of the service (a client's mistake, a
    dependency down, a client gone are answered and logged on one line): every test fails on
    one, unless it is marked ``traceback_expected`` because it provokes such a fault."""
    handler = _Tracebacks()
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
    if handler.records and request.node.get_closest_marker("traceback_expected") is None:
        first = handler.records[0]
        pytest.fail(
            f"{len(handler.records)} traceback(s) in the service log, the first from {first.name}: "
            f"{first.getMessage()}\n{logging.Formatter().formatException(first.exc_info)}",  # type: ignore[arg-type]
            pytrace=False,
        )


@pytest.fixture
async def make_client(aiohttp_client: Any) -> ClientFactory:
    """Start the service (embedded emulator) with settings overrides; returns its test client."""

    async def make(**overrides: Any) -> TestClient:
        shared = {}
        if SUITE_REDIS_URL:
            # The whole suite on Redis: each service gets keys of its own under a fresh prefix.
            shared = {"redis_url": SUITE_REDIS_URL, "redis_prefix": f"t{uuid.uuid4().hex[:12]}"}
            _SUITE_PREFIXES.append(shared["redis_prefix"])
        settings = Settings(**{**TEST_SETTINGS, **shared, **overrides})
        return await aiohttp_client(create_app(settings, tools=test_tools()))

    return make


@pytest.fixture
async def client(make_client: ClientFactory) -> TestClient:
    """The service with the default test settings."""
    return await make_client()


def services_of(client: TestClient) -> Any:
    """The app's services (sessions, runs, provider, emulator)."""
    return client.server.app[SERVICES]


async def sse_blocks(response: aiohttp.ClientResponse) -> AsyncIterator[dict[str, str]]:
    """Parse an SSE body into its events' fields ({"id", "event", "retry", "data"} as text); an
    event without a ``data`` line (a bare ``retry:`` or id) is skipped, comments too."""
    fields: dict[str, str] = {}
    data: list[str] = []
    async for raw in response.content:
        line = raw.decode("utf-8").rstrip("\r\n")
        if not line:
            if data:
                yield {**fields, "data": "\n".join(data)}
            fields, data = {}, []
        elif line.startswith(":"):
            continue
        else:
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "data":
                data.append(value)
            else:
                fields[name] = value


def _not_json(constant: str) -> Any:
    raise ValueError(f"the service wrote {constant}, which is not JSON")


async def sse_events(response: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
    """Parse an SSE body into events: {"data": parsed JSON, "event": name, "id": id}. Read as
    strictly as a browser reads it: a ``NaN`` or ``Infinity`` the service writes fails the test."""
    async for block in sse_blocks(response):
        yield {**block, "data": json.loads(block["data"], parse_constant=_not_json)}


async def stream_agent(client: TestClient, message: str, **body: Any) -> list[dict[str, Any]]:
    """POST /agent/stream and return every data payload."""
    async with client.post("/agent/stream", json={"message": message, **body}) as response:
        assert response.status == 200, await response.text()
        return [event["data"] async for event in sse_events(response)]
