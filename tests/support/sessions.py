"""Sessions for tests that talk to one service through its test client."""

from __future__ import annotations

from aiohttp.test_utils import TestClient

from tests.conftest import services_of


async def new_session(client: TestClient, headers: dict[str, str] | None = None) -> str:
    """``POST /sessions`` (with ``headers``, if any): the new, idle session's id."""
    async with client.post("/sessions", json={}, headers=headers) as response:
        assert response.status == 201, await response.text()
        body = await response.json()
    assert body["status"] == "idle"
    return body["id"]


async def cancel_mid_answer(client: TestClient) -> str:
    """A query on a new session, cancelled once its answer is streaming; the session's id."""
    session_id = await new_session(client)
    async with client.post(
        f"/sessions/{session_id}/messages", json={"content": "Talk slowly [emu:tokens=2000] [emu:tps=100]"}
    ) as response:
        assert response.status == 202, await response.text()
    session = await services_of(client).sessions.get(session_id)
    async for batch in session.log.subscribe(0):
        if any(entry.event.type == "text_delta" for entry in batch):
            break
    async with client.post(f"/sessions/{session_id}/cancel") as cancel:
        assert (await cancel.json())["cancelled"] is True
    return session_id
