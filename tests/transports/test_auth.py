"""Access control over real HTTP and WebSocket: keys, tokens, ownership, origins and CORS."""

from __future__ import annotations

import json
import time

import aiohttp
import pytest
from aiohttp.test_utils import TestClient

from service.config import SettingsError, load_settings
from service.transports.edge.auth import Authenticator, fingerprint
from tests.conftest import SESSION_ROUTES, ClientFactory, sse_events

ALICE = {"Authorization": "Bearer key-alice"}
BOB = {"Authorization": "Bearer key-bob"}


@pytest.fixture
async def secured(make_client: ClientFactory) -> TestClient:
    return await make_client(api_keys=["key-alice", "key-bob"], allowed_origins=["https://app.example"])


async def make_session(client: TestClient, headers: dict[str, str]) -> str:
    async with client.post("/sessions", json={}, headers=headers) as response:
        assert response.status == 201
        return (await response.json())["id"]


async def test_every_route_but_health_and_page_needs_a_key(secured: TestClient) -> None:
    routes = [
        ("POST", "/agent/stream"),
        ("POST", "/agent/run"),
        ("POST", "/sessions"),
        ("GET", "/sessions/x"),
        ("DELETE", "/sessions/x"),
        ("POST", "/sessions/x/messages"),
        ("POST", "/sessions/x/cancel"),
        ("GET", "/sessions/x/events"),
        ("GET", "/sessions/x/events/poll"),
        ("GET", "/sessions/x/stream?query=hi"),
        ("GET", "/ws"),
    ]
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic a2V5LWFsaWNl"}):
        for method, path in routes:
            async with secured.request(method, path, json={"message": "hi"}, headers=headers) as response:
                assert response.status == 401, (method, path, headers)
                assert response.headers["WWW-Authenticate"] == "Bearer"
                assert "error" in await response.json()
    async with secured.get("/healthz") as response:
        assert response.status == 200
    async with secured.post("/agent/run", json={"message": "hi [emu:tokens=2]"}, headers=ALICE) as response:
        assert response.status == 200


async def test_a_session_belongs_to_its_key(secured: TestClient) -> None:
    session_id = await make_session(secured, ALICE)
    for method, path in SESSION_ROUTES:
        async with secured.request(
            method, f"/sessions/{session_id}{path}", json={"content": "x"}, headers=BOB
        ) as response:
            assert response.status == 404, (method, path)
            assert await response.json() == {"error": "Session not found"}
    async with secured.get(f"/sessions/{session_id}", headers=ALICE) as response:
        assert response.status == 200
    async with secured.ws_connect("/ws", headers=BOB) as ws:
        await ws.send_json({"type": "subscribe", "session_id": session_id})
        frame = await ws.receive_json()
        assert frame["type"] == "error" and frame["code"] == "not_found"
        await ws.send_json({"type": "message", "session_id": session_id, "content": "hi"})
        assert (await ws.receive_json())["code"] == "not_found"


async def test_browser_tokens_for_eventsource_and_websocket(secured: TestClient) -> None:
    async with secured.post("/auth/token", headers=ALICE) as response:
        assert response.status == 200
        body = await response.json()
        cookie = response.cookies["agentstream_token"]
    token = body["token"]
    assert body["expires_at"] > time.time() and cookie.value == token and cookie["httponly"]
    async with secured.post("/auth/token", headers={"Authorization": f"Bearer {token}"}) as response:
        assert response.status == 401  # a token buys no new token: only a key does
    session_id = await make_session(secured, ALICE)
    async with secured.post(
        f"/sessions/{session_id}/messages", json={"content": "hi [emu:tokens=3]"}, headers=ALICE
    ):
        pass
    secured.session.cookie_jar.clear()
    async with secured.get(f"/sessions/{session_id}/events?last_event_id=0&token={token}") as response:
        assert response.status == 200
        events = [event async for event in sse_events(response)]
    assert events[-1]["data"]["type"] == "done"
    async with secured.ws_connect(f"/ws?token={token}") as ws:
        await ws.send_json({"type": "subscribe", "session_id": session_id, "last_event_id": 0})
        assert (await ws.receive_json())["type"] == "subscribed"
    async with secured.get(
        f"/sessions/{session_id}", headers={"Authorization": f"Bearer {token}"}
    ) as response:
        assert response.status == 200
    async with secured.get(f"/sessions/{session_id}?token={token}x") as response:
        assert response.status == 401


def test_tokens_expire_and_cannot_be_forged() -> None:
    auth = Authenticator(["k1", "k2"], token_ttl_s=60)
    owner = fingerprint("k1")
    token, expires = auth.issue_token(owner, now=1000.0)
    assert auth.owner_of_token(token, now=1059.0) == owner
    assert auth.owner_of_token(token, now=1061.0) is None
    payload, _, signature = token.partition(".")
    other_owner = fingerprint("k2")
    forged = payload.replace(payload, payload[:-2] + "AA") + "." + signature
    assert auth.owner_of_token(forged, now=1001.0) is None
    assert auth.owner_of_token("garbage", now=1001.0) is None
    assert auth.owner_of_token(token + "x", now=1001.0) is None
    assert Authenticator(["k2"]).owner_of_token(token, now=1001.0) is None  # a dropped key revokes its tokens
    assert other_owner != owner


async def test_origins_and_cors(secured: TestClient) -> None:
    preflight = {
        "Origin": "https://app.example",
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type",
    }
    async with secured.options("/sessions", headers=preflight) as response:
        assert response.status == 204
        assert response.headers["Access-Control-Allow-Origin"] == "https://app.example"
        assert "Authorization" in response.headers["Access-Control-Allow-Headers"]
        assert "POST" in response.headers["Access-Control-Allow-Methods"]
    async with secured.options(
        "/sessions", headers={**preflight, "Origin": "https://evil.example"}
    ) as response:
        assert response.status == 403
    async with secured.post(
        "/sessions", json={}, headers={**ALICE, "Origin": "https://app.example"}
    ) as response:
        assert response.status == 201
        assert response.headers["Access-Control-Allow-Origin"] == "https://app.example"
    async with secured.post(
        "/sessions", json={}, headers={**ALICE, "Origin": "https://evil.example"}
    ) as response:
        assert response.status == 403 and "not allowed" in (await response.json())["error"]
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        async with secured.ws_connect("/ws", headers={**ALICE, "Origin": "https://evil.example"}):
            pass
    assert refused.value.status == 403
    same_site = f"http://{secured.host}:{secured.port}"
    async with secured.ws_connect("/ws", headers={**ALICE, "Origin": same_site}) as ws:
        await ws.send_json({"type": "ping"})
        assert json.loads((await ws.receive()).data) == {"type": "pong"}


async def test_cross_site_websocket_refused_even_without_keys(client: TestClient) -> None:
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        async with client.ws_connect("/ws", headers={"Origin": "https://elsewhere.example"}):
            pass
    assert refused.value.status == 403


def test_refuses_to_listen_beyond_loopback_without_keys() -> None:
    with pytest.raises(SettingsError, match="AGENT_API_KEYS"):
        load_settings(host="0.0.0.0")
    assert load_settings(host="0.0.0.0", api_keys=["k"]).host == "0.0.0.0"
    assert load_settings(host="0.0.0.0", allow_unauthenticated=True).allow_unauthenticated
    assert load_settings(host="::1").host == "::1"


# --- Host names: the DNS-rebinding guard ------------------------------------------------------


async def test_a_rebinding_host_is_refused_with_no_keys(client: TestClient) -> None:
    """A page on evil.example (resolving to 127.0.0.1) sends its own Host and a matching Origin."""
    rebound = {"Host": "evil.example", "Origin": "http://evil.example"}
    async with client.post("/sessions", json={}, headers=rebound) as response:
        assert response.status == 403
        assert "evil.example" in (await response.json())["error"]
    with pytest.raises(aiohttp.WSServerHandshakeError) as handshake:
        await client.ws_connect("/ws", headers=rebound)
    assert handshake.value.status == 403
    async with client.get("/", headers={"Host": "evil.example:8080"}) as response:
        assert response.status == 403
    async with client.get("/healthz", headers=rebound) as response:
        assert response.status == 200  # probes may name the machine as they like
    for host in ("localhost:8080", "127.0.0.1", "[::1]:9", "LOCALHOST"):
        async with client.post("/sessions", json={}, headers={"Host": host}) as response:
            assert response.status == 201, host


async def test_allowed_hosts_and_origins_name_the_hosts_accepted(make_client: ClientFactory) -> None:
    client = await make_client(allowed_hosts=["agent.internal"], allowed_origins=["https://app.example"])
    for host, status in (("agent.internal:443", 201), ("app.example", 201), ("localhost", 403)):
        async with client.post("/sessions", json={}, headers={"Host": host}) as response:
            assert response.status == status, host
    anything = await make_client(allowed_hosts=["*"])
    async with anything.post("/sessions", json={}, headers={"Host": "whatever.example"}) as response:
        assert response.status == 201


def test_listening_on_every_address_accepts_any_host_unless_listed() -> None:
    assert load_settings(host="0.0.0.0", api_keys=["k"]).allowed_host_names() is None
    listed = load_settings(host="0.0.0.0", api_keys=["k"], allowed_hosts=["api.example"]).allowed_host_names()
    assert listed == frozenset({"api.example"})
    assert "10.1.2.3" in load_settings(host="10.1.2.3", api_keys=["k"]).allowed_host_names()
