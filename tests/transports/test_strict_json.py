"""NaN, Infinity and numbers too large for a float, refused at every edge and never written.

Python's ``json`` reads ``NaN``, ``Infinity`` and ``-Infinity`` and writes them back, but a
browser's ``JSON.parse`` and PostgreSQL refuse them. A client body holding one gets the route's
malformed-JSON answer, a WebSocket message an error frame, a model's tool input an error result
the model reads; whatever is accepted comes out as strict JSON on the wire and in the database.
Every read here is strict (:func:`strict`), so a ``NaN`` the service writes fails the test.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from service.core.events import ToolApprovalResponse, ToolCall, ToolUse
from service.jsonsafe import dumps
from service.providers.blocks import as_int
from service.transports.edge.inputs import holds_nul
from tests.conftest import ClientFactory, services_of, sse_blocks
from tests.support.sessions import new_session
from tests.transports.test_approvals import approving, requests_of  # noqa: F401 (a fixture)
from tests.transports.test_fuzz import any_text, contains_surrogate
from tests.transports.test_sessions import send

NAN_INPUT = b'{"approved": true, "input": {"expression": "1+1", "x": NaN}}'
WAIT_S = 10.0


def _refuse(name: str) -> Any:
    raise AssertionError(f"the service wrote {name}, which is not JSON")


def strict(text: str | bytes) -> Any:
    """``text`` read as a strict parser (a browser, PostgreSQL) reads it."""
    return json.loads(text, parse_constant=_refuse)


async def strict_events(client: TestClient, session_id: str) -> list[dict[str, Any]]:
    """The session's events from the start to the query's end, each read strictly."""
    async with client.get(f"/sessions/{session_id}/events", headers={"Last-Event-ID": "0"}) as response:
        assert response.status == 200
        events = []
        async with asyncio.timeout(WAIT_S):
            async for block in sse_blocks(response):
                events.append(strict(block["data"]))
                if events[-1]["type"] in {"done", "error"}:
                    return events
    raise AssertionError("the stream ended without done")


async def strict_session(client: TestClient, session_id: str) -> dict[str, Any]:
    async with client.get(f"/sessions/{session_id}") as response:
        assert response.status == 200, await response.text()
        return strict(await response.read())  # type: ignore[no-any-return]


def finite(value: Any) -> bool:
    """False when ``value`` holds a NaN or an infinity, at any depth."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(finite(item) for item in value.values())
    if isinstance(value, list):
        return all(finite(item) for item in value)
    return True


def assert_no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    bad = [record for record in caplog.records if record.levelno >= logging.ERROR or record.exc_info]
    assert not bad, "\n".join(f"{record.name}: {record.getMessage()}" for record in bad)


# -- the edges -----------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "raw",
    [
        NAN_INPUT,
        b'{"approved": true, "input": {"expression": "1+1", "x": [-Infinity]}}',
        b'{"approved": true, "input": {"expression": "1+1", "x": 1e400}}',
        b'{"approved": true, "reason": "ok", "extra": Infinity}',
    ],
)
async def test_an_http_approval_with_nan_is_refused_and_the_approval_still_waits(
    approving: TestClient,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
    raw: bytes,
) -> None:
    session_id = await new_session(approving)
    await send(approving, session_id, "What is 6*7?")
    [request] = await requests_of(approving, session_id)
    url = f"/sessions/{session_id}/approvals/{request.approval_id}"
    async with approving.post(url, data=raw, headers={"Content-Type": "application/json"}) as response:
        assert response.status == 400, await response.text()
        body = strict(await response.read())
    assert "malformed JSON" in body["error"] and "not a JSON number" in body["error"]
    session = await strict_session(approving, session_id)
    assert session["status"] == "waiting" and len(session["pending_approvals"]) == 1
    async with approving.post(url, json={"approved": True}) as response:
        assert response.status == 200, await response.text()
    events = await strict_events(approving, session_id)
    assert [event["type"] for event in events].count("done") == 1 and events[-1]["type"] == "done"
    assert next(event for event in events if event["type"] == "tool_result")["result"] == "42"
    assert_no_traceback(caplog)


async def test_a_websocket_approve_with_nan_gets_an_error_frame_and_the_socket_stays_open(
    approving: TestClient,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    session_id = await new_session(approving)
    await send(approving, session_id, "What is 6*7?")
    [request] = await requests_of(approving, session_id)
    async with approving.ws_connect("/ws") as ws:
        ids = f'"session_id": "{session_id}", "approval_id": "{request.approval_id}"'
        await ws.send_str(f'{{"type": "approve", {ids}, "approved": true, "input": {{"x": NaN}}}}')
        refused = strict(await asyncio.wait_for(ws.receive_str(), WAIT_S))
        assert refused["type"] == "error" and refused["code"] == "bad_json"
        assert "not a JSON number" in refused["error"]
        await ws.send_json({"type": "ping"})
        assert strict(await asyncio.wait_for(ws.receive_str(), WAIT_S)) == {"type": "pong"}
        session = await strict_session(approving, session_id)
        assert session["status"] == "waiting" and len(session["pending_approvals"]) == 1
        await ws.send_json(
            {
                "type": "approve",
                "session_id": session_id,
                "approval_id": request.approval_id,
                "approved": True,
            }
        )
        answered = strict(await asyncio.wait_for(ws.receive_str(), WAIT_S))
        assert answered["type"] == "approval_answered" and answered["approved"] is True
    events = await strict_events(approving, session_id)
    assert events[-1]["type"] == "done"
    assert_no_traceback(caplog)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("path", "raw"),
    [
        (
            "/api/chat",
            b'{"id": "%s", "messages": [{"id": "m1", "role": "user", "parts": [{"type": "text", '
            b'"text": "hi"}], "metadata": {"score": NaN}}]}',
        ),
        (
            "/ag-ui",
            b'{"threadId": "%s", "runId": "r1", "messages": [{"id": "m1", "role": "user", '
            b'"content": "hi"}], "state": {"score": Infinity}}',
        ),
        (
            "/v1/chat/completions",
            b'{"model": "%m", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
        ),
        ("/sessions/%s/messages", b'{"content": "hi", "max_turns": -Infinity}'),
        ("/agent/run", b'{"message": "hi", "extra": [1e999]}'),
    ],
)
async def test_a_body_with_nan_is_a_clear_4xx(
    client: TestClient, caplog: pytest.LogCaptureFixture, path: str, raw: bytes
) -> None:
    session_id = await new_session(client)
    async with client.get("/v1/models") as response:
        model = (await response.json())["data"][0]["id"]
    raw = raw.replace(b"%s", session_id.encode()).replace(b"%m", model.encode())
    path = path.replace("%s", session_id)
    async with client.post(path, data=raw, headers={"Content-Type": "application/json"}) as response:
        text = await response.text()
        assert 400 <= response.status < 500, (response.status, text)
        body = strict(text)
    error = body["error"]
    message = error if isinstance(error, str) else error["message"]  # OpenAI's shape on /v1
    assert "not a JSON number" in message
    session = await strict_session(client, session_id)
    assert session["status"] == "idle" and session["messages"] == []
    assert_no_traceback(caplog)


@pytest.mark.slow
async def test_an_mcp_message_with_nan_is_a_parse_error(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    raw = (
        b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "session_approve", '
        b'"arguments": {"approved": true, "input": {"x": NaN}}}}'
    )
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    async with client.post("/mcp", data=raw, headers=headers) as response:
        assert response.status == 400
        body = strict(await response.read())
    assert body["error"]["code"] == -32700 and "not a JSON number" in body["error"]["message"]
    assert_no_traceback(caplog)


@pytest.mark.slow
@pytest.mark.parametrize("provider", ["bedrock", "openai"])
@pytest.mark.parametrize("bad", ["NaN", "-Infinity", "1e400"])
async def test_a_model_tool_input_with_nan_is_a_tool_error_and_the_run_ends_once(
    make_client: ClientFactory, caplog: pytest.LogCaptureFixture, provider: str, bad: str
) -> None:
    """The emulator writes the input as Python's json does, ``NaN`` and all, as a model could."""
    options = {"provider": "openai", "openai_base_url": "emulator"} if provider == "openai" else {}
    client = await make_client(**options)
    session_id = await new_session(client)
    tool_input = '{"expression": "1+1", "x": ' + bad + "}"
    await send(client, session_id, f"Sum it [emu:tool=calculator] [emu:tool_input={tool_input}]")
    events = await strict_events(client, session_id)
    types = [event["type"] for event in events]
    assert types.count("done") == 1 and types[-1] == "done" and "error" not in types
    result = next(event for event in events if event["type"] == "tool_result")
    assert (
        result["isError"] and "not valid JSON" in result["result"] and "not a JSON number" in result["result"]
    )
    session = await strict_session(client, session_id)
    assert session["status"] == "idle"
    [use] = [block["toolUse"] for block in session["messages"][1]["content"] if "toolUse" in block]
    assert use["input"] == {}
    assert_no_traceback(caplog)


# -- the writers ---------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_the_default_codec_refuses_what_json_cannot_carry(value: float) -> None:
    """A non-finite number that slipped past the edges fails loudly rather than going out."""
    with pytest.raises(ValueError):
        dumps({"toolInput": {"x": [value]}})
    for build in (
        lambda: ToolUse(tool="t", tool_use_id="u", input={"x": value}),
        lambda: ToolCall(tool="t", tool_use_id="u", input=[value]),
        lambda: ToolApprovalResponse(approval_id="a", approved=True, input={"x": {"y": value}}),
    ):
        with pytest.raises(ValidationError, match="JSON cannot carry"):
            build()
    assert as_int(value) is None  # a token count botocore read as NaN is no count


def test_the_default_codec_writes_strict_json_as_before() -> None:
    value = {"x": [1.5, -0.0, 1e308, 10**30], "s": "NaN Infinity"}
    assert strict(dumps(value)) == value


# -- the property --------------------------------------------------------------------------------

# Strings that look like what must not be written, or that a careless writer gets wrong.
special_text = st.sampled_from(
    ["NaN", "Infinity", "-Infinity", "1e400", "null", "</script>", "\u2028\u2029", "\x00", '"\\', "é🙂"]
)
keys = st.text(max_size=6) | special_text
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()  # NaN and both infinities among them
    | st.sampled_from([1e308, -0.0, 5e-324, 10**40])
    | st.text(max_size=8)
    | special_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3),
    max_leaves=8,
)
edited_inputs = st.one_of(
    st.dictionaries(keys, json_values, max_size=4),
    st.dictionaries(keys, json_values, min_size=1, max_size=4),
    # A non-finite number somewhere, nested: a 400.
    st.builds(
        lambda value, bad: {**value, "deep": [{"n": bad}]},
        st.dictionaries(keys, json_values, max_size=2),
        st.sampled_from([math.nan, math.inf, -math.inf]),
    ),
    # Now and then a lone surrogate (any_text), which JSON escapes but no store keeps: a 422.
    st.dictionaries(keys, any_text, min_size=1, max_size=2),
)


@pytest.fixture
async def recorded(make_client: ClientFactory, database_url: str) -> TestClient:
    """The service on a database (SQLite, then PostgreSQL), with ``explode`` (which takes any
    input) behind approval."""
    return await make_client(
        database_url=database_url, tools_require_approval="explode", approval_timeout_s=60
    )


# Twenty-two queries on a database under one test: seconds on an idle machine, but pytest's
# 60 s for the whole test is not room enough on a busy one.
@pytest.mark.timeout(300)
@pytest.mark.slow
@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@example(edited={"x": math.nan})
@example(edited={"x": [1e308, -0.0, 5e-324, 10**40], "NaN": "Infinity", "</script>": None})
@given(edited=edited_inputs)
async def test_what_a_client_sends_comes_out_strict_and_is_stored_as_sent(
    recorded: TestClient, caplog: pytest.LogCaptureFixture, edited: dict[str, Any]
) -> None:
    """An approval's edited input (any JSON object, as Python's json writes it) is refused with
    a 4xx, or accepted and then written strictly on the session SSE wire and in
    ``GET /sessions/{id}``, and stored in the database exactly as the live session holds it."""
    caplog.clear()
    client = recorded
    session_id = await new_session(client)
    await send(client, session_id, "Go [emu:tool=explode]")
    [request] = await requests_of(client, session_id)
    raw = json.dumps({"approved": True, "input": edited}).encode()
    url = f"/sessions/{session_id}/approvals/{request.approval_id}"
    if not finite(edited):
        expected = 400
    elif contains_surrogate(edited) or holds_nul(edited):
        expected = 422  # no store keeps a lone surrogate; U+0000 is refused alike on every store
    else:
        expected = 200
    async with client.post(url, data=raw, headers={"Content-Type": "application/json"}) as response:
        event(f"status {response.status}")
        assert response.status == expected, await response.text()
        reply = strict(await response.read())
    if expected != 200:
        assert isinstance(reply["error"], str)
        async with client.post(url, json={"approved": True}) as response:  # still answerable
            assert response.status == 200, await response.text()
    ran_with = edited if expected == 200 else {}

    events = await strict_events(client, session_id)
    assert [e["type"] for e in events].count("done") == 1 and events[-1]["type"] == "done"
    answered = next(e for e in events if e["type"] == "tool_approval_response")
    assert answered.get("toolInput", {}) == (edited if expected == 200 else {})
    assert events[-1]["tool_calls"][0]["input"] == ran_with
    body = await strict_session(client, session_id)
    [use] = [block["toolUse"] for block in body["messages"][1]["content"] if "toolUse" in block]
    assert use["input"] == ran_with

    await services_of(client).runs.wait_idle()
    live = (await services_of(client).sessions.get(session_id)).messages
    stored = await services_of(client).sessions.records.load(session_id)
    assert stored is not None
    assert repr(stored.messages) == repr(live)  # 1 stays 1, 1.0 stays 1.0, -0.0 stays -0.0, key order kept
    assert_no_traceback(caplog)
