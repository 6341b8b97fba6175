"""Named agents through the running service: two agents on the embedded emulator, one on
Bedrock's wire and one on the OpenAI-compatible wire, with different prompts, tools and approval
policies. What each session's model requests carried is read from the emulator's records; the
reload is the catalog's own (what SIGHUP calls), under a query that runs; Redis with two
instances runs a session's agent wherever its query lands."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from tests.conftest import ClientFactory, services_of
from tests.support.redis_server import RedisServer
from tests.transports.test_approvals import answer, events_until_done, requests_of
from tests.transports.test_openai_chat import _close_openai_clients, openai_client  # noqa: F401 - its fixture closes the clients
from tests.transports.test_sessions import send

SUPPORT_PROMPT = "You are the support agent."
RESEARCH_PROMPT = "You are the research agent."

TWO_AGENTS = f"""
[agents.support]
description = "Answers questions about orders."
provider = "emulator"                 # Bedrock's wire
model = "support-model"
system_prompt = "{SUPPORT_PROMPT}"
tools = ["calculator"]
require_approval = ["calculator"]

[agents.research]
description = "Looks things up."
provider = "openai"                   # the OpenAI-compatible wire
base_url = "emulator"
api_key = "emulator"
model = "research-model"
system_prompt = "{RESEARCH_PROMPT}"
tools = []
"""

# The emulator calls the calculator for it, then answers from the result: two model turns.
CALCULATION = "What is 17 * 3?"


def agents_file(tmp_path: Path, text: str = TWO_AGENTS) -> Path:
    path = tmp_path / "agents.toml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
async def two_agents(make_client: ClientFactory, tmp_path: Path) -> TestClient:
    return await make_client(agents_file=str(agents_file(tmp_path)), approval_timeout_s=60)


async def new_session(client: TestClient, agent: str | None) -> str:
    body = {} if agent is None else {"agent": agent}
    async with client.post("/sessions", json=body) as response:
        assert response.status == 201, await response.text()
        made = await response.json()
    return str(made["id"])


async def agent_of(client: TestClient, session_id: str) -> str:
    async with client.get(f"/sessions/{session_id}") as response:
        return str((await response.json())["agent"])


def asked(client: TestClient, text: str) -> list[tuple[str, str, tuple[str, ...]]]:
    """What each model request for the prompt ``text`` carried: (model, system prompt, tools)."""
    return [
        (r.model_id, r.system, r.tools) for r in services_of(client).emulator.records() if r.user_text == text
    ]


def of_type(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [event for event in events if event["type"] == kind]


async def calculate_approved(
    client: TestClient, session_id: str, text: str = CALCULATION
) -> list[dict[str, Any]]:
    """Ask the support agent to calculate, approve its calculator call, and return the query's events."""
    await send(client, session_id, text)
    [request] = await requests_of(client, session_id)
    assert request.tool == "calculator"
    await answer(client, session_id, request.approval_id, {"approved": True})
    return await events_until_done(client, session_id)


async def test_each_agent_asks_with_its_own_prompt_model_and_tools(two_agents: TestClient) -> None:
    support = await new_session(two_agents, "support")
    research = await new_session(two_agents, "research")
    assert [await agent_of(two_agents, s) for s in (support, research)] == ["support", "research"]

    # support: the calculator is its own, behind its approval policy
    events = await calculate_approved(two_agents, support)
    [result] = of_type(events, "tool_result")
    assert (result["toolName"], result["result"], result["isError"]) == ("calculator", "51", False)
    assert of_type(events, "done")[0]["agent"] == "support"
    assert asked(two_agents, CALCULATION) == [("support-model", SUPPORT_PROMPT, ("calculator",))] * 2

    # research, on the OpenAI-compatible wire: no tools offered, nothing waits for approval
    text = "Tell me about tides [emu:tokens=4]"
    await send(two_agents, research, text)
    events = await events_until_done(two_agents, research)
    assert not of_type(events, "tool_approval_request")
    assert of_type(events, "done")[0]["agent"] == "research"
    assert asked(two_agents, text) == [("research-model", RESEARCH_PROMPT, ())]


@pytest.mark.parametrize(
    ("agent", "tool"),
    [
        ("research", "calculator"),  # the other agent's tool
        ("support", "explode"),  # a tool the service has that the agent was not given
    ],
)
async def test_an_agent_cannot_call_a_tool_it_was_not_given(
    two_agents: TestClient, agent: str, tool: str
) -> None:
    session_id = await new_session(two_agents, agent)
    text = f'Use {tool} [emu:tool={tool}] [emu:tool_input={{"expression": "2+2"}}]'
    await send(two_agents, session_id, text)
    events = await events_until_done(two_agents, session_id)
    [result] = of_type(events, "tool_result")
    # Run, the calculator would have said 4 and explode "the tool blew up"; it never ran, and
    # support's approval policy was never asked either.
    assert result["toolName"] == tool and result["isError"] is True
    assert result["result"].startswith(f"Unknown tool '{tool}'"), result["result"]
    assert not of_type(events, "tool_approval_request")
    # the model heard of the failure in its next turn, asked still with only the agent's tools
    own = ("calculator",) if agent == "support" else ()
    assert [tools for _, _, tools in asked(two_agents, text)] == [own, own]


async def test_the_agents_are_listed_on_agents_and_v1_models(two_agents: TestClient) -> None:
    async with two_agents.get("/agents") as response:
        body = await response.json()
    assert body["default"] == "support"
    assert [(a["name"], a["description"], a["provider"], a["model"], a["tools"]) for a in body["agents"]] == [
        ("support", "Answers questions about orders.", "emulator", "support-model", ["calculator"]),
        ("research", "Looks things up.", "openai", "research-model", []),
    ]
    api = openai_client(two_agents)
    assert [model.id for model in (await api.models.list()).data] == ["support", "research"]


async def test_the_openai_faces_run_the_agent_their_model_names(two_agents: TestClient) -> None:
    api = openai_client(two_agents)
    chat_text = "Chat with research [emu:tokens=3]"
    reply = await api.chat.completions.create(
        model="research", messages=[{"role": "user", "content": chat_text}]
    )
    assert reply.model == "research" and reply.choices[0].finish_reason == "stop"
    assert asked(two_agents, chat_text) == [("research-model", RESEARCH_PROMPT, ())]

    responses_text = "Respond as support [emu:tokens=3]"
    response = await api.responses.create(model="support", input=responses_text)
    assert response.model == "support" and response.status == "completed"
    assert asked(two_agents, responses_text) == [("support-model", SUPPORT_PROMPT, ("calculator",))]
    # the conversation goes on with its agent
    followed = "And more [emu:tokens=2]"
    await api.responses.create(model="support", input=followed, previous_response_id=response.id)
    assert asked(two_agents, followed) == [("support-model", SUPPORT_PROMPT, ("calculator",))]


async def test_a_reload_changes_later_queries_and_leaves_the_running_one_be(
    two_agents: TestClient, tmp_path: Path
) -> None:
    catalog = services_of(two_agents).catalog
    running = await new_session(two_agents, "support")
    # The query's first model turn ends in a calculator call that waits for approval: the reload
    # comes between its turns, and the second turn is asked after it.
    await send(two_agents, running, CALCULATION)
    [request] = await requests_of(two_agents, running)

    new_prompt = "You are the support agent, version two."
    added = '\n[agents.triage]\nprovider = "emulator"\nmodel = "triage-model"\nsystem_prompt = "Sort it."\ntools = []\n'
    agents_file(tmp_path, TWO_AGENTS.replace(SUPPORT_PROMPT, new_prompt) + added)
    assert await catalog.reload() is True

    await answer(two_agents, running, request.approval_id, {"approved": True})
    events = await events_until_done(two_agents, running)
    assert of_type(events, "tool_result")[0]["result"] == "51"
    # both turns of the running query were asked with the prompt it started with
    assert asked(two_agents, CALCULATION) == [("support-model", SUPPORT_PROMPT, ("calculator",))] * 2

    # new queries get the new definition: in the old session and in a new one
    again = "Once more [emu:tokens=2]"
    await send(two_agents, running, again)
    await events_until_done(two_agents, running)
    fresh = await new_session(two_agents, "support")
    fresh_text = "Fresh [emu:tokens=2]"
    await send(two_agents, fresh, fresh_text)
    await events_until_done(two_agents, fresh)
    for text in (again, fresh_text):
        assert asked(two_agents, text) == [("support-model", new_prompt, ("calculator",))]

    # the added agent is there, on every face
    triage = await new_session(two_agents, "triage")
    triage_text = "Triage this [emu:tokens=2]"
    await send(two_agents, triage, triage_text)
    done = of_type(await events_until_done(two_agents, triage), "done")
    assert done[0]["agent"] == "triage"
    assert asked(two_agents, triage_text) == [("triage-model", "Sort it.", ())]
    async with two_agents.get("/agents") as response:
        assert [a["name"] for a in (await response.json())["agents"]] == ["support", "research", "triage"]
    api = openai_client(two_agents)
    assert [model.id for model in (await api.models.list()).data] == ["support", "research", "triage"]
    # agents on an upstream that had one already: no new provider
    assert len(catalog.providers) == 2


@pytest.mark.parametrize(
    ("broken", "said"),
    [
        ('[agents.support]\nmax_turns = "ten"\n', "agent 'support', field 'max_turns'"),
        ("[agents.support\n", "not valid TOML"),
        ('[agents.support]\ntools = ["teleport"]\n', "no built-in tool named teleport"),
        (None, "cannot be read"),
    ],
)
async def test_a_broken_file_on_reload_leaves_everything_as_it_was(
    two_agents: TestClient, tmp_path: Path, caplog: pytest.LogCaptureFixture, broken: str | None, said: str
) -> None:
    catalog = services_of(two_agents).catalog
    async with two_agents.get("/agents") as response:
        before = await response.json()
    providers = list(catalog.providers)
    path = tmp_path / "agents.toml"
    if broken is None:
        path.unlink()
    else:
        path.write_text(broken, encoding="utf-8")

    with caplog.at_level(logging.ERROR, logger="service.agent.catalog"):
        assert await catalog.reload() is False
    [record] = [r for r in caplog.records if r.name == "service.agent.catalog"]
    assert record.levelno == logging.ERROR and said in record.getMessage()

    async with two_agents.get("/agents") as response:
        assert await response.json() == before
    assert catalog.providers == providers
    session_id = await new_session(two_agents, "support")
    text = "Still here [emu:tokens=2]"
    await send(two_agents, session_id, text)
    await events_until_done(two_agents, session_id)
    assert asked(two_agents, text) == [("support-model", SUPPORT_PROMPT, ("calculator",))]


@pytest.mark.slow
async def test_on_redis_a_session_runs_its_agent_on_the_other_instance(
    make_client: ClientFactory, own_redis: RedisServer, tmp_path: Path
) -> None:
    """Two instances on one Redis, one agents file: a session made on one for ``research`` runs
    ``research`` on the other (each instance has its own embedded emulator, so the records say
    which instance asked the model, and with what)."""
    shared = {"agents_file": str(agents_file(tmp_path)), "redis_url": own_redis.url, "redis_prefix": "agents"}
    first, second = await make_client(**shared), await make_client(**shared)
    session_id = await new_session(first, "research")
    assert await agent_of(second, session_id) == "research"
    text = "Research on the other instance [emu:tokens=3]"
    await send(second, session_id, text)
    done = of_type(await events_until_done(first, session_id), "done")
    assert done[0]["agent"] == "research"
    assert asked(second, text) == [("research-model", RESEARCH_PROMPT, ())]
    assert asked(first, text) == []
