"""The page with several agents, in real headless Chromium: a select by "New chat" picks the agent
of a new chat (an empty chat on screen is made again for the agent picked), the session line names
the chat's agent, the query runs on that agent's model, and a chat opened again shows its own
agent whatever is picked. With one agent neither the select nor the agent shows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp

from service.app import SERVICES
from tests.browser.conftest import Served, ServedFactory
from tests.browser.test_client import ask, open_page

AGENTS = """
[agents.support]
description = "Answers with the calculator."
provider = "emulator"
model = "support-model"
tools = ["calculator"]

[agents.research]
description = "Reads and answers."
provider = "openai"
base_url = "emulator"
api_key = "emulator"
model = "research-model"
tools = []
"""


async def server_agent(served: Served, session_id: str) -> str:
    async with aiohttp.ClientSession() as http, http.get(f"{served.url}sessions/{session_id}") as response:
        assert response.status == 200
        return (await response.json())["agent"]


async def wait_agent(page: Any, agent: str, other_than: str | None = None) -> str:
    """Wait until the page shows a session of ``agent`` (not ``other_than``); its id."""
    await page.wait_for_function(
        "([agent, old]) => window.agentstream.agent === agent && window.agentstream.sessionId !== old"
        " && document.querySelector('#status').textContent.includes('live')",
        arg=[agent, other_than],
        timeout=15_000,
    )
    return str(await page.evaluate("window.agentstream.sessionId"))


async def test_the_person_picks_the_agent_of_a_new_chat(
    browser: Any, make_served: ServedFactory, tmp_path: Path
) -> None:
    path = tmp_path / "agents.toml"
    path.write_text(AGENTS, encoding="utf-8")
    served = await make_served(agents_file=str(path))
    page = await open_page(browser, served, "?transport=ws")

    first = await wait_agent(page, "support")
    choice = page.locator("#agent-choice")
    assert await choice.is_visible()
    assert await choice.locator("option").all_inner_texts() == ["support", "research"]
    assert await page.locator("#session-agent").inner_text() == "agent support"
    assert await page.evaluate("window.agentstream.agents") == ["support", "research"]

    # Picked on an empty chat: that chat is made again, for the agent picked.
    await choice.select_option("research")
    research = await wait_agent(page, "research", first)
    assert await page.locator("#session-agent").inner_text() == "agent research"
    await ask(page, "Say hello to research [emu:tokens=4]")
    await page.locator('.answer[data-done="true"]').wait_for(timeout=15_000)
    assert await server_agent(served, research) == "research"
    records = served.app[SERVICES].emulator.records()
    assert [r.model_id for r in records if "hello to research" in r.user_text] == ["research-model"]

    # New chat keeps the pick; picking another agent once the chat holds a conversation waits
    # for the next new chat.
    await page.click("#new-chat")
    second = await wait_agent(page, "research", research)
    assert await server_agent(served, second) == "research"
    await ask(page, "Again [emu:tokens=2]")
    await page.locator('.answer[data-done="true"]').wait_for(timeout=15_000)
    await choice.select_option("support")
    assert await page.evaluate("window.agentstream.sessionId") == second
    await page.click("#new-chat")
    third = await wait_agent(page, "support", second)
    assert await server_agent(served, third) == "support"

    # A chat opened again shows its own agent, whatever is picked.
    await page.goto(f"{served.url}?transport=ws&session={research}")
    await wait_agent(page, "research")
    assert await page.locator("#session-agent").inner_text() == "agent research"
    await page.close()


async def test_one_agent_shows_no_choice(browser: Any, served: Served) -> None:
    page = await open_page(browser, served, "?transport=sse")
    await page.wait_for_function("window.agentstream.agent === 'default'")
    assert await page.evaluate("window.agentstream.agents") == ["default"]
    assert not await page.locator("#agent-choice").is_visible()
    assert not await page.locator("#session-agent").is_visible()
    await page.close()
