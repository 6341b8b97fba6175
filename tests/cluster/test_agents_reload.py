"""``AGENT_AGENTS_FILE`` reloaded on SIGHUP by a real ``python -m service --workers 2``: the
supervisor hands the signal to every worker, and each one serves the new agents; a file that does
not validate is refused with an ERROR line, and every worker keeps the agents it had."""

from __future__ import annotations

import os
import signal
from contextlib import AsyncExitStack
from pathlib import Path

from tests.cluster.test_workers import Pinned, pin_every_worker, start_workers, workers_env
from tests.support.instances import ServiceFactory

FIRST = """
[agents.support]
description = "Answers questions about orders."
system_prompt = "You help with orders."

[agents.research]
tools = []
"""
SECOND = (
    FIRST
    + """
[agents.triage]
description = "Sorts tickets."
"""
)
# Every reload is asked of both workers; a worker that has not reloaded yet still lists the old
# agents, so each is asked until it says the new ones, a bounded number of times.
ATTEMPTS = 200


async def agents_of(client: Pinned) -> list[str]:
    async with client.request("GET", "/agents") as response:
        assert response.status == 200, await response.text()
        return [agent["name"] for agent in (await response.json())["agents"]]


async def until_agents(client: Pinned, wanted: list[str]) -> None:
    seen: list[str] = []
    for _ in range(ATTEMPTS):
        seen = await agents_of(client)
        if seen == wanted:
            return
    raise AssertionError(f"{client.instance_id} still lists {seen}, not {wanted}")


async def test_sighup_reloads_the_agents_in_every_worker(
    service_process: ServiceFactory, redis_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    path = tmp_path / "agents.toml"
    path.write_text(FIRST)
    service = await start_workers(
        service_process, workers_env(redis_url, redis_prefix, AGENT_AGENTS_FILE=str(path))
    )
    async with AsyncExitStack() as stack:
        pinned = await pin_every_worker(service.base_url, 2, stack)
        for client in pinned.values():
            assert await agents_of(client) == ["support", "research"]
        path.write_text(SECOND)
        assert service.process is not None
        os.kill(service.process.pid, signal.SIGHUP)
        for client in pinned.values():
            await until_agents(client, ["support", "research", "triage"])
        # A file that does not validate: refused, logged at ERROR by each worker, nothing changes.
        path.write_text(SECOND + "\n[agents.broken]\ntools = ['no_such_tool']\n")
        os.kill(service.process.pid, signal.SIGHUP)
        refusals = await service.alog_lines(
            lambda line: "was not reloaded" in line and "no_such_tool" in line, 2
        )
        assert len(refusals) == 2 and all("ERROR" in line for line in refusals)
        for client in pinned.values():
            assert await agents_of(client) == ["support", "research", "triage"]
        assert service.running
