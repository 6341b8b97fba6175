"""The protocols' own, unmodified clients against the service on a real port (embedded emulator).

npm ``ai`` 6 and 7 (``DefaultChatTransport`` + ``readUIMessageStream``, as ``useChat`` uses them) and
npm ``@ag-ui/client`` (``HttpAgent``), run by ``node`` from tests/node/. Without Node or the
packages these tests skip, or fail with ``CI=true`` (see :mod:`tests.support.node`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from tests.conftest import ClientFactory
from tests.support.node import AI_MAJORS, require_node, run_node
from tests.transports.test_agents_faces import AGENTS


@pytest.fixture(params=AI_MAJORS, ids=[f"ai{major}" for major in AI_MAJORS])
def ai(request: pytest.FixtureRequest) -> int:
    """The major version of npm ``ai`` the AI SDK's scripts run on: every such test runs on both."""
    return int(request.param)


def base_url(client: TestClient) -> str:
    return str(client.make_url("")).rstrip("/")


def parts_of(message: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [part for part in message["parts"] if part["type"] == kind]


async def test_default_chat_transport_assembles_the_answer(client: TestClient, ai: int) -> None:
    require_node()
    result = await run_node(
        "aisdk_chat.mjs", base_url(client), "chat-calc", "What is 12*7?", "Say hello", ai=ai
    )
    first, second = result["turns"]
    assert first["errors"] == [] and second["errors"] == []
    message = first["message"]
    assert message["role"] == "assistant"
    (tool,) = parts_of(message, "dynamic-tool")
    assert tool["toolName"] == "calculator"
    assert tool["state"] == "output-available"
    assert tool["input"] == {"expression": "12*7"}
    assert tool["output"] == "84"
    assert "".join(part["text"] for part in parts_of(message, "text")) == "The result is 84."
    assert len(parts_of(message, "step-start")) == 2  # the tool turn, then the answer
    session = await (await client.get("/sessions/chat-calc")).json()
    # The usage in finish's metadata is the query's, as the log's done has it.
    poll = await (await client.get("/sessions/chat-calc/events/poll?since_index=0")).json()
    done = [event for event in poll["events"] if event["type"] == "done"]
    assert message["metadata"]["usage"] == done[0]["usage"]
    assert message["metadata"]["usage"]["total_tokens"] > 0
    assert first["chunks"][0] == "start" and first["chunks"][-1] == "finish"
    # The second message went to the same session: the server's conversation holds both queries.
    assert parts_of(second["message"], "text")
    assert [m["role"] for m in session["messages"]] == ["user", "assistant"] * 3  # the tool turn is two


async def test_reconnect_to_stream_resumes_then_finds_nothing(make_client: ClientFactory, ai: int) -> None:
    require_node()
    # The tool never answers (and does not time out here): the query runs until it is stopped.
    client = await make_client(tool_timeout_s=60)
    result = await run_node(
        "aisdk_resume.mjs", base_url(client), "chat-resume", "Use a tool [emu:tool=sleepy]", ai=ai
    )
    assert result["firstChunks"][0] == "start" and result["firstChunks"][-1] == "tool-input-start"
    resumed = result["resumedChunks"]
    # From the query's first part, whatever the cut stream had seen.
    assert resumed[:3] == ["start", "start-step", "tool-input-start"]
    assert resumed[-2:] == ["abort", "finish"]
    assert result["cancelStatus"] == 202
    (tool,) = parts_of(result["message"], "dynamic-tool")
    assert tool["toolName"] == "sleepy" and tool["state"] == "input-available"
    assert result["message"]["metadata"]["cancelled"] is True
    assert result["againIsNull"] is True  # the query is over: a 204


async def test_http_agent_runs_and_gets_messages(client: TestClient) -> None:
    require_node()
    result = await run_node(
        "agui_run.mjs", base_url(client), "thread-1", "What is 12*7?", "Say hello [emu:reasoning]"
    )
    first, second = result["runs"]
    types = [event["type"] for event in first["events"]]
    assert types[:3] == ["RUN_STARTED", "MESSAGES_SNAPSHOT", "STEP_STARTED"]
    assert types[-1] == "RUN_FINISHED"
    for kind in ("TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "TOOL_CALL_RESULT"):
        assert kind in types
    for kind in ("TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END", "STEP_FINISHED"):
        assert kind in types
    assert first["result"]["output"] == "The result is 84."
    messages = first["messages"]
    call = next(m for m in messages if m["role"] == "assistant" and m.get("toolCalls"))
    assert call["toolCalls"][0]["function"]["name"] == "calculator"
    assert any(m["role"] == "tool" and m["content"] == "84" for m in messages)
    assert any(m["role"] == "assistant" and m.get("content") == "The result is 84." for m in messages)
    # The second run's snapshot is the server's conversation: the first query, then the new one.
    snapshot = second["events"][1]
    assert snapshot["type"] == "MESSAGES_SNAPSHOT"
    assert [m["role"] for m in snapshot["messages"]] == ["user", "assistant", "tool", "assistant", "user"]
    second_types = [event["type"] for event in second["events"]]
    for kind in ("REASONING_START", "REASONING_MESSAGE_CONTENT", "REASONING_END"):
        assert kind in second_types
    assert any(m["role"] == "reasoning" for m in second["messages"])
    assert second_types[-1] == "RUN_FINISHED"


async def test_the_real_clients_name_the_agent(make_client: ClientFactory, tmp_path: Path, ai: int) -> None:
    """``DefaultChatTransport``'s ``body`` option names the chat's agent, and an ``HttpAgent`` on
    an agent's URL runs that agent: each session is the agent's, and so is its ``done``."""
    require_node()
    path = tmp_path / "agents.toml"
    path.write_text(AGENTS, encoding="utf-8")
    client = await make_client(agents_file=str(path))
    env = {"AGENT_NAME": "research"}
    chat = await run_node(
        "aisdk_chat.mjs", base_url(client), "chat-agent", "Hi [emu:tokens=3]", env=env, ai=ai
    )
    assert chat["turns"][0]["errors"] == []
    run = await run_node("agui_run.mjs", base_url(client), "thread-agent", "Hi [emu:tokens=3]", env=env)
    assert run["runs"][0]["events"][-1]["type"] == "RUN_FINISHED"
    for session_id in ("chat-agent", "thread-agent"):
        session = await (await client.get(f"/sessions/{session_id}")).json()
        assert session["agent"] == "research"
        poll = await (await client.get(f"/sessions/{session_id}/events/poll")).json()
        assert [e["agent"] for e in poll["events"] if e["type"] == "done"] == ["research"]


CALC_APPROVAL = 'Sum it [emu:tool=calculator] [emu:tool_input={"expression": "6*7"}]'


async def test_ai_sdk_chat_answers_a_tool_approval_and_the_query_goes_on(
    make_client: ClientFactory, ai: int
) -> None:
    require_node()
    client = await make_client(tools_require_approval="calculator", approval_timeout_s=60)
    result = await run_node(
        "aisdk_approval.mjs", base_url(client), "chat-approve", "true", CALC_APPROVAL, ai=ai
    )
    assert result["errors"] == []
    first, second = result["chunks"]
    assert "tool-approval-request" in first and first[-1] == "finish"
    (tool,) = parts_of(result["waiting"], "dynamic-tool")
    assert tool["state"] == "approval-requested" and tool["input"] == {"expression": "6*7"}
    assert result["complete"] is True
    # The approval's answer continued the same query in the same assistant message.
    assert "start" not in second and second[-1] == "finish"
    assert result["count"] == 2
    (tool,) = parts_of(result["final"], "dynamic-tool")
    assert tool["state"] == "output-available" and tool["output"] == "42"
    assert "42" in "".join(part["text"] for part in parts_of(result["final"], "text"))
    poll = await (await client.get("/sessions/chat-approve/events/poll?since_index=0")).json()
    responses = [event for event in poll["events"] if event["type"] == "tool_approval_response"]
    assert [(r["approved"], r["by"], r["reason"]) for r in responses] == [
        (True, "ai-sdk", "checked by a test")
    ]
    assert poll["events"][-1]["type"] == "done"


async def test_ai_sdk_chat_denial_is_tool_output_denied(make_client: ClientFactory, ai: int) -> None:
    require_node()
    client = await make_client(tools_require_approval="calculator", approval_timeout_s=60)
    result = await run_node(
        "aisdk_approval.mjs", base_url(client), "chat-deny", "false", CALC_APPROVAL, ai=ai
    )
    assert result["errors"] == []
    assert "tool-output-denied" in result["chunks"][1]
    (tool,) = parts_of(result["final"], "dynamic-tool")
    assert tool["state"] == "output-denied"


async def test_http_agent_is_interrupted_then_resumes_the_query(make_client: ClientFactory) -> None:
    require_node()
    client = await make_client(tools_require_approval="calculator", approval_timeout_s=60)
    result = await run_node("agui_approval.mjs", base_url(client), "thread-approve", "true", CALC_APPROVAL)
    first, second = result["runs"]
    finished = first["events"][-1]
    assert finished["type"] == "RUN_FINISHED"
    (interrupt,) = finished["outcome"]["interrupts"]
    assert finished["outcome"]["type"] == "interrupt"
    assert interrupt["reason"] == "tool_approval" and interrupt["metadata"]["toolName"] == "calculator"
    assert interrupt["metadata"]["toolInput"] == {"expression": "6*7"}
    assert [pending["id"] for pending in first["pending"]] == [interrupt["id"]]
    types = [event["type"] for event in second["events"]]
    assert types[0] == "RUN_STARTED" and second["events"][0]["runId"] == "run-2"
    assert "TOOL_CALL_RESULT" in types and types[-1] == "RUN_FINISHED"
    assert "outcome" not in second["events"][-1] or second["events"][-1]["outcome"]["type"] == "success"
    assert second["pending"] == []
    result_event = next(event for event in second["events"] if event["type"] == "TOOL_CALL_RESULT")
    assert result_event["content"] == "42"
    poll = await (await client.get("/sessions/thread-approve/events/poll?since_index=0")).json()
    responses = [event for event in poll["events"] if event["type"] == "tool_approval_response"]
    assert [(r["approved"], r["by"]) for r in responses] == [(True, "ag-ui")]


async def test_resume_on_a_new_chat_finds_nothing_then_the_chat_goes_on(
    make_client: ClientFactory, ai: int
) -> None:
    """``useChat({resume: true})`` resumes on mount, before the chat was ever posted: ready, no error."""
    require_node()
    client = await make_client(api_keys=["key-alice", "key-bob"])
    alice, bob = {"AGENT_KEY": "key-alice"}, {"AGENT_KEY": "key-bob"}
    result = await run_node(
        "aisdk_resume_new.mjs", base_url(client), "brand-new", "Say hello", env=alice, ai=ai
    )
    assert result["afterResume"] == {"status": "ready", "count": 0, "errors": []}
    assert result["afterSend"] == {"status": "ready", "count": 2, "errors": []}
    # Mounted again on the chat, now idle: still nothing to resume.
    result = await run_node("aisdk_resume_new.mjs", base_url(client), "brand-new", "", env=alice, ai=ai)
    assert result["afterResume"] == {"status": "ready", "count": 0, "errors": []}
    # Ids are per key: to Bob the id Alice holds is a new chat of his own, with nothing to resume.
    result = await run_node("aisdk_resume_new.mjs", base_url(client), "brand-new", "Hi", env=bob, ai=ai)
    assert result["afterResume"] == {"status": "ready", "count": 0, "errors": []}
    assert result["afterSend"] == {"status": "ready", "count": 2, "errors": []}
