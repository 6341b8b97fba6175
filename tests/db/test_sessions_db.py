"""Sessions kept in the database (SQLite and PostgreSQL): served after a restart, listed, paged,
renamed, deleted, swept; the live tier dropping idle state and reloading it.

A "restart" here is a second service on the same database: its memory holds nothing, so every
session it serves comes from the record.
"""

from __future__ import annotations

import time
from typing import Any

from service.core.durable import DAY_S, DurableSessionStore
from service.core.sessions import MemorySessionStore
from tests.conftest import ClientFactory, services_of
from tests.db.helpers import ask, events_after, new_session, session_body, texts

ALICE = {"Authorization": "Bearer key-alice"}
BOB = {"Authorization": "Bearer key-bob"}


async def test_completed_turns_survive_a_restart_and_ids_keep_rising(
    make_client: ClientFactory, database_url: str
) -> None:
    first = await make_client(database_url=database_url)
    sid = await new_session(first)
    await ask(first, sid, "What is 2+3?")
    await ask(first, sid, "Hello there")
    before = await session_body(first, sid)
    assert before["title"] == "What is 2+3?"
    assert before["usage"]["total_tokens"] > 0

    again = await make_client(database_url=database_url)
    after = await session_body(again, sid)
    assert after["messages"] == before["messages"]
    assert after["usage"] == before["usage"]
    assert after["last_event_id"] == before["last_event_id"]
    assert after["status"] == "idle"

    # The events themselves were short-term: older ids are purged, with a snapshot from the record.
    polled = await events_after(again, sid, 0)
    assert polled["purged"] is True and polled["events"] == []
    assert polled["snapshot"]["messages"] == before["messages"]

    # A new query continues the conversation, its ids after the stored last one.
    await ask(again, sid, "And what is 4*5?")
    polled = await events_after(again, sid, before["last_event_id"])
    ids = [event["id"] for event in polled["events"]]
    assert ids[0] == before["last_event_id"] + 1 and ids == sorted(ids)
    body = await session_body(again, sid)
    assert texts(body["messages"])[:2] == ["What is 2+3?", texts(before["messages"])[1]]
    assert "And what is 4*5?" in texts(body["messages"])
    assert body["usage"]["total_tokens"] > before["usage"]["total_tokens"]


async def test_a_query_running_when_its_service_died_is_recorded_as_interrupted(
    make_client: ClientFactory, database_url: str
) -> None:
    first = await make_client(database_url=database_url)
    sid = await new_session(first)
    await ask(first, sid, "Hello")
    done = await session_body(first, sid)
    async with first.post(
        f"/sessions/{sid}/messages", json={"content": "Wait [emu:tool=sleepy]"}
    ) as response:
        assert response.status == 202
    # The first service never finishes it (its tool never answers): as if it were killed.
    again = await make_client(database_url=database_url)
    body = await session_body(again, sid)
    assert body["status"] == "idle"
    assert body["messages"] == done["messages"]  # the turn in flight is the only loss
    polled = await events_after(again, sid, body["last_event_id"] - 2)
    assert [event["type"] for event in polled["events"]] == ["status_change", "error"]
    assert polled["events"][1]["code"] == "interrupted"
    listed = await (await again.get("/sessions")).json()
    assert listed["sessions"][0]["status"] == "idle"
    await ask(again, sid, "Hello again")
    assert texts((await session_body(again, sid))["messages"])[-2] == "Hello again"


async def test_listing_pages_newest_first_and_never_shows_another_keys_sessions(
    make_client: ClientFactory, database_url: str
) -> None:
    clock = Clock()
    client = await make_client(database_url=database_url, api_keys=["key-alice", "key-bob"])
    services_of(client).sessions.clock = clock
    mine = []
    for n in range(5):
        clock.now += 1
        mine.append(await new_session(client, ALICE))
        await ask(client, mine[-1], f"Question number {n}", ALICE)
    theirs = await new_session(client, BOB)

    seen: list[dict[str, Any]] = []
    before = None
    while True:
        params = {"limit": "2", **({"before": before} if before else {})}
        async with client.get("/sessions", params=params, headers=ALICE) as response:
            assert response.status == 200
            page = await response.json()
        assert len(page["sessions"]) <= 2
        seen += page["sessions"]
        before = page["next_before"]
        if before is None:
            break
    assert [s["id"] for s in seen] == mine[::-1]
    assert [s["title"] for s in seen] == [f"Question number {n}" for n in range(4, -1, -1)]
    assert all(s["status"] == "idle" and s["usage"]["total_tokens"] > 0 for s in seen)
    assert theirs not in {s["id"] for s in seen}
    bobs = await (await client.get("/sessions", headers=BOB)).json()
    assert [s["id"] for s in bobs["sessions"]] == [theirs]

    # Another key's session is 404 everywhere, also once it only lives in the database.
    again = await make_client(database_url=database_url, api_keys=["key-alice", "key-bob"])
    for method, path in (("GET", ""), ("PATCH", ""), ("DELETE", ""), ("POST", "/messages")):
        async with again.request(
            method, f"/sessions/{mine[0]}{path}", json={"title": "x", "content": "x"}, headers=BOB
        ) as response:
            assert response.status == 404, (method, path)
    assert (await session_body(again, mine[0], ALICE))["title"] == "Question number 0"

    async with client.get("/sessions", params={"before": "nonsense"}, headers=ALICE) as response:
        assert response.status == 400
        assert "before" in (await response.json())["error"]


async def test_rename_and_delete_reach_the_database(make_client: ClientFactory, database_url: str) -> None:
    client = await make_client(database_url=database_url)
    sid = await new_session(client)
    await ask(client, sid, "Tell me about the sea")
    async with client.patch(f"/sessions/{sid}", json={"title": "  Sea   notes "}) as response:
        assert response.status == 200
        assert (await response.json())["title"] == "Sea notes"
    for bad in ({"title": ""}, {"title": "x" * 201}, {"name": "x"}):
        async with client.patch(f"/sessions/{sid}", json=bad) as response:
            assert response.status == 422, bad
    again = await make_client(database_url=database_url)
    listed = await (await again.get("/sessions")).json()
    assert [(s["id"], s["title"]) for s in listed["sessions"]] == [(sid, "Sea notes")]

    async with again.delete(f"/sessions/{sid}") as response:  # held only by the database here
        assert response.status == 204
    assert (await (await again.get("/sessions")).json())["sessions"] == []
    third = await make_client(database_url=database_url)
    async with third.get(f"/sessions/{sid}") as response:
        assert response.status == 404


class Clock:
    """An injectable wall clock."""

    def __init__(self) -> None:
        # Now: a service started on the same database sweeps what is past retention by the real clock.
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


async def test_retention_sweeps_sessions_not_updated_for_the_retention_days(
    make_client: ClientFactory, database_url: str
) -> None:
    clock = Clock()
    client = await make_client(database_url=database_url, session_retention_days=30)
    store = services_of(client).sessions
    assert isinstance(store, DurableSessionStore)
    store.clock = clock
    old = await new_session(client)
    await ask(client, old, "An old question")
    clock.now += 20 * DAY_S
    recent = await new_session(client)
    clock.now += 11 * DAY_S
    assert await store.sweep() == [old]
    assert [s["id"] for s in (await (await client.get("/sessions")).json())["sessions"]] == [recent]
    async with client.get(f"/sessions/{old}") as response:
        assert response.status == 404
    clock.now += 365 * DAY_S
    store.retention_s = 0  # AGENT_SESSION_RETENTION_DAYS=0 keeps everything
    assert await store.sweep() == []


async def test_idle_live_state_is_dropped_after_the_ttl_and_reloaded(
    make_client: ClientFactory, database_url: str
) -> None:
    client = await make_client(database_url=database_url, session_ttl_s=60)
    store = services_of(client).sessions
    sid = await new_session(client)
    await ask(client, sid, "Hello")
    before = await session_body(client, sid)
    if isinstance(store.live, MemorySessionStore):
        assert await store.expire_idle(time.monotonic() + 61) == [sid]
        assert sid not in store.live
    else:  # Redis expires an idle session's keys by itself; dropped here as that expiry would
        await store.live.delete(sid)
    async with client.get(f"/sessions/{sid}/events/poll", params={"since_index": 0}) as response:
        polled = await response.json()  # reloaded by the next request, whatever it is
    assert polled["purged"] is True and polled["last_id"] == before["last_event_id"]
    assert (await session_body(client, sid))["messages"] == before["messages"]


async def test_without_a_database_listing_is_501(make_client: ClientFactory) -> None:
    client = await make_client()  # the suite's default: AGENT_DATABASE_URL empty
    sid = await new_session(client)
    for method, path in (("GET", "/sessions"), ("PATCH", f"/sessions/{sid}")):
        async with client.request(method, path, json={"title": "x"}) as response:
            assert response.status == 501
            assert (await response.json())["code"] == "no_database"


async def test_a_query_waiting_for_approval_is_listed_waiting_and_answered_through_the_record(
    make_client: ClientFactory, database_url: str
) -> None:
    """The durable store hands approvals to the live tier: the waiting query is not taken for an
    interrupted one, its answer goes through, and the turn is recorded when it ends."""
    client = await make_client(database_url=database_url, tools_require_approval="calculator")
    sid = await new_session(client)
    async with client.post(
        f"/sessions/{sid}/messages",
        json={"content": 'Sum [emu:tool=calculator] [emu:tool_input={"expression": "6*7"}]'},
    ) as response:
        assert response.status == 202
    session = await services_of(client).sessions.get(sid)
    async for batch in session.log.subscribe(0):
        if any(entry.event.type == "status_change" and entry.event.status == "waiting" for entry in batch):
            break
    listed = await (await client.get("/sessions")).json()
    assert listed["sessions"][0]["status"] == "waiting"
    pending = (await session_body(client, sid))["pending_approvals"]
    assert [request["toolInput"] for request in pending] == [{"expression": "6*7"}]
    async with client.post(
        f"/sessions/{sid}/approvals/{pending[0]['approval_id']}", json={"approved": True}
    ) as response:
        assert response.status == 200, await response.text()
    run = services_of(client).runs.get(sid)
    if run is not None:
        await run.wait()
    again = await make_client(database_url=database_url)
    body = await session_body(again, sid)
    assert body["status"] == "idle" and body["pending_approvals"] == []
    results = [
        block["toolResult"]
        for message in body["messages"]
        for block in message["content"]
        if "toolResult" in block
    ]
    assert results and results[0].get("status") != "error"


async def test_an_approval_of_a_query_a_restart_ended_is_unknown_after_it(
    make_client: ClientFactory, database_url: str
) -> None:
    """The record keeps the conversation, not the approvals: after a restart the approval of the
    query that died with the service is an id the session does not know (404, as documented)."""
    first = await make_client(database_url=database_url, tools_require_approval="calculator")
    sid = await new_session(first)
    async with first.post(f"/sessions/{sid}/messages", json={"content": "What is 6*7?"}) as response:
        assert response.status == 202
    session = await services_of(first).sessions.get(sid)
    async for batch in session.log.subscribe(0):
        if any(entry.event.type == "status_change" and entry.event.status == "waiting" for entry in batch):
            break
    [pending] = (await session_body(first, sid))["pending_approvals"]
    again = await make_client(database_url=database_url, tools_require_approval="calculator")
    body = await session_body(again, sid)
    assert body["status"] == "idle" and body["pending_approvals"] == []
    async with again.post(
        f"/sessions/{sid}/approvals/{pending['approval_id']}", json={"approved": True}
    ) as response:
        assert response.status == 404
        assert "no approval" in (await response.json())["error"]
