"""JSON nested too deep, on every JSON input a client can send: a clear 400 (or an error frame),
never a 500, a broken socket, or a traceback at ERROR.

The guard is one function (``service.jsonsafe.loads``) that every input passes through; these
tests send, to each input, documents nested just past its bound, at about the parser's own limit
(a valid MCP ``initialize`` whose params nest 990 deep parses, then recursed elsewhere) and far
past it.
"""

from __future__ import annotations

import base64
import json
import logging

import pytest
from aiohttp.test_utils import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from service import jsonsafe
from tests.conftest import ClientFactory
from tests.transports.test_fuzz import assert_clean_log

DEPTHS = [jsonsafe.MAX_DEPTH + 1, 990, 5000]
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def nested_list(depth: int) -> str:
    return "[" * depth + "]" * depth


def nested_object(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


def body_with(field_value: str, key: str) -> str:
    return f'{{"{key}": {field_value}}}'


@pytest.fixture
async def client(make_client: ClientFactory, caplog: pytest.LogCaptureFixture) -> TestClient:
    caplog.set_level(logging.WARNING)
    return await make_client()


def test_loads_bounds_depth_and_keeps_shallow_documents() -> None:
    assert jsonsafe.loads(nested_list(jsonsafe.MAX_DEPTH)) is not None
    assert jsonsafe.loads('{"a": [1, {"b": [2, 3]}], "c": "[[[[[["}') == {
        "a": [1, {"b": [2, 3]}],
        "c": "[[[[[[",
    }
    for text in (
        nested_list(jsonsafe.MAX_DEPTH + 1),
        nested_object(jsonsafe.MAX_DEPTH + 1),
        nested_list(100_000),
    ):
        with pytest.raises(jsonsafe.JsonTooDeep):
            jsonsafe.loads(text)
    with pytest.raises(ValueError):  # what callers already catch for malformed JSON
        jsonsafe.loads(nested_object(3000).encode())


@given(depth=st.integers(min_value=1, max_value=300), shape=st.sampled_from(["list", "object"]))
@settings(max_examples=60, deadline=None)
def test_loads_refuses_exactly_past_the_bound(depth: int, shape: str) -> None:
    text = nested_list(depth) if shape == "list" else nested_object(depth)
    if depth <= jsonsafe.MAX_DEPTH:
        jsonsafe.loads(text)
    else:
        with pytest.raises(jsonsafe.JsonTooDeep):
            jsonsafe.loads(text)


@pytest.mark.slow
@pytest.mark.parametrize("depth", DEPTHS)
@pytest.mark.parametrize(
    ("path", "key"),
    [
        ("/agent/stream", "message"),
        ("/agent/run", "message"),
        ("/sessions", "metadata"),
        ("/sessions/{id}/messages", "content"),
    ],
)
async def test_http_bodies(
    client: TestClient, caplog: pytest.LogCaptureFixture, path: str, key: str, depth: int
) -> None:
    if "{id}" in path:
        async with client.post("/sessions", json={}) as created:
            path = path.replace("{id}", (await created.json())["id"])
    for document in (nested_list(depth), body_with(nested_object(depth), key)):
        async with client.post(path, data=document, headers={"Content-Type": "application/json"}) as response:
            assert response.status == 400, await response.text()
            assert "nested more than" in (await response.json())["error"]
    assert_clean_log(caplog)


@pytest.mark.slow
@pytest.mark.parametrize("depth", DEPTHS)
async def test_websocket_messages(client: TestClient, caplog: pytest.LogCaptureFixture, depth: int) -> None:
    async with client.ws_connect("/ws") as ws:
        for document in (nested_list(depth), body_with(nested_object(depth), "type")):
            await ws.send_str(document)
            frame = await ws.receive_json()
            assert frame["type"] == "error" and frame["code"] == "bad_json"
        await ws.send_json({"type": "ping"})
        assert (await ws.receive_json())["type"] == "pong"  # the socket still serves
    assert_clean_log(caplog)


@pytest.mark.parametrize("depth", DEPTHS)
async def test_mcp_messages(client: TestClient, caplog: pytest.LogCaptureFixture, depth: int) -> None:
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "x", "version": "1"},
        },
    }
    deep_params = json.dumps(initialize)[:-2] + ', "deep": ' + nested_object(depth) + "}}"
    for document in (nested_list(depth), deep_params):
        async with client.post("/mcp", data=document, headers=MCP_HEADERS) as response:
            assert response.status == 400, await response.text()
            body = await response.json()
            assert body["error"]["code"] == -32700 and "nested more than" in body["error"]["message"]
    assert_clean_log(caplog)


async def test_a_token_whose_claims_nest_deep_is_refused_not_a_500(
    make_client: ClientFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    client = await make_client(api_keys=["k1"])
    claims = base64.urlsafe_b64encode(nested_list(3000).encode()).rstrip(b"=").decode()
    async with client.get("/sessions", headers={"Authorization": f"Bearer {claims}.c2ln"}) as response:
        assert response.status == 401
    assert_clean_log(caplog)
