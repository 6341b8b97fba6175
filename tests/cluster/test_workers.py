"""``python -m service --workers N``: N processes on one port (SO_REUSEPORT), sessions on a real Redis.

The kernel hands each new connection to one worker, and a connection stays with the worker that
accepted it. So a test reaches a chosen worker by keeping one connection open to it (a client
session of one connection, checked never to open a second), found by opening connections until
``/healthz`` has named every worker: bounded by a count, not by time.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import aiohttp
import pytest

from service.config import SettingsError, load_settings
from service.workers import Restarts, worker_instance_id
from tests.conftest import sse_events
from tests.support.instances import REPO_ROOT, ServiceFactory, ServiceProcess

# With two workers the chance that this many connections all reach the same one is 2**-63.
MAX_CONNECTIONS = 64
SHUTDOWN_TIMEOUT_S = 10.0
LISTENING = re.compile(r"worker (\d+) \(pid (\d+), instance (\S*)\) is listening")


def workers_env(redis_url: str, prefix: str, **extra: Any) -> dict[str, Any]:
    return {
        "AGENT_REDIS_URL": redis_url,
        "AGENT_REDIS_PREFIX": prefix,
        "AGENT_INSTANCE_ID": "w",
        "AGENT_EMULATOR_TTFT_MS": 0,
        "AGENT_EMULATOR_TOKENS_PER_SECOND": 0,
        "AGENT_GC_TUNING": False,
        "AGENT_SHUTDOWN_TIMEOUT_S": SHUTDOWN_TIMEOUT_S,
        # Every event on its own frame, so what each reader got can be compared id by id.
        "AGENT_MERGE_DELTAS_AFTER": 1_000_000,
        **extra,
    }


async def start_workers(service_process: ServiceFactory, env: dict[str, Any]) -> ServiceProcess:
    return await service_process(env, args=("--workers", "2"), ready_timeout=90)


class Pinned:
    """A client that holds one connection to the port, so every request reaches one worker."""

    def __init__(self, http: aiohttp.ClientSession, opened: list[int], instance_id: str) -> None:
        self.http = http
        self.opened = opened
        self.instance_id = instance_id

    @asynccontextmanager
    async def request(self, method: str, path: str, **kwargs: Any) -> AsyncIterator[aiohttp.ClientResponse]:
        async with self.http.request(method, path, **kwargs) as response:
            # A second connection could have reached the other worker.
            assert self.opened == [1], "the pinned client opened another connection"
            yield response


async def pin_every_worker(base_url: str, count: int, stack: AsyncExitStack) -> dict[str, Pinned]:
    """A :class:`Pinned` client per worker, by instance id; each attempt is a new connection."""
    pinned: dict[str, Pinned] = {}
    for _attempt in range(MAX_CONNECTIONS):
        opened = [0]
        trace = aiohttp.TraceConfig()

        async def count_connection(*_: Any, opened: list[int] = opened) -> None:
            opened[0] += 1

        trace.on_connection_create_end.append(count_connection)
        http = aiohttp.ClientSession(base_url, connector=aiohttp.TCPConnector(limit=1), trace_configs=[trace])
        async with http.get("/healthz") as response:
            assert response.status == 200, await response.text()
            instance_id = (await response.json())["store"]["instance_id"]
        if instance_id in pinned:
            await http.close()
            continue
        pinned[instance_id] = Pinned(http, opened, instance_id)
        stack.push_async_callback(http.close)
        if len(pinned) == count:
            return pinned
    raise AssertionError(f"{MAX_CONNECTIONS} connections reached only {sorted(pinned)}")


async def create_session(client: Pinned) -> str:
    async with client.request("POST", "/sessions") as response:
        assert response.status == 201, await response.text()
        return (await response.json())["id"]


async def post_message(client: Pinned, session_id: str, text: str) -> None:
    async with client.request("POST", f"/sessions/{session_id}/messages", json={"content": text}) as response:
        assert response.status == 202, await response.text()


async def read_events(
    client: Pinned, session_id: str, started: asyncio.Event | None = None
) -> list[dict[str, Any]]:
    """The session's SSE events from the first until the stream ends; ``started`` is set at the
    first text."""
    events = []
    async with client.request(
        "GET", f"/sessions/{session_id}/events", headers={"Last-Event-ID": "0"}
    ) as response:
        assert response.status == 200, await response.text()
        async for event in sse_events(response):
            events.append(event)
            if started is not None and event["event"] == "assistant_text":
                started.set()
    return events


def worker_pids(service: ServiceProcess, count: int = 2) -> dict[int, int]:
    """Each worker's pid by index, from the supervisor's "is listening" lines (the newest wins)."""
    lines = service.log_lines(lambda line: LISTENING.search(line) is not None, count)
    return {int(m[1]): int(m[2]) for m in (LISTENING.search(line) for line in lines) if m}


async def test_a_query_through_one_worker_is_read_whole_through_the_other(
    service_process: ServiceFactory, redis_url: str, redis_prefix: str
) -> None:
    service = await start_workers(service_process, workers_env(redis_url, redis_prefix))
    async with AsyncExitStack() as stack:
        pinned = await pin_every_worker(service.base_url, 2, stack)
        assert sorted(pinned) == ["w-1", "w-2"]  # the configured id plus each worker's index
        a, b = pinned["w-1"], pinned["w-2"]
        session_id = await create_session(a)
        await post_message(a, session_id, "Tell me a story [emu:tokens=80] [emu:tps=200]")
        on_b, on_a = await asyncio.gather(read_events(b, session_id), read_events(a, session_id))
    ids = [int(event["id"]) for event in on_b]
    assert ids == list(range(1, len(on_b) + 1))  # nothing missing
    assert [event["data"] for event in on_b] == [event["data"] for event in on_a]
    assert sum(event["event"] == "assistant_text" for event in on_b) >= 40
    assert on_b[-1]["data"]["type"] == "done"


async def test_sigterm_to_the_supervisor_drains_every_worker_within_the_shutdown_timeout(
    service_process: ServiceFactory, redis_url: str, redis_prefix: str
) -> None:
    service = await start_workers(service_process, workers_env(redis_url, redis_prefix))
    pids = worker_pids(service)
    async with AsyncExitStack() as stack:
        pinned = await pin_every_worker(service.base_url, 2, stack)
        streams, started = [], []
        for client in pinned.values():
            session_id = await create_session(client)
            await post_message(client, session_id, "slow [emu:tokens=5000] [emu:tps=50]")
            started.append(asyncio.Event())
            streams.append(asyncio.create_task(read_events(client, session_id, started[-1])))
        await asyncio.gather(*(event.wait() for event in started))
        code = await service.aterminate(timeout=SHUTDOWN_TIMEOUT_S)  # SIGKILL past it: code -9
        ends = [events[-1]["data"] for events in await asyncio.gather(*streams)]
    assert code == 0, service.output()
    # Each worker ran its query and drained it as one process does.
    assert [(end["type"], end.get("code")) for end in ends] == [("error", "shutdown")] * 2
    assert len(pids) == 2
    for pid in pids.values():
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    stopped = service.log_lines(lambda line: "stopped with code 0" in line, 2, timeout=0)
    assert len(stopped) == 2, service.output()


async def test_a_worker_that_dies_is_started_again_under_a_new_instance_id(
    service_process: ServiceFactory, redis_url: str, redis_prefix: str
) -> None:
    service = await start_workers(service_process, workers_env(redis_url, redis_prefix))
    first = worker_pids(service)
    os.kill(first[1], signal.SIGKILL)
    again = await asyncio.to_thread(worker_pids, service, 3)
    assert again[2] == first[2]
    assert again[1] != first[1]
    assert service.log_lines(lambda line: "exited with code -9; restarting it in 0.5 s" in line, timeout=0)
    async with AsyncExitStack() as stack:
        pinned = await pin_every_worker(service.base_url, 2, stack)
        assert sorted(pinned) == ["w-1.1", "w-2"]
        session_id = await create_session(pinned["w-1.1"])
        await post_message(pinned["w-1.1"], session_id, "hello [emu:tokens=5]")
        events = await read_events(pinned["w-2"], session_id)
    assert events[-1]["data"]["type"] == "done"
    assert service.running


async def test_a_worker_that_cannot_listen_fails_the_start(redis_url: str, redis_prefix: str) -> None:
    with socket.socket() as taken:  # listening without SO_REUSEPORT: no worker may join it
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = await asyncio.to_thread(
            run_service, ["--port", str(port), "--workers", "2"], workers_env(redis_url, redis_prefix)
        )
    assert result.returncode == 1, result.stderr
    assert "before it listened; stopping" in result.stderr
    assert "address already in use" in result.stderr


def run_service(args: list[str], env: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, **{name: str(value) for name, value in env.items()}}
    return subprocess.run(
        [sys.executable, "-m", "service", *args],
        cwd=REPO_ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("how", ["flag", "setting"])
def test_several_workers_without_redis_refuse_to_start(how: str) -> None:
    env = {"AGENT_WORKERS": "2"} if how == "setting" else {}
    args = ["--workers", "2"] if how == "flag" else []
    environment = {name: value for name, value in os.environ.items() if name != "AGENT_REDIS_URL"}
    result = subprocess.run(
        [sys.executable, "-m", "service", "--port", "0", *args],
        cwd=REPO_ROOT,
        env={**environment, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "AGENT_WORKERS=2" in result.stderr and "AGENT_REDIS_URL" in result.stderr


def test_the_workers_setting_is_bounded_and_the_flag_overrides_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_REDIS_URL", "redis://127.0.0.1:6379/0")
    for bad in ("0", "257", "many"):
        monkeypatch.setenv("AGENT_WORKERS", bad)
        with pytest.raises(SettingsError, match="AGENT_WORKERS"):
            load_settings()
    monkeypatch.setenv("AGENT_WORKERS", "256")
    assert load_settings().workers == 256
    assert load_settings(workers=3).workers == 3
    with pytest.raises(SettingsError, match="AGENT_PORT=0"):
        load_settings(port=0)
    monkeypatch.delenv("AGENT_WORKERS")
    monkeypatch.delenv("AGENT_REDIS_URL")
    assert load_settings().workers == 1


def test_worker_instance_ids_derive_from_the_configured_one() -> None:
    assert worker_instance_id("web", 1, 0) == "web-1"
    assert worker_instance_id("web", 2, 3) == "web-2.3"
    assert worker_instance_id("", 2, 3) == ""  # the store makes a unique one in each process
    assert load_settings(instance_id=worker_instance_id("web", 2, 3)).instance_id == "web-2.3"


def test_restarts_back_off_and_give_up_after_repeated_deaths_at_start() -> None:
    restarts = Restarts(base_s=0.5, max_s=4.0, fast_s=30.0, max_fast=5)
    assert [restarts.after_death(1.0) for _ in range(5)] == [0.5, 1.0, 2.0, 4.0, 4.0]
    assert restarts.after_death(1.0) is None
    served = Restarts(base_s=0.5, max_s=4.0, fast_s=30.0, max_fast=5)
    for _ in range(5):
        served.after_death(1.0)
    # A worker that served a while before it died starts the count again.
    assert served.after_death(600.0) == 0.5
    assert served.after_death(1.0) == 0.5
