"""What a benchmark asks of the service: a session, a query on it, its whole log."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp


def client_session(total: float | None = None, read: float | None = None) -> aiohttp.ClientSession:
    """The client's HTTP session: no connection limit; no timeout but ``total`` and ``read`` if given."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0),
        timeout=aiohttp.ClientTimeout(total=total, sock_connect=30, sock_read=read),
    )


async def create_session(http: aiohttp.ClientSession, url: str) -> str:
    """``POST /sessions``: the new session's id."""
    async with http.post(url + "/sessions", json={}) as response:
        if response.status != 201:
            raise RuntimeError(f"POST /sessions: {response.status} {await response.text()}")
        return (await response.json())["id"]


async def post_message(http: aiohttp.ClientSession, url: str, session_id: str, content: str) -> int:
    """Start a query; the ``after_id`` to read all of it from."""
    async with http.post(url + f"/sessions/{session_id}/messages", json={"content": content}) as response:
        if response.status != 202:
            raise RuntimeError(f"POST /sessions/{{id}}/messages: {response.status} {await response.text()}")
        return int((await response.json())["after_id"])


async def new_session(http: aiohttp.ClientSession, url: str, content: str | None = None) -> str:
    """A session, with a query started on it when ``content`` is given."""
    session_id = await create_session(http, url)
    if content is not None:
        await post_message(http, url, session_id, content)
    return session_id


async def fill_session(http: aiohttp.ClientSession, url: str, tokens: int) -> tuple[str, int]:
    """A session whose log holds a finished query of ``tokens`` text tokens; its id and last id."""
    session_id = await new_session(http, url, f"fill [emu:tokens={tokens}]")
    while True:  # the query runs in the background; its status says when it is done
        async with http.get(url + f"/sessions/{session_id}") as response:
            body = await response.json()
        if body["status"] == "idle" and body["last_event_id"] > tokens:
            return session_id, body["last_event_id"]
        await asyncio.sleep(0.05)


async def wait_idle(http: aiohttp.ClientSession, url: str, session_id: str, timeout: float = 30.0) -> int:
    """Wait until the session's query is over (as ``url`` sees it); its last event id."""
    deadline = time.monotonic() + timeout
    while True:
        async with http.get(url + f"/sessions/{session_id}") as response:
            body = await response.json()
        if body["status"] != "running" or time.monotonic() > deadline:
            return int(body["last_event_id"])
        await asyncio.sleep(0.05)


async def poll_all(http: aiohttp.ClientSession, url: str, session_id: str) -> list[dict[str, Any]]:
    """Every event of a session's log, through the polling route."""
    events: list[dict[str, Any]] = []
    since = 0
    while True:
        async with http.get(
            url + f"/sessions/{session_id}/events/poll?since_index={since}&limit=1000"
        ) as response:
            body = await response.json()
        events += body["events"]
        if not body["events"] or body["next_index"] <= since:
            return events
        since = body["next_index"]
