"""A rewound conversation (a regenerate, an edit) is what the database keeps, on SQLite and
PostgreSQL: a second service on the same database serves the cut conversation, its ids and its
usage, and the next edit works from there."""

from __future__ import annotations

from typing import Any

from aiohttp.test_utils import TestClient

from tests.conftest import ClientFactory, services_of
from tests.db.helpers import new_session, session_body


async def act(client: TestClient, session_id: str, body: dict[str, Any]) -> None:
    async with client.post(f"/sessions/{session_id}/messages", json=body) as response:
        assert response.status == 202, await response.text()
    run = services_of(client).runs.get(session_id)
    if run is not None:
        await run.wait()


async def test_a_rewound_conversation_is_kept_in_the_database(
    make_client: ClientFactory, database_url: str
) -> None:
    first = await make_client(database_url=database_url)
    sid = await new_session(first)
    await act(first, sid, {"content": "Name a fruit", "id": "q1"})
    await act(first, sid, {"content": "Name a city", "id": "q2"})
    before = await session_body(first, sid)
    await act(first, sid, {"content": "Name a river", "edit": "q2"})
    await act(first, sid, {"regenerate": True})
    cut = await session_body(first, sid)
    assert [m["id"] for m in cut["messages"]][:3] == ["q1", before["messages"][1]["id"], "q2"]
    assert len(cut["messages"]) == 4
    assert cut["messages"][2]["content"] == [{"text": "Name a river"}]
    # Two answers were cut away: the session's usage is that of the two answers kept.
    kept = [m["usage"] for m in cut["messages"] if m["role"] == "assistant"]
    assert len(kept) == 2
    for name in ("input_tokens", "output_tokens", "total_tokens"):
        assert cut["usage"][name] == sum(usage[name] for usage in kept) > 0

    again = await make_client(database_url=database_url)
    after = await session_body(again, sid)
    assert after["messages"] == cut["messages"]
    assert after["usage"] == cut["usage"]
    await act(again, sid, {"content": "Name a lake", "edit": "q1"})
    body = await session_body(again, sid)
    assert [m["id"] for m in body["messages"]][0] == "q1" and len(body["messages"]) == 2
