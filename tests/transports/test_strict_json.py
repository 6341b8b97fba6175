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
from pydantic import ValidationError

from service.core.events import ToolApprovalResponse, ToolCall, ToolUse
from service.providers.blocks import as_int
from service.transports import dialects
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import ClientFactory, services_of, sse_blocks
from tests.transports.test_approvals import approving, requests_of  # noqa: F401 (a fixture)
from tests.transports.test_sessions import new_session, send

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


def assert_no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    bad = [record for record in caplog.records if record.levelno >= logging.ERROR or record.exc_info]
    assert not bad, "\n".join(f"{record.name}: {record.getMessage()}" for record in bad)


# -- the edges -----------------------------------------------------------------------------------


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
            {"type": "approve", "session_id": session_id, "approval_id": request.approval_id, "approved": True}
        )
        answered = strict(await asyncio.wait_for(ws.receive_str(), WAIT_S))
        assert answered["type"] == "approval_answered" and answered["approved"] is True
    events = await strict_events(approving, session_id)
    assert events[-1]["type"] == "done"
    assert_no_traceback(caplog)


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
            b'{"model": "agent", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
        ),
        ("/sessions/%s/messages", b'{"content": "hi", "max_turns": -Infinity}'),
        ("/agent/run", b'{"message": "hi", "extra": [1e999]}'),
    ],
)
async def test_a_body_with_nan_is_a_clear_4xx(
    client: TestClient, caplog: pytest.LogCaptureFixture, path: str, raw: bytes
) -> None:
    session_id = await new_session(client)
    if b"%s" in raw:
        raw = raw.replace(b"%s", session_id.encode())
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


@pytest.mark.parametrize("provider", ["bedrock", "openai"])
@pytest.mark.parametrize("bad", ["NaN", "-Infinity", "1e400"])
async def test_a_model_tool_input_with_nan_is_a_tool_error_and_the_run_ends_once(
    make_client: ClientFactory, caplog: pytest.LogCaptureFixture, provider: str, bad: str
) -> None:
    """The emulator writes the input as Python's json does, ``NaN`` and all, as a model could."""
    options = {"provider": "openai", "openai_base_url": "emulator"} if provider == "openai" else {}
    client = await make_client(**options)
    session_id = await new_session(client)
    tool_input = '{"expression": "1+1", "x": %s}' % bad
    await send(client, session_id, f"Sum it [emu:tool=calculator] [emu:tool_input={tool_input}]")
    events = await strict_events(client, session_id)
    types = [event["type"] for event in events]
    assert types.count("done") == 1 and types[-1] == "done" and "error" not in types
    result = next(event for event in events if event["type"] == "tool_result")
    assert result["isError"] and "not valid JSON" in result["result"] and "not a JSON number" in result["result"]
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
        dialects.dumps({"toolInput": {"x": [value]}})
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
    assert strict(dialects.dumps(value)) == value
