"""Event ids are never handed out twice: a query reserves ids when it starts (one write), more
when it comes near the end of its reservation (one write per many events, never per token), and a
session whose query never ended continues after the reservation."""

from __future__ import annotations

from service.core.durable import ID_RESERVATION, DurableSessionStore
from tests.conftest import ClientFactory, services_of, sse_events
from tests.db.helpers import ask, events_after, new_session, session_body


async def test_a_long_query_extends_its_reservation_and_a_restart_continues_after_it(
    make_client: ClientFactory, database_url: str
) -> None:
    first = await make_client(database_url=database_url)
    store = services_of(first).sessions
    assert isinstance(store, DurableSessionStore) and store.id_reservation == ID_RESERVATION
    sid = await new_session(first)
    await ask(first, sid, "Hello")
    record = await store.records.load(sid)
    assert record is not None and record.status == "idle"
    # A query that ended stored every id it used: nothing stays reserved, nothing is skipped.
    assert record.ids_reserved_until == record.last_event_id
    start = record.last_event_id

    store.id_reservation, store.reserve_margin = 30, 5  # small, so that one query goes past it
    async with first.post(
        f"/sessions/{sid}/messages",
        json={"content": "Count [emu:stall] [emu:stall_after=100] [emu:tokens=200]"},
    ) as response:
        assert response.status == 202
    seen: list[int] = []
    async with first.get(f"/sessions/{sid}/events", params={"last_event_id": str(start)}) as response:
        async for event in sse_events(response):
            if "id" not in event:
                continue  # a heartbeat
            seen.append(int(event["id"]))
            if seen[-1] >= start + 80:  # on Redis, a burst of tokens may come as one event
                break
    running = await store.records.load(sid)
    assert running is not None and running.status == "running"
    assert running.last_event_id == start  # nothing per token
    assert running.ids_reserved_until >= max(seen) > start + 30  # extended on the way

    # The first service never finishes the query (as if killed): a second one loads the session.
    again = await make_client(database_url=database_url)
    body = await session_body(again, sid)
    assert body["status"] == "idle"
    resumed = body["last_event_id"] - 2
    assert resumed >= running.ids_reserved_until > max(seen)
    polled = await events_after(again, sid, max(seen))
    assert polled["purged"] is True
    assert [(e["id"], e["type"]) for e in polled["events"]] == [
        (resumed + 1, "status_change"),
        (resumed + 2, "error"),
    ]
    await ask(again, sid, "Hello again")
    ids = [e["id"] for e in (await events_after(again, sid, resumed + 2))["events"]]
    assert ids and ids[0] == resumed + 3 and ids == sorted(ids)
