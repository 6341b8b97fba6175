"""What a client chooses or sends, taken or refused alike on SQLite, PostgreSQL and memory:
session ids up to the 128 characters /api/chat and /ag-ui allow, refused past them; text holding
U+0000 refused at every edge (PostgreSQL's text cannot keep it), while a NUL the model produces
is kept whole in the conversation."""

from __future__ import annotations

import logging
import time
from typing import Any

import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPError

from tests.conftest import ClientFactory, services_of
from tests.db.helpers import ask, new_session, session_body, texts
from tests.transports.test_mcp import connect
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


async def test_a_nul_from_the_model_is_stored_and_read_back_whole(
    make_client: ClientFactory, database_url: str
) -> None:
    client = await make_client(database_url=database_url)
    sid = await new_session(client)
    await ask(client, sid, "Say it [emu:say=before%00after]")
    said = texts((await session_body(client, sid))["messages"])[-1]
    assert said == "before\x00after"
    again = await make_client(database_url=database_url)  # from the record alone
    assert texts((await session_body(again, sid))["messages"])[-1] == said


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
def any_backend(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    """The ``database_url`` of each backend: none (memory only), SQLite, PostgreSQL."""
    if request.param == "memory":
        return ""
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'agentstream.db'}"
    return str(request.getfixturevalue("postgres").create_database())


async def test_text_holding_nul_is_refused_at_every_edge_alike(
    make_client: ClientFactory, any_backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    client = await make_client(database_url=any_backend)
    sid = await new_session(client)
    await ask(client, sid, "Hello")
    durable = bool(any_backend)
    nul = "a\x00b"
    for path, body in (
        ("/api/chat", chat_body("c1", nul)),
        ("/api/chat", chat_body("c1", "fine", extra={nul: 1})),
        ("/ag-ui", agui_body("t1", nul)),
        (f"/sessions/{sid}/messages", {"content": nul}),
    ):
        async with client.post(path, json=body) as response:
            assert response.status == 422, (path, await response.text())
            assert (await response.json())["code"] == "nul_character"
    async with client.get(f"/sessions/{sid}/stream", params={"query": nul}) as response:
        assert response.status == 400 and "U+0000" in (await response.json())["error"]
    async with client.patch(f"/sessions/{sid}", json={"title": nul}) as response:
        assert response.status == (422 if durable else 501)
    async with client.get("/sessions", params={"before": f"1.0~{nul}"}) as response:
        assert response.status == (400 if durable else 501)
    async with client.get("/sessions/a%00b") as response:
        assert response.status == 404

    async with client.ws_connect("/ws") as ws:
        await ws.send_json({"type": "message", "session_id": sid, "content": nul})
        refused = await ws.receive_json(timeout=10)
        assert refused["type"] == "error" and refused["code"] == "invalid" and "U+0000" in refused["error"]
        await ws.send_json({"type": "ping"})
        assert (await ws.receive_json(timeout=10))["type"] == "pong"  # the socket stays open

    async with connect(client) as mcp:
        with pytest.raises(MCPError) as raised:
            await mcp.call_tool("session_message", {"session_id": sid, "content": nul})
        assert raised.value.error.code == types.INVALID_PARAMS

    # Nothing was started or stored by any of them, and the session goes on.
    await ask(client, sid, "Hello again")
    assert texts((await session_body(client, sid))["messages"])[::2] == ["Hello", "Hello again"]
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR]


async def test_text_columns_take_what_a_client_never_sent(
    make_client: ClientFactory, database_url: str
) -> None:
    """The net under the edge: a run's message that holds NUL reaches the record through no
    route, but if one did, PostgreSQL's text columns would refuse it; it is kept as U+FFFD."""
    client = await make_client(database_url=database_url)
    records = services_of(client).sessions.records
    sid = await new_session(client)
    await records.run_started(sid, "r1", "a\x00b", time.time())
    record = await records.load(sid)
    assert record is not None and (record.title, record.status) == ("a\ufffdb", "running")
