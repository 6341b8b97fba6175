"""New requests are admitted a few per turn of the loop; health checks and scrapes are not held."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from aiohttp import web

from service.core.admission import Admission
from service.transports.edge.admission import PER_TURN, REQUEST_ADMISSION, admission_middleware
from tests.conftest import ClientFactory


class Turns:
    """Counts turns of the running loop (a callback that schedules itself for the next turn)."""

    def __init__(self) -> None:
        self.now = 0
        self._handle: asyncio.Handle | None = None

    def start(self) -> None:
        self.now += 1
        self._handle = asyncio.get_running_loop().call_soon(self.start)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()


async def app_with(aiohttp_client: Any, per_turn: int) -> tuple[Any, Turns, list[tuple[str, int]]]:
    """A client of an app behind the middleware whose handlers note the turn they ran in."""
    turns = Turns()
    seen: list[tuple[str, int]] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append((request.path, turns.now))
        return web.Response(text="ok")

    app = web.Application(middlewares=[admission_middleware])
    app[REQUEST_ADMISSION] = Admission(per_turn)
    app.router.add_get("/work", handler)
    app.router.add_get("/healthz", handler)
    return await aiohttp_client(app), turns, seen


async def get(client: Any, path: str) -> None:
    async with client.get(path) as response:
        assert response.status == 200


async def test_a_burst_of_requests_starts_a_few_per_turn(aiohttp_client: Any) -> None:
    client, turns, seen = await app_with(aiohttp_client, per_turn=3)
    turns.start()
    try:
        await asyncio.gather(*(get(client, "/work") for _ in range(12)))
    finally:
        turns.stop()
    per_turn = Counter(turn for _, turn in seen)
    assert len(seen) == 12
    assert max(per_turn.values()) <= 3
    assert len(per_turn) >= 4


async def test_health_checks_are_not_held_behind_a_burst(aiohttp_client: Any) -> None:
    client, turns, seen = await app_with(aiohttp_client, per_turn=1)
    turns.start()
    try:
        await asyncio.gather(*(get(client, "/work") for _ in range(6)), get(client, "/healthz"))
    finally:
        turns.stop()
    # Six requests at one a turn take six turns; the health check is answered in the first.
    first_turn = min(turn for _, turn in seen)
    assert dict(seen)["/healthz"] == first_turn
    assert len({turn for path, turn in seen if path == "/work"}) == 6


async def test_the_service_admits_requests_this_way(make_client: ClientFactory) -> None:
    client = await make_client()
    app = client.server.app
    assert app.middlewares[0] is admission_middleware
    assert app[REQUEST_ADMISSION].per_turn == PER_TURN
