"""CORS on every reply to an allowed origin: streamed or not, success or error.

A page on its own origin reads nothing of a reply that lacks ``Access-Control-Allow-Origin``: a
stream shows as "Failed to fetch" and an error as no error at all. The headers of a stream leave
inside its handler, so these tests go through each route that streams and each kind of error.
"""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from service.config import Settings
from tests.conftest import ClientFactory
from tests.support.sessions import new_session

ORIGIN = "https://chat.example"
KEY = {"Authorization": "Bearer k1"}
FROM_PAGE = {**KEY, "Origin": ORIGIN}


def assert_cors(response: Any) -> None:
    assert response.headers.get("Access-Control-Allow-Origin") == ORIGIN, (
        response.status,
        dict(response.headers),
    )
    assert response.headers.get("Access-Control-Allow-Credentials") == "true"
    assert "Origin" in response.headers.get("Vary", "")


@pytest.fixture
async def cors_client(make_client: ClientFactory) -> TestClient:
    return await make_client(api_keys=["k1"], allowed_origins=[ORIGIN])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/agent/stream", {"message": "hello [emu:tokens=3]"}),
        (
            "POST",
            "/api/chat",
            {
                "id": "cors-chat",
                "messages": [
                    {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "hi [emu:tokens=3]"}]}
                ],
                "trigger": "submit-message",
            },
        ),
        (
            "POST",
            "/ag-ui",
            {
                "threadId": "cors-thread",
                "runId": "r1",
                "messages": [{"id": "m1", "role": "user", "content": "hi [emu:tokens=3]"}],
                "tools": [],
                "context": [],
                "state": {},
                "forwardedProps": {},
            },
        ),
        (
            "POST",
            "/v1/chat/completions",
            {"model": Settings().model_id, "stream": True, "messages": [{"role": "user", "content": "hi"}]},
        ),
    ],
)
async def test_streamed_replies_carry_cors(
    cors_client: TestClient, method: str, path: str, body: dict[str, Any]
) -> None:
    async with cors_client.request(method, path, json=body, headers=FROM_PAGE) as response:
        assert response.status == 200, await response.text()
        assert response.content_type == "text/event-stream"
        assert_cors(response)
        await response.read()
    if path == "/api/chat":
        assert "x-vercel-ai-ui-message-stream" in response.headers["Access-Control-Expose-Headers"]


async def test_session_streams_carry_cors(cors_client: TestClient) -> None:
    session_id = await new_session(cors_client, FROM_PAGE)
    async with cors_client.get(f"/sessions/{session_id}/stream?query=hi", headers=FROM_PAGE) as response:
        assert response.status == 200
        assert_cors(response)
        await response.read()
    async with cors_client.get(f"/sessions/{session_id}/events", headers=FROM_PAGE) as response:
        assert response.status == 200
        assert_cors(response)
        await response.read()
    async with cors_client.get(
        f"/sessions/{session_id}/events/poll?since_index=0", headers=FROM_PAGE
    ) as response:
        assert response.status == 200
        assert_cors(response)


async def test_errors_carry_cors(cors_client: TestClient) -> None:
    # Raised by a handler: an unknown session, a bad body, a missing parameter.
    async with cors_client.get("/sessions/nope", headers=FROM_PAGE) as response:
        assert response.status == 404
        assert_cors(response)
    async with cors_client.post("/agent/stream", data=b"{", headers=FROM_PAGE) as response:
        assert response.status == 400
        assert_cors(response)
    async with cors_client.post("/api/chat", json={"messages": 3}, headers=FROM_PAGE) as response:
        assert response.status in (400, 422)
        assert_cors(response)
    session_id = await new_session(cors_client, FROM_PAGE)
    async with cors_client.get(f"/sessions/{session_id}/stream", headers=FROM_PAGE) as response:
        assert response.status == 400
        assert_cors(response)
    # Answered before any handler: no key, no route.
    async with cors_client.get("/sessions", headers={"Origin": ORIGIN}) as response:
        assert response.status == 401
        assert_cors(response)
        assert "WWW-Authenticate" in response.headers["Access-Control-Expose-Headers"]
    async with cors_client.get("/no/such/route", headers=FROM_PAGE) as response:
        assert response.status == 404
        assert_cors(response)


async def test_a_running_query_refusal_carries_cors(cors_client: TestClient) -> None:
    session_id = await new_session(cors_client, FROM_PAGE)
    async with cors_client.post(
        f"/sessions/{session_id}/messages", json={"content": "slow [emu:ttft=5000]"}, headers=FROM_PAGE
    ) as response:
        assert response.status == 202
        assert_cors(response)
    async with cors_client.post(
        f"/sessions/{session_id}/messages", json={"content": "again"}, headers=FROM_PAGE
    ) as response:
        assert response.status == 409
        assert_cors(response)
    async with cors_client.post(f"/sessions/{session_id}/cancel", headers=FROM_PAGE) as response:
        assert response.status == 202


async def test_preflight_allows_what_a_chat_ui_sends(cors_client: TestClient) -> None:
    for method in ("PATCH", "DELETE", "POST"):
        async with cors_client.options(
            "/sessions/x",
            headers={
                "Origin": ORIGIN,
                "Access-Control-Request-Method": method,
                "Access-Control-Request-Headers": "authorization, content-type",
            },
        ) as response:
            assert response.status == 204
            assert method in response.headers["Access-Control-Allow-Methods"]
            assert_cors(response)


async def test_other_origins_and_same_page_get_no_cors(cors_client: TestClient) -> None:
    async with cors_client.post(
        "/agent/stream", json={"message": "hi"}, headers={**KEY, "Origin": "https://evil.example"}
    ) as response:
        assert response.status == 403
        assert "Access-Control-Allow-Origin" not in response.headers
    async with cors_client.post("/agent/stream", json={"message": "hi"}, headers=KEY) as response:
        assert response.status == 200
        assert "Access-Control-Allow-Origin" not in response.headers
        await response.read()
