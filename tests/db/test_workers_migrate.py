"""``--workers N`` on a fresh data dir: the supervisor migrates the SQLite database once, before it
starts any worker, so the workers never race to create the tables."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from service.db import migrate
from tests.support.instances import ServiceFactory

WORKERS = 4  # more workers, more chances to race: each one used to migrate at its start


def migrated(line: str) -> bool:
    return "session database migrated from" in line


def running_upgrade(line: str) -> bool:
    return "Running upgrade" in line  # Alembic's line for each migration it applies


@pytest.mark.slow
async def test_workers_on_a_fresh_data_dir_migrate_once_before_they_start(
    service_process: ServiceFactory, redis_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    data = tmp_path / "data"  # does not exist yet
    env = {
        "AGENT_REDIS_URL": redis_url,
        "AGENT_REDIS_PREFIX": redis_prefix,
        "AGENT_DATA_DIR": str(data),
        "AGENT_DATABASE_URL": None,  # unset: SQLite under the data dir
        "AGENT_GC_TUNING": False,
    }
    service = await service_process(env, args=("--workers", str(WORKERS)), ready_timeout=90)
    lines = await service.alog_lines(migrated)
    assert lines and f"from empty to {migrate.head()}" in lines[0], service.output()
    # Every migration ran once, in the supervisor: none in a worker.
    upgrades = await service.alog_lines(running_upgrade, count=len(lines) + 100, timeout=0)
    assert len(upgrades) == int(migrate.head()), upgrades
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{service.base_url}/sessions", json={}) as response:
            assert response.status == 201, await response.text()
            sid = (await response.json())["id"]
        async with http.get(f"{service.base_url}/sessions") as response:
            assert [s["id"] for s in (await response.json())["sessions"]] == [sid]
    assert (data / "agentstream.db").exists()
