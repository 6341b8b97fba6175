"""Sessions for tests that talk to one service through its test client."""

from __future__ import annotations

from aiohttp.test_utils import TestClient


async def new_session(client: TestClient, headers: dict[str, str] | None = None) -> str:
    """``POST /sessions`` (with ``headers``, if any): the new, idle session's id."""
    async with client.post("/sessions", json={}, headers=headers) as response:
        assert response.status == 201, await response.text()
        body = await response.json()
    assert body["status"] == "idle"
    return body["id"]
