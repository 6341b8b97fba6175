"""What the database tests share: asking a question and waiting for its end."""

from __future__ import annotations

from typing import Any

from aiohttp.test_utils import TestClient

from tests.conftest import services_of


async def new_session(client: TestClient, headers: dict[str, str] | None = None) -> str:
    async with client.post("/sessions", json={}, headers=headers) as response:
        assert response.status == 201, await response.text()
        return str((await response.json())["id"])


async def ask(client: TestClient, session_id: str, text: str, headers: dict[str, str] | None = None) -> None:
    """Send ``text`` and wait until the query has ended (its record written)."""
    async with client.post(
        f"/sessions/{session_id}/messages", json={"content": text}, headers=headers
    ) as response:
        assert response.status == 202, await response.text()
    run = services_of(client).runs.get(session_id)
    if run is not None:
        await run.wait()


async def session_body(client: TestClient, session_id: str, headers: dict[str, str] | None = None) -> Any:
    async with client.get(f"/sessions/{session_id}", headers=headers) as response:
        assert response.status == 200, await response.text()
        return await response.json()


async def events_after(client: TestClient, session_id: str, since: int) -> Any:
    async with client.get(f"/sessions/{session_id}/events/poll", params={"since_index": since}) as response:
        assert response.status == 200, await response.text()
        return await response.json()


def texts(messages: list[dict[str, Any]]) -> list[str]:
    """The text blocks of the messages, in order."""
    return [block["text"] for message in messages for block in message["content"] if "text" in block]
