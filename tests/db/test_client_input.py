"""What a client chooses or sends, stored alike on SQLite and PostgreSQL: session ids up to the
128 characters /api/chat and /ag-ui allow, refused past them."""

from __future__ import annotations

from typing import Any

from tests.conftest import ClientFactory
from tests.db.helpers import session_body
from tests.transports.test_protocols import agui_body, chat_body

LONGEST = "x" * 128


async def post_drained(client: Any, path: str, body: Any) -> int:
    async with client.post(path, json=body) as response:
        await response.read()
        return int(response.status)


async def test_client_ids_of_65_to_128_characters_are_kept_and_longer_ones_refused(
    make_client: ClientFactory, database_url: str
) -> None:
    client = await make_client(database_url=database_url)
    chat_id, thread_id = "c" * 65, "t" * 128
    assert await post_drained(client, "/api/chat", chat_body(chat_id, "Hello")) == 200
    assert await post_drained(client, "/ag-ui", agui_body(thread_id, "Hello")) == 200
    assert await post_drained(client, "/api/chat", chat_body(LONGEST + "x", "Hello")) == 422
    assert await post_drained(client, "/ag-ui", agui_body(LONGEST + "x", "Hello")) == 422
    async with client.get(f"/sessions/{LONGEST}x") as response:
        assert response.status == 404

    again = await make_client(database_url=database_url)  # from the record alone
    for sid in (chat_id, thread_id):
        body = await session_body(again, sid)
        assert body["title"] == "Hello" and len(body["messages"]) == 2
    listed = await (await again.get("/sessions")).json()
    assert {s["id"] for s in listed["sessions"]} == {chat_id, thread_id}
