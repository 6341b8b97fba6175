"""The test support works: a private redis-server keeps its data across restart and kill (or, on
request, nothing), pauses and resumes, the shared Redis is cleaned per prefix, and the service
runs in its own processes."""

from __future__ import annotations

import aiohttp
import pytest
import redis

from tests.support import redis_server
from tests.support._pipes import ProcessStartError, free_port
from tests.support.instances import ServiceFactory, ServiceProcess
from tests.support.redis_server import (
    RedisServer,
    delete_prefix,
    reachable,
    redis_url_for_tests,
    require_redis_server,
    stop_session_redis,
)

MEMORY_MODE = {"AGENT_REDIS_URL": None, "AGENT_EMULATOR_TTFT_MS": 0, "AGENT_EMULATOR_TOKENS_PER_SECOND": 0}


def test_restart_keeps_the_data(own_redis: RedisServer) -> None:
    url, port = own_redis.url, own_redis.port
    with own_redis.client() as client:
        client.set("k", "v")
    own_redis.restart()
    assert (own_redis.url, own_redis.port) == (url, port)
    with own_redis.client() as client:
        assert client.get("k") == "v"


def test_kill_ends_the_server_and_the_aof_survives_it(own_redis: RedisServer) -> None:
    with own_redis.client() as client:
        client.set("k", "written before the crash")
    own_redis.kill()
    assert not own_redis.running
    assert own_redis.process is not None and own_redis.process.returncode == -9
    assert not reachable(own_redis.url)
    own_redis.start()
    with own_redis.client() as client:
        assert client.get("k") == "written before the crash"


def test_a_paused_server_answers_nothing_until_resumed_and_a_volatile_one_restarts_empty() -> None:
    require_redis_server()
    with RedisServer(persistent=False) as server, server.client(socket_timeout=0.3) as client:
        client.set("k", "v")
        server.pause()
        try:
            assert server.running
            assert not reachable(server.url, timeout=0.3)
        finally:
            server.resume()
        assert client.get("k") == "v"
        server.pause()  # stopping a paused server does not wait for it to be resumed
        server.restart()
        assert client.get("k") is None


def test_a_closed_server_leaves_nothing_behind() -> None:
    require_redis_server()
    with RedisServer() as server:
        assert reachable(server.url)
        directory = server.dir
        assert directory.is_dir()
    assert not reachable(server.url)
    assert not directory.exists()


def test_without_the_shared_redis_one_is_started_for_the_run() -> None:
    require_redis_server()
    down = f"redis://127.0.0.1:{free_port()}/0"
    started_here = redis_server._session_server is None  # else the redis_url fixture's, left running
    url = redis_url_for_tests(down)
    try:
        assert url != down
        assert reachable(url)
        assert redis_url_for_tests(down) == url  # one for the whole run
    finally:
        if started_here:
            stop_session_redis()
    if started_here:
        assert not reachable(url)


def test_delete_prefix_takes_only_that_prefix(redis_url: str, redis_prefix: str) -> None:
    other = f"{redis_prefix}-other"  # a second prefix of this test's own, so nothing else is touched
    with redis.Redis.from_url(redis_url, decode_responses=True) as client:
        client.set(f"{redis_prefix}:a", 1)
        client.set(f"{redis_prefix}:b", 2)
        client.set(f"x{other}", 3)
        assert delete_prefix(redis_url, f"{redis_prefix}:") == 2
        assert client.get(f"x{other}") == "3"
        assert delete_prefix(redis_url, f"x{other}") == 1
        assert client.exists(f"{redis_prefix}:a", f"{redis_prefix}:b", f"x{other}") == 0


@pytest.mark.slow
async def test_a_service_process_serves_until_killed(service_process: ServiceFactory) -> None:
    service = await service_process(MEMORY_MODE)
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{service.base_url}/healthz") as response:
            assert response.status == 200
            assert (await response.json())["status"] == "ok"
        assert await service.akill() == -9
        with pytest.raises(aiohttp.ClientConnectionError):
            async with http.get(f"{service.base_url}/healthz"):
                pass


@pytest.mark.slow
async def test_two_instances_and_a_graceful_restart_on_the_same_port() -> None:
    async with ServiceProcess(MEMORY_MODE) as first, ServiceProcess(MEMORY_MODE) as second:
        assert first.base_url != second.base_url
        async with aiohttp.ClientSession() as http:
            for service in (first, second):
                async with http.get(f"{service.base_url}/healthz") as response:
                    assert response.status == 200
            base_url = first.base_url
            assert await first.aterminate() == 0
            await first.astart()
            assert first.base_url == base_url
            async with http.get(f"{first.base_url}/healthz") as response:
                assert response.status == 200
    assert not first.running and not second.running


async def test_a_service_that_cannot_start_reports_why() -> None:
    service = ServiceProcess({**MEMORY_MODE, "AGENT_EMULATOR_TTFT_MS": "not-a-number"})
    with pytest.raises(ProcessStartError, match="AGENT_EMULATOR_TTFT_MS"):
        await service.astart()
    assert service.returncode == 2
