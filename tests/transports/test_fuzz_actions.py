"""Property-based fuzzing of a chat UI's actions on the native routes: the message body's ``id``,
``edit``, ``regenerate``, ``tools`` and ``multitask_strategy``, a browser-side tool's result, and the
WebSocket's ``message`` and ``tool_result`` carrying the same.

Every example checks that the service answers 202/200 or a 4xx with a JSON ``{"error": str}``
(never a 5xx), that nothing is logged at ERROR, and that a refused request leaves the
conversation as it was.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import services_of
from tests.transports.test_fuzz import (
    WAIT_S,
    any_text,
    assert_clean_log,
    assert_error,
    encoded,
    fuzz,
    fuzzed,  # noqa: F401 (the fixture behind ``service``)
    good_text,
    json_values,
    raw_bodies,
)

pytestmark = pytest.mark.slow


@pytest.fixture
async def service(fuzzed: TestClient) -> TestClient:  # noqa: F811 (the fixture imported above)
    """test_fuzz's service: small limits, no quotas, a clean log checked afterwards."""
    return fuzzed


ids = st.sampled_from(["q1", "nope", "", "a" * 129, "has space", "ok-id_2.3:x"]) | any_text
tool_specs = st.lists(
    st.fixed_dictionaries(
        {"name": st.sampled_from(["get_location", "calculator", "", "x" * 65, "bad name"]) | any_text},
        optional={"description": any_text | json_values, "input_schema": json_values},
    ),
    max_size=3,
)
action_bodies = st.fixed_dictionaries(
    {},
    optional={
        "content": good_text | any_text | json_values,
        "id": ids | json_values,
        "edit": ids | json_values,
        "regenerate": ids | st.booleans() | json_values,
        "multitask_strategy": st.sampled_from(["reject", "enqueue", "interrupt", "rollback", "x"])
        | json_values,
        "tools": tool_specs | json_values,
    },
)
result_bodies = st.one_of(
    st.fixed_dictionaries({}, optional={"output": json_values, "error": any_text | json_values}).map(encoded),
    json_values.map(encoded),
    raw_bodies,
)


async def seeded(client: TestClient) -> str:
    """A session holding one question (id ``q1``) and its answer."""
    async with client.post("/sessions") as response:
        session_id = (await response.json())["id"]
    async with client.post(
        f"/sessions/{session_id}/messages", json={"content": "Hello", "id": "q1"}
    ) as response:
        assert response.status == 202
    await idle(client)
    return str(session_id)


async def idle(client: TestClient) -> None:
    async with asyncio.timeout(WAIT_S):
        await services_of(client).runs.wait_idle()
        multitask = services_of(client).multitask
        while multitask._drainers:  # queued messages start once the query before them ends
            await asyncio.gather(*multitask._drainers.values(), return_exceptions=True)
        await services_of(client).runs.wait_idle()


async def messages_of(client: TestClient, session_id: str) -> list[Any]:
    async with client.get(f"/sessions/{session_id}") as response:
        return (await response.json())["messages"]  # type: ignore[no-any-return]


@fuzz
@given(body=action_bodies)
async def test_message_actions(service: TestClient, caplog: pytest.LogCaptureFixture, body: Any) -> None:
    caplog.clear()
    session_id = await seeded(service)
    before = await messages_of(service, session_id)
    async with service.post(f"/sessions/{session_id}/messages", json=body) as response:
        if response.status != 202:
            await assert_error(response, {404, 409, 413, 422, 429})
    await idle(service)
    if response.status != 202:
        assert await messages_of(service, session_id) == before
    assert_clean_log(caplog)


@fuzz
@given(
    body=result_bodies, tool_call_id=ids.filter(lambda text: "/" not in text and text not in ("", ".", ".."))
)
async def test_tool_results(
    service: TestClient, caplog: pytest.LogCaptureFixture, body: Any, tool_call_id: str
) -> None:
    caplog.clear()
    session_id = await seeded(service)
    raw, _ = body
    async with service.post(
        f"/sessions/{session_id}/tool-results/{tool_call_id}",
        data=raw,
        headers={"Content-Type": "application/json"},
    ) as response:
        await assert_error(response, {400, 404, 413, 422})
    assert_clean_log(caplog)


@fuzz
@given(
    body=action_bodies,
    result=st.fixed_dictionaries({}, optional={"output": json_values, "error": json_values}),
)
async def test_websocket_actions(
    service: TestClient,
    caplog: pytest.LogCaptureFixture,
    body: Any,
    result: Any,
) -> None:
    caplog.clear()
    session_id = await seeded(service)
    async with service.ws_connect("/ws") as ws:
        await ws.send_json({**body, "type": "message", "session_id": session_id})
        reply = await ws.receive_json()
        assert reply["type"] in ("accepted", "queued", "error"), reply
        await ws.send_json({**result, "type": "tool_result", "session_id": session_id, "tool_call_id": "t"})
        reply = await ws.receive_json()
        assert reply["type"] == "error" and reply["code"] in ("invalid", "not_found", "bad_json"), reply
        await ws.send_json({"type": "ping"})
        while (await ws.receive_json())["type"] != "pong":
            pass
    await idle(service)
    assert_clean_log(caplog)
