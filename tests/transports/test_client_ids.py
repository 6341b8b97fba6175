"""Ids a client chooses (an AI SDK chat id, an AG-UI thread id) are per owner.

Another key can neither learn that an id is held (it answers as a free id would) nor take an id
before its owner uses it (the owner still gets a session of its own under that id).
"""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from service.core.sessions import scoped_id, valid_client_id
from tests.conftest import ClientFactory, sse_blocks

A = {"Authorization": "Bearer key-a"}
B = {"Authorization": "Bearer key-b"}


@pytest.fixture
async def keyed(make_client: ClientFactory) -> TestClient:
    return await make_client(api_keys=["key-a", "key-b"])


async def chat(client: TestClient, chat_id: str, text: str, who: dict[str, str]) -> tuple[int, list[str]]:
    body = {
        "id": chat_id,
        "trigger": "submit-message",
        "messages": [{"id": f"u-{text}", "role": "user", "parts": [{"type": "text", "text": text}]}],
    }
    async with client.post("/api/chat", json=body, headers=who) as response:
        if response.status != 200:
            return response.status, [await response.text()]
        return 200, [block["data"] async for block in sse_blocks(response)]


async def thread(client: TestClient, thread_id: str, text: str, who: dict[str, str]) -> int:
    body: dict[str, Any] = {
        "threadId": thread_id,
        "runId": f"r-{text}",
        "messages": [{"id": f"u-{text}", "role": "user", "content": text}],
        "tools": [],
        "context": [],
        "state": {},
        "forwardedProps": {},
    }
    async with client.post("/ag-ui", json=body, headers=who) as response:
        blocks = [block["data"] async for block in sse_blocks(response)] if response.status == 200 else []
        if blocks:
            assert '"threadId":"' + thread_id + '"' in blocks[0].replace(" ", "")
        return response.status


async def texts(client: TestClient, session_id: str, who: dict[str, str]) -> list[str]:
    async with client.get(f"/sessions/{session_id}", headers=who) as response:
        assert response.status == 200, await response.text()
        body = await response.json()
    return [
        block["text"]
        for message in body["messages"]
        if message["role"] == "user"
        for block in message["content"]
        if "text" in block
    ]


async def test_an_id_another_key_holds_answers_as_a_free_one(keyed: TestClient) -> None:
    status, _ = await chat(keyed, "thread-1", "from a [emu:tokens=2]", A)
    assert status == 200
    held, held_parts = await chat(keyed, "thread-1", "from b [emu:tokens=2]", B)
    free, free_parts = await chat(keyed, "free-1", "from b [emu:tokens=2]", B)
    assert held == free == 200
    assert held_parts[-1] == free_parts[-1] == "[DONE]"
    # Each key sees its own conversation under the one id, and nothing of the other's.
    assert await texts(keyed, "thread-1", A) == ["from a [emu:tokens=2]"]
    assert await texts(keyed, "thread-1", B) == ["from b [emu:tokens=2]"]
    assert await thread(keyed, "thread-1", "b again [emu:tokens=2]", B) == 200
    assert await texts(keyed, "thread-1", B) == ["from b [emu:tokens=2]", "b again [emu:tokens=2]"]
    assert await texts(keyed, "thread-1", A) == ["from a [emu:tokens=2]"]


async def test_an_id_taken_first_by_another_key_is_still_its_owners(keyed: TestClient) -> None:
    assert await thread(keyed, "shared-name", "squatter [emu:tokens=2]", B) == 200
    assert await thread(keyed, "shared-name", "owner [emu:tokens=2]", A) == 200
    status, _ = await chat(keyed, "shared-name", "owner again [emu:tokens=2]", A)
    assert status == 200
    assert await texts(keyed, "shared-name", A) == ["owner [emu:tokens=2]", "owner again [emu:tokens=2]"]
    assert await texts(keyed, "shared-name", B) == ["squatter [emu:tokens=2]"]
    # Every route that names a session takes the id its owner chose.
    async with keyed.get("/sessions/shared-name/events/poll?since_index=0", headers=A) as response:
        assert response.status == 200
        events = (await response.json())["events"]
    assert events[-1]["type"] == "done"
    async with keyed.delete("/sessions/shared-name", headers=A) as response:
        assert response.status == 204
    assert await texts(keyed, "shared-name", B) == ["squatter [emu:tokens=2]"]
    async with keyed.get("/sessions/shared-name", headers=A) as response:
        assert response.status == 404


def test_scoped_ids_fit_and_cannot_be_chosen() -> None:
    for client_id in ("t", "x" * 128):
        for owner in ("a" * 24, "b" * 24):
            scoped = scoped_id(client_id, owner)
            assert len(scoped) <= 128 and not valid_client_id(scoped)
    assert scoped_id("x" * 128, "a") != scoped_id("x" * 127 + "y", "a")
    assert scoped_id("t", "a") != scoped_id("t", "b")
