"""Signed-in users over real HTTP, WebSocket and MCP: tokens minted with PyJWT, checked against a
JWKS that a test server serves; each user owns their sessions; refusals say why; streams end at
their token's expiry and resume with a fresh one."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import jwt
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from service.app import create_app, server_options
from service.config import Settings
from service.transports.edge.auth import AUTH_KEY
from tests.conftest import SESSION_ROUTES, TEST_SETTINGS, ClientFactory, sse_events, test_tools
from tests.transports.test_mcp import RawMcp

ISSUER = "https://idp.example"
AUDIENCE = "agentstream"
JWKS = web.AppKey("jwks", dict)
FETCHES = web.AppKey("fetches", list)


class Signer:
    """A private key with its kid, and its public half as a JWK."""

    def __init__(self, kid: str, kind: str = "RSA") -> None:
        self.kid = kid
        if kind == "RSA":
            self.private: Any = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            self.algorithm = "RS256"
            self.jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.private.public_key()))
        else:
            self.private = ec.generate_private_key(ec.SECP256R1())
            self.algorithm = "ES256"
            self.jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(self.private.public_key()))
        self.jwk.update({"kid": kid, "use": "sig"})

    def token(self, sub: str, **claims: Any) -> str:
        now = int(time.time())
        payload = {"sub": sub, "iss": ISSUER, "aud": AUDIENCE, "iat": now, "exp": now + 600, **claims}
        payload = {name: value for name, value in payload.items() if value is not None}
        return jwt.encode(payload, self.private, algorithm=self.algorithm, headers={"kid": self.kid})

    def public_pem(self) -> bytes:
        return self.private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def hand_made(header: dict[str, Any], payload: dict[str, Any], sign: Callable[[bytes], bytes]) -> str:
    """A JWT put together by hand, for what PyJWT refuses to make (alg none, HS256 keyed with a
    public key)."""
    head = _b64(json.dumps(header).encode()) + "." + _b64(json.dumps(payload).encode())
    return head + "." + _b64(sign(head.encode()))


@pytest.fixture(scope="module")
def signers() -> dict[str, Signer]:
    return {"k1": Signer("k1"), "k2": Signer("k2", "EC"), "k3": Signer("k3")}


@pytest.fixture
async def jwks(aiohttp_server: Any, signers: dict[str, Signer]) -> TestServer:
    async def serve(request: web.Request) -> web.Response:
        request.app[FETCHES].append(time.time())
        return web.json_response(request.app[JWKS])

    app = web.Application()
    app[JWKS] = {"keys": [signers["k1"].jwk, signers["k2"].jwk]}
    app[FETCHES] = []
    app.router.add_get("/jwks", serve)
    return await aiohttp_server(app)


@pytest.fixture
async def signed_in(aiohttp_client: Any, jwks: TestServer, tmp_path: Path) -> TestClient:
    """Users signed in with the JWKS's keys; a database (session lists); headers long enough for
    a 10 KB token, on the server options ``python -m service`` uses."""
    settings = Settings(
        **{
            **TEST_SETTINGS,
            "jwks_url": str(jwks.make_url("/jwks")),
            "jwt_issuer": ISSUER,
            "jwt_audience": [AUDIENCE],
            "jwt_leeway_s": 0,
            "max_header_bytes": 16384,
            "database_url": f"sqlite+aiosqlite:///{tmp_path / 'sessions.db'}",
        }
    )
    server = TestServer(create_app(settings, tools=test_tools()))
    await server.start_server(**server_options(settings))
    return await aiohttp_client(server)


async def make_session(client: TestClient, headers: dict[str, str]) -> str:
    async with client.post("/sessions", json={}, headers=headers) as response:
        assert response.status == 201, await response.text()
        return (await response.json())["id"]


async def test_each_user_owns_their_sessions_on_every_route_and_face(
    signed_in: TestClient, signers: dict[str, Signer]
) -> None:
    alice, bob = bearer(signers["k1"].token("alice")), bearer(signers["k2"].token("bob"))
    session_id = await make_session(signed_in, alice)
    for method, path in [*SESSION_ROUTES, ("PATCH", ""), ("POST", "/approvals/a1")]:
        async with signed_in.request(
            method,
            f"/sessions/{session_id}{path}",
            json={"content": "x", "title": "t", "approved": True},
            headers=bob,
        ) as response:
            assert response.status == 404, (method, path)
            assert await response.json() == {"error": "Session not found"}
    async with signed_in.get("/sessions", headers=bob) as response:
        assert (await response.json())["sessions"] == []
    async with signed_in.get("/sessions", headers=alice) as response:
        assert [s["id"] for s in (await response.json())["sessions"]] == [session_id]
    # The protocol faces: a chat or thread id is the caller's own.
    chat = {
        "id": "shared-name",
        "messages": [{"id": "m1", "role": "user", "parts": [{"type": "text", "text": "hi [emu:tokens=2]"}]}],
    }
    async with signed_in.post("/api/chat", json=chat, headers=alice) as response:
        assert response.status == 200
        await response.read()
    async with signed_in.get("/api/chat/shared-name/stream", headers=bob) as response:
        assert response.status == 204
    async with signed_in.get(f"/ag-ui/{session_id}/events", headers=bob) as response:
        assert response.status == 404
    # Bob naming alice's chat in a run of his own gets a thread of his own, not hers.
    run = {
        "threadId": "shared-name",
        "runId": "r1",
        "messages": [{"id": "u1", "role": "user", "content": "mine [emu:tokens=2]"}],
        "tools": [],
        "context": [],
        "state": {},
        "forwardedProps": {},
    }
    async with signed_in.post("/ag-ui", json=run, headers=bob) as response:
        assert response.status == 200
        assert "MESSAGES_SNAPSHOT" in (body := (await response.read()).decode())
        assert "hi [emu:tokens=2]" not in body, "alice's conversation must not show in bob's run"
    async with signed_in.get("/sessions", headers=bob) as response:
        assert [s["title"] for s in (await response.json())["sessions"]] == ["mine [emu:tokens=2]"]
    async with signed_in.ws_connect("/ws", headers=bob) as ws:
        for message in (
            {"type": "subscribe", "session_id": session_id},
            {"type": "message", "session_id": session_id, "content": "hi"},
            {"type": "cancel", "session_id": session_id},
            {"type": "approve", "session_id": session_id, "approval_id": "a1", "approved": True},
        ):
            await ws.send_json(message)
            frame = await ws.receive_json()
            assert frame["type"] == "error" and frame["code"] == "not_found", (message, frame)
    mcp = await RawMcp(signed_in, bob).start(level=None)
    result = await mcp.post("tools/call", {"name": "session_status", "arguments": {"session_id": session_id}})
    assert result.get("isError") and "not found" in json.dumps(result).lower()
    for tool in ("session_events", "session_cancel", "session_status"):
        refused = await mcp.post("tools/call", {"name": tool, "arguments": {"session_id": session_id}})
        assert refused.get("isError") and "not found" in json.dumps(refused).lower(), tool


@pytest.mark.parametrize(
    "case",
    [
        "expired",
        "not_yet_valid",
        "wrong_issuer",
        "wrong_audience",
        "alg_none",
        "hs256_with_the_public_key",
        "unknown_kid",
        "truncated",
        "ten_kilobytes",
        "no_sub",
    ],
)
async def test_a_bad_token_is_a_401_that_says_why(
    signed_in: TestClient, signers: dict[str, Signer], case: str, caplog: pytest.LogCaptureFixture
) -> None:
    k1 = signers["k1"]
    now = int(time.time())
    claims = {"sub": "alice", "iss": ISSUER, "aud": AUDIENCE, "exp": now + 600}
    token = {
        "expired": lambda: k1.token("alice", exp=now - 60),
        "not_yet_valid": lambda: k1.token("alice", nbf=now + 600),
        "wrong_issuer": lambda: k1.token("alice", iss="https://other.example"),
        "wrong_audience": lambda: k1.token("alice", aud="another-service"),
        "alg_none": lambda: hand_made({"alg": "none", "kid": "k1"}, claims, lambda _: b""),
        "hs256_with_the_public_key": lambda: hand_made(
            {"alg": "HS256", "kid": "k1"},
            claims,
            lambda data: hmac.new(k1.public_pem(), data, hashlib.sha256).digest(),
        ),
        "unknown_kid": lambda: Signer("k9").token("alice"),
        "truncated": lambda: k1.token("alice")[:-20],
        "ten_kilobytes": lambda: k1.token("alice", padding="x" * 10_000),
        "no_sub": lambda: k1.token(None),  # type: ignore[arg-type]
    }[case]()
    caplog.set_level(logging.INFO)
    for headers, url in [(bearer(token), "/sessions"), ({}, f"/sessions?token={token}")]:
        if case == "ten_kilobytes" and not headers:
            continue  # past the request line's limit: the parser's own 400 before any check
        async with signed_in.get(url, headers=headers) as response:
            assert response.status == 401, case
            challenge = response.headers["WWW-Authenticate"]
            assert challenge.startswith('Bearer error="invalid_token", error_description="'), challenge
            body = await response.json()
            assert body["error"] and "session" not in body["error"].lower()
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR]


async def test_a_new_key_is_picked_up_and_a_removed_one_refused_without_a_restart(
    signed_in: TestClient, jwks: TestServer, signers: dict[str, Signer]
) -> None:
    verifier = signed_in.server.app[AUTH_KEY].verifier
    assert verifier is not None
    old = bearer(signers["k1"].token("alice"))
    async with signed_in.get("/sessions", headers=old) as response:
        assert response.status == 200
    # The provider rotates: k3 in, k1 out.
    jwks.app[JWKS]["keys"] = [signers["k2"].jwk, signers["k3"].jwk]
    fetched = len(jwks.app[FETCHES])
    new = bearer(signers["k3"].token("alice"))
    async with signed_in.get("/sessions", headers=new) as response:
        assert response.status == 401  # an unknown kid fetches again at most every 30 s
    assert len(jwks.app[FETCHES]) == fetched
    verifier.clock = lambda: time.time() + 31
    async with signed_in.get("/sessions", headers=new) as response:
        assert response.status == 200
    assert len(jwks.app[FETCHES]) == fetched + 1
    async with signed_in.get("/sessions", headers=old) as response:
        assert response.status == 401, "a removed key's token, even one accepted before"


async def test_an_app_backend_mints_a_token_per_user_with_its_key(make_client: ClientFactory) -> None:
    client = await make_client(api_keys=["key-app"])
    app_key = bearer("key-app")

    async def mint(body: Any) -> aiohttp.ClientResponse:
        return await client.post("/auth/token", json=body, headers=app_key)

    tokens = {}
    for sub in ("alice", "bob"):
        response = await mint({"sub": sub})
        assert response.status == 200
        tokens[sub] = bearer((await response.json())["token"])
    session_id = await make_session(client, tokens["alice"])
    async with client.get(f"/sessions/{session_id}", headers=tokens["bob"]) as response:
        assert response.status == 404
    async with client.get(f"/sessions/{session_id}", headers=app_key) as response:
        assert response.status == 404, "the key's own owner is not its users'"
    async with client.get(f"/sessions/{session_id}", headers=tokens["alice"]) as response:
        assert response.status == 200
    for bad in ({"sub": ""}, {"sub": 7}, {"sub": "x" * 300}, [1]):
        response = await mint(bad)
        assert response.status == 422, bad


async def test_mcp_names_the_protected_resource_metadata(signed_in: TestClient) -> None:
    async with signed_in.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"}) as response:
        assert response.status == 401
        challenge = response.headers["WWW-Authenticate"]
    url = f"http://{signed_in.host}:{signed_in.port}/.well-known/oauth-protected-resource"
    assert challenge == f'Bearer resource_metadata="{url}"'
    async with signed_in.get("/.well-known/oauth-protected-resource") as response:
        assert response.status == 200
        document = await response.json()
    assert document["authorization_servers"] == [ISSUER]
    assert document["resource"].endswith("/mcp")


async def test_a_shared_secret_signs_tokens_too(make_client: ClientFactory) -> None:
    secret = "s" * 32
    client = await make_client(jwt_secret=secret)
    now = int(time.time())
    token = jwt.encode({"sub": "carol", "exp": now + 60}, secret, algorithm="HS256")
    async with client.post("/sessions", json={}, headers=bearer(token)) as response:
        assert response.status == 201
    forged = jwt.encode({"sub": "carol", "exp": now + 60}, "t" * 32, algorithm="HS256")
    async with client.post("/sessions", json={}, headers=bearer(forged)) as response:
        assert response.status == 401
        assert "signature" in response.headers["WWW-Authenticate"]


async def _long_query(client: TestClient, headers: dict[str, str]) -> str:
    session_id = await make_session(client, headers)
    message = {"content": "a story [emu:tokens=60] [emu:tps=20]"}
    async with client.post(f"/sessions/{session_id}/messages", json=message, headers=headers) as response:
        assert response.status == 202
    return session_id


async def test_an_sse_stream_ends_at_its_tokens_expiry_and_resumes_with_a_fresh_one(
    signed_in: TestClient, signers: dict[str, Signer]
) -> None:
    k1 = signers["k1"]
    session_id = await _long_query(signed_in, bearer(k1.token("alice")))
    short = bearer(k1.token("alice", exp=int(time.time()) + 2))
    ids: list[int] = []
    async with signed_in.get(f"/sessions/{session_id}/events?last_event_id=0", headers=short) as response:
        async for event in sse_events(response):
            if "id" in event:
                ids.append(int(event["id"]))
            last = event
    assert last["event"] == "error" and last["data"]["code"] == "token_expired", last
    assert last["data"]["last_id"] == ids[-1]
    fresh = bearer(k1.token("alice"))
    async with signed_in.get(
        f"/sessions/{session_id}/events", headers={**fresh, "Last-Event-ID": str(ids[-1])}
    ) as response:
        async for event in sse_events(response):
            ids.append(int(event["id"]))
            done = event
    assert done["data"]["type"] == "done"
    assert ids == list(range(1, ids[-1] + 1))


async def test_a_websocket_ends_at_its_tokens_expiry_with_4401_and_resumes(
    signed_in: TestClient, signers: dict[str, Signer]
) -> None:
    k1 = signers["k1"]
    session_id = await _long_query(signed_in, bearer(k1.token("alice")))
    short = k1.token("alice", exp=int(time.time()) + 2)
    ids: list[int] = []
    async with signed_in.ws_connect(f"/ws?token={short}") as ws:
        await ws.send_json({"type": "subscribe", "session_id": session_id, "last_event_id": 0})
        async for message in ws:
            frame = json.loads(message.data)
            if "id" in frame:
                ids.append(frame["id"])
            last = frame
        assert ws.close_code == 4401
    assert last["type"] == "error" and last["code"] == "token_expired", last
    fresh = k1.token("alice")
    async with signed_in.ws_connect(f"/ws?token={fresh}") as ws:
        await ws.send_json({"type": "subscribe", "session_id": session_id, "last_event_id": ids[-1]})
        async for message in ws:
            frame = json.loads(message.data)
            if "id" in frame:
                ids.append(frame["id"])
            if frame.get("type") == "done":
                break
    assert ids == list(range(1, ids[-1] + 1))


async def test_an_mcp_stream_ends_at_its_tokens_expiry(
    signed_in: TestClient, signers: dict[str, Signer]
) -> None:
    k1 = signers["k1"]
    short = bearer(k1.token("alice", exp=int(time.time()) + 2))
    mcp = await RawMcp(signed_in, short).start()
    started = await mcp.tool("session_message", content="a story [emu:tokens=60] [emu:tps=20]")
    assert started["session_id"]
    lines = []
    async with mcp.stream() as response:
        async for raw in response.content:  # ends when the service ends the stream
            lines.append(raw.decode().rstrip("\r\n"))
    last = json.loads([line for line in lines if line.startswith("data: {")][-1][6:])
    assert last["params"]["level"] == "error" and last["params"]["data"]["code"] == "token_expired", last
