"""Client-chosen ids per owner, kept in the database: the session a key got under an id another
key held is recorded, listed, and found again by that id after a restart."""

from __future__ import annotations

from aiohttp.test_utils import TestClient

from tests.conftest import ClientFactory, services_of
from tests.transports.test_client_ids import A, B, texts, thread


async def listed(client: TestClient, who: dict[str, str]) -> list[str]:
    async with client.get("/sessions", headers=who) as response:
        assert response.status == 200, await response.text()
        return [entry["id"] for entry in (await response.json())["sessions"]]


async def settle(client: TestClient) -> None:
    await services_of(client).runs.wait_idle()


async def test_an_id_taken_first_by_another_key_is_recorded_as_its_owners(
    make_client: ClientFactory, database_url: str
) -> None:
    keys = ["key-a", "key-b"]
    client = await make_client(api_keys=keys, database_url=database_url)
    assert await thread(client, "t-" + "x" * 120, "squatter [emu:tokens=2]", B) == 200
    assert await thread(client, "t-" + "x" * 120, "owner [emu:tokens=2]", A) == 200
    await settle(client)
    mine = await listed(client, A)
    assert len(mine) == 1 and mine[0].startswith("t-xxx") and "~" in mine[0]
    await client.close()

    again = await make_client(api_keys=keys, database_url=database_url)  # from the record alone
    assert await texts(again, "t-" + "x" * 120, A) == ["owner [emu:tokens=2]"]
    assert await texts(again, mine[0], A) == ["owner [emu:tokens=2]"]
    assert await texts(again, "t-" + "x" * 120, B) == ["squatter [emu:tokens=2]"]
    async with again.get(f"/sessions/{mine[0]}", headers=B) as response:
        assert response.status == 404
    assert await thread(again, "t-" + "x" * 120, "owner again [emu:tokens=2]", A) == 200
    assert await texts(again, "t-" + "x" * 120, A) == ["owner [emu:tokens=2]", "owner again [emu:tokens=2]"]
