"""GET /selftest/stream: timestamped ticks that let a client judge the path to the service."""

from __future__ import annotations

import time

import pytest
from aiohttp.test_utils import TestClient

from tests.conftest import sse_events


async def test_ticks_come_on_schedule_with_ids_and_an_end(client: TestClient) -> None:
    async with client.get("/selftest/stream?ticks=5&interval_ms=20&idle_ms=30") as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        assert "Content-Encoding" not in response.headers
        events = []
        async for event in sse_events(response):
            events.append((event, time.time()))
    ticks = [event for event, _ in events if event["event"] == "tick"]
    assert [t["id"] for t in ticks] == ["1", "2", "3", "4", "5"]
    assert [t["data"]["n"] for t in ticks] == [1, 2, 3, 4, 5]
    stamps = [t["data"]["ts"] for t in ticks]
    gaps = [later - earlier for earlier, later in zip(stamps, stamps[1:], strict=False)]
    assert all(gap >= 0.015 for gap in gaps[:-1]), gaps
    assert gaps[-1] >= 0.045, gaps  # the idle pause before the last tick
    assert ticks[-1]["data"]["idle_ms"] == 30
    assert events[-1][0]["event"] == "end" and events[-1][0]["data"] == {"type": "end", "ticks": 5}
    # Nothing on the way buffered: each tick arrived after it was written, soon after.
    for event, arrived in events[:-1]:
        assert 0 <= arrived - event["data"]["ts"] < 5


@pytest.mark.slow
async def test_bad_parameters_are_400(client: TestClient) -> None:
    for query in ("ticks=0", "ticks=x", "ticks=100000", "interval_ms=-1", "interval_ms=999999999"):
        async with client.get(f"/selftest/stream?{query}") as response:
            assert response.status == 400, query
            assert "error" in await response.json()
