"""Every face makes a session of the agent it names: the AI SDK body's ``agent``, an AG-UI URL per
agent, MCP's ``session_create`` and ``session_message``, the WebSocket's ``create`` and ``run``.
Each session's agent shows in ``GET /sessions/{id}`` and in its ``done``, and the emulator got the
agent's own model; an unknown agent is refused naming the known ones, a request naming another
agent for an existing session is a 409 (a session keeps its agent), and an agent defined with
``client_tools = false`` refuses a message that brings tools on every face that takes them.

Two agents on the embedded emulator: ``support`` (Bedrock's wire, the calculator; the default,
being the file's first) and ``research`` (the OpenAI-compatible wire, no tools, no client tools).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp.test_utils import TestClient

from tests.conftest import ClientFactory, services_of
from tests.transports.test_mcp import call, connect
from tests.transports.test_protocols import agui_body, chat_body

AGENTS = """
[agents.support]
description = "Answers with the calculator."
provider = "emulator"
model = "support-model"
system_prompt = "You are the support agent."
tools = ["calculator"]

[agents.research]
description = "Reads; runs nothing of the browser's."
provider = "openai"
base_url = "emulator"
api_key = "emulator"
model = "research-model"
system_prompt = "You are the research agent."
tools = []
client_tools = false
"""
KNOWN = ["support", "research"]
MODELS = {"support": "support-model", "research": "research-model"}
TOOL = {"name": "pick_color", "description": "Asks the person for a color."}


async def two_agents(make_client: ClientFactory, tmp_path: Path) -> TestClient:
    path = tmp_path / "agents.toml"
    path.write_text(AGENTS, encoding="utf-8")
    return await make_client(agents_file=str(path))


async def agent_of(client: TestClient, session_id: str) -> str:
    async with client.get(f"/sessions/{session_id}") as response:
        assert response.status == 200, await response.text()
        return (await response.json())["agent"]


async def done_of(client: TestClient, session_id: str) -> dict[str, Any]:
    """The session's last ``done`` event (its query has ended)."""
    async with client.get(f"/sessions/{session_id}/events/poll") as response:
        assert response.status == 200
        events = (await response.json())["events"]
    return [event for event in events if event["type"] == "done"][-1]


def models_asked(client: TestClient, text: str) -> list[str]:
    """The models the emulator was asked for by the requests of that text."""
    return [r.model_id for r in services_of(client).emulator.records() if text in r.user_text]


async def assert_bound(client: TestClient, session_id: str, agent: str, text: str) -> None:
    """The session is the agent's, its done says so, and its query ran on the agent's model."""
    assert await agent_of(client, session_id) == agent
    assert (await done_of(client, session_id))["agent"] == agent
    assert models_asked(client, text) == [MODELS[agent]]


async def refused(response: aiohttp.ClientResponse, status: int, code: str) -> dict[str, Any]:
    assert response.status == status, await response.text()
    body = await response.json()
    assert body["code"] == code, body
    return body


async def test_the_ai_sdk_body_names_the_chat_s_agent_for_life(
    make_client: ClientFactory, tmp_path: Path
) -> None:
    client = await two_agents(make_client, tmp_path)
    async with client.post(
        "/api/chat", json=chat_body("chat-r", "first r [emu:tokens=3]", agent="research")
    ) as r:
        assert r.status == 200
        await r.read()
    await assert_bound(client, "chat-r", "research", "first r")

    # The chat keeps its agent: a body without one continues it, a body naming another is refused.
    second = chat_body("chat-r", "second r [emu:tokens=3]")
    second["messages"][0]["id"] = "u2"
    async with client.post("/api/chat", json=second) as r:
        assert r.status == 200
        await r.read()
    assert models_asked(client, "second r") == ["research-model"]
    async with client.post("/api/chat", json={**second, "agent": "support"}) as r:
        body = await refused(r, 409, "agent_mismatch")
        assert body["agent"] == "research"

    # Without an agent a new chat is the default one's (the file's first).
    async with client.post("/api/chat", json=chat_body("chat-d", "first d [emu:tokens=3]")) as r:
        await r.read()
    await assert_bound(client, "chat-d", "support", "first d")

    async with client.post("/api/chat", json=chat_body("chat-x", "hi", agent="nobody")) as r:
        body = await refused(r, 422, "unknown_agent")
        assert body["agents"] == KNOWN
    async with client.get("/sessions/chat-x") as r:
        assert r.status == 404  # refused before the chat was made


async def test_an_ag_ui_url_per_agent(make_client: ClientFactory, tmp_path: Path) -> None:
    client = await two_agents(make_client, tmp_path)
    async with client.post("/ag-ui/research", json=agui_body("t-r", "ag first [emu:tokens=3]")) as r:
        assert r.status == 200
        assert "RUN_FINISHED" in await r.text()
    await assert_bound(client, "t-r", "research", "ag first")

    second = agui_body("t-r", "ag second [emu:tokens=3]")
    second["messages"][0]["id"] = "u2"
    async with client.post("/ag-ui/support", json=second) as r:
        body = await refused(r, 409, "agent_mismatch")
        assert body["agent"] == "research"
    async with client.post("/ag-ui", json=second) as r:  # the plain URL: the thread's own agent
        assert r.status == 200
        await r.read()
    assert models_asked(client, "ag second") == ["research-model"]

    async with client.post("/ag-ui", json=agui_body("t-d", "ag default [emu:tokens=3]")) as r:
        await r.read()
    await assert_bound(client, "t-d", "support", "ag default")

    async with client.post("/ag-ui/nobody", json=agui_body("t-x", "hi")) as r:
        assert (await refused(r, 422, "unknown_agent"))["agents"] == KNOWN
    # The events route is untouched by the per-agent URL.
    async with client.get("/ag-ui/t-r/events") as r:
        assert r.status == 204


async def test_mcp_makes_sessions_of_the_agent_named(make_client: ClientFactory, tmp_path: Path) -> None:
    client = await two_agents(make_client, tmp_path)
    async with connect(client) as mcp:
        made = await call(mcp, "session_create", agent="research")
        assert made["agent"] == "research" and made["status"] == "idle"
        assert await agent_of(client, made["session_id"]) == "research"
        plain = await call(mcp, "session_create")
        assert plain["agent"] == "support"

        answered = await call(
            mcp, "session_message", agent="research", content="mcp r [emu:tokens=3]", wait=True
        )
        assert answered["done"]["agent"] == "research"
        await assert_bound(client, answered["session_id"], "research", "mcp r")

        mismatch = await mcp.call_tool(
            "session_message", {"session_id": answered["session_id"], "agent": "support", "content": "hi"}
        )
        assert mismatch.is_error and mismatch.structured_content is not None
        assert mismatch.structured_content["code"] == "agent_mismatch"

        unknown = await mcp.call_tool("session_create", {"agent": "nobody"})
        assert unknown.is_error and unknown.structured_content is not None
        assert unknown.structured_content["code"] == "unknown_agent"
        assert unknown.structured_content["agents"] == KNOWN


async def receive(ws: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
    return await asyncio.wait_for(ws.receive_json(), 10)


async def until_type(ws: aiohttp.ClientWebSocketResponse, kind: str) -> dict[str, Any]:
    while True:
        frame = await receive(ws)
        if frame.get("type") == kind:
            return frame


async def test_websocket_create_and_run_name_the_agent(make_client: ClientFactory, tmp_path: Path) -> None:
    client = await two_agents(make_client, tmp_path)
    async with client.ws_connect("/ws") as ws:
        await ws.send_json({"type": "create", "agent": "research"})
        created = await receive(ws)
        assert created["type"] == "created" and created["agent"] == "research"
        session_id = created["session_id"]
        await ws.send_json({"type": "subscribe", "session_id": session_id})
        await until_type(ws, "status_change")
        await ws.send_json({"type": "message", "session_id": session_id, "content": "ws r [emu:tokens=3]"})
        done = await until_type(ws, "done")
        assert done["agent"] == "research" and done["session_id"] == session_id
        await assert_bound(client, session_id, "research", "ws r")

        await ws.send_json({"type": "create"})
        assert (await receive(ws))["agent"] == "support"

        await ws.send_json({"type": "run", "message": "ws run [emu:tokens=3]", "agent": "research"})
        assert (await until_type(ws, "done"))["agent"] == "research"
        await until_type(ws, "unsubscribed")  # a run's subscription ends with it
        assert models_asked(client, "ws run") == ["research-model"]

        for message in (
            {"type": "create", "agent": "nobody"},
            {"type": "run", "message": "hi", "agent": "nobody"},
        ):
            await ws.send_json(message)
            error = await receive(ws)
            assert error["type"] == "error" and error["code"] == "unknown_agent", error
            assert error["agents"] == KNOWN and error["request_type"] == message["type"]
        await ws.send_json({"type": "create", "agent": 7})
        assert (await receive(ws))["code"] == "invalid"

        # The research agent takes no client tools, on the socket as on HTTP.
        await ws.send_json({"type": "message", "session_id": session_id, "content": "hi", "tools": [TOOL]})
        error = await receive(ws)
        assert error["type"] == "error" and error["code"] == "client_tools_refused", error
        await ws.send_json({"type": "ping"})
        assert (await receive(ws))["type"] == "pong"


async def test_an_agent_without_client_tools_refuses_them_on_every_face(
    make_client: ClientFactory, tmp_path: Path
) -> None:
    client = await two_agents(make_client, tmp_path)
    async with client.post("/sessions", json={"agent": "research"}) as r:
        research = (await r.json())["id"]
    async with client.post(f"/sessions/{research}/messages", json={"content": "hi", "tools": [TOOL]}) as r:
        await refused(r, 422, "client_tools_refused")

    chat_tools = {TOOL["name"]: {"description": TOOL["description"]}}
    async with client.post("/api/chat", json=chat_body("c-t", "hi", agent="research", tools=chat_tools)) as r:
        await refused(r, 422, "client_tools_refused")
    async with client.get("/sessions/c-t") as r:
        assert r.status == 404  # refused before the chat was made
    ag_tool = {"name": TOOL["name"], "description": TOOL["description"], "parameters": {"type": "object"}}
    async with client.post("/ag-ui/research", json=agui_body("t-t", "hi", tools=[ag_tool])) as r:
        await refused(r, 422, "client_tools_refused")

    function = {"type": "function", "function": {"name": TOOL["name"], "parameters": {"type": "object"}}}
    chat = {"model": "research", "messages": [{"role": "user", "content": "hi"}], "tools": [function]}
    async with client.post("/v1/chat/completions", json=chat) as r:
        assert r.status == 400
        error = (await r.json())["error"]
        assert error["code"] == "client_tools_refused" and error["param"] == "tools"
    response = {"model": "research", "input": "hi", "tools": [{"type": "function", "name": TOOL["name"]}]}
    async with client.post("/v1/responses", json=response) as r:
        assert r.status == 400
        error = (await r.json())["error"]
        assert error["code"] == "client_tools_refused" and error["param"] == "tools"

    # The agent that takes them still does, on the same faces.
    async with client.post("/api/chat", json=chat_body("c-s", "hi [emu:tokens=2]", tools=chat_tools)) as r:
        assert r.status == 200
        await r.read()
    async with client.post("/v1/chat/completions", json={**chat, "model": "support"}) as r:
        assert r.status == 200, await r.text()
