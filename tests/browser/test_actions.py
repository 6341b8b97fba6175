"""A chat UI's actions on the page, in real headless Chromium: Regenerate on the last answer, Edit
on a question, both through the service's rewind, so every tab open on the session (and a front
end on another origin) sees the same conversation as ``GET /sessions/{id}``; a browser-side tool's
call shown waiting; an answer cut short shown as interrupted after the service restarts.

The page keys each message on screen by the conversation's id for it (``data-message-id``); the
tests compare those ids with the service's. Nothing sleeps: every wait is on the page's state.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import aclosing
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from service.app import SERVICES
from tests.browser.conftest import Served, ServedFactory
from tests.browser.test_client import ask, open_page

# An idle SSE page asks this often whether the session moved on elsewhere (its default is 5 s).
IDLE = "idle_check_ms=100"
LOCATION = {"name": "get_location", "description": "Where the user is", "input_schema": {"type": "object"}}

# The transcript as [kind, message id, text] rows: "user" for a question, "answer" for an answer.
SHOWN = """() => [...document.querySelectorAll('#transcript > .user-message, #transcript > .answer')]
    .map(node => [
        node.classList.contains('answer') ? 'answer' : 'user',
        node.dataset.messageId || null,
        node.querySelector(':scope > .user-text, :scope > .answer-text').textContent.trim(),
    ])"""


async def shown(page: Any) -> list[list[Any]]:
    return list(await page.evaluate(SHOWN))


async def conversation(served: Served, session_id: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.get(served.url + f"sessions/{session_id}") as response:
        assert response.status == 200, await response.text()
        return await response.json()  # type: ignore[no-any-return]


async def post(served: Served, path: str, body: dict[str, Any]) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.post(served.url + path.lstrip("/"), json=body) as response,
    ):
        assert response.status in (200, 202), await response.text()
        return await response.json()  # type: ignore[no-any-return]


def expected_rows(body: dict[str, Any]) -> list[list[Any]]:
    """The rows a page should show for a conversation: each question, and each answer under the
    id of its first assistant message (tool results and later turns belong to that answer)."""
    rows: list[list[Any]] = []
    for message in body["messages"]:
        if any("toolResult" in block for block in message["content"]):
            continue
        text = "".join(block.get("text", "") for block in message["content"]).strip()
        if message["role"] == "user":
            rows.append(["user", message["id"], text])
        elif rows and rows[-1][0] == "user":
            rows.append(["answer", message["id"], text])
        else:
            rows[-1][2] = (rows[-1][2] + text).strip()
    return rows


async def wait_idle_with(page: Any, answers: int, not_ids: Sequence[str] = ()) -> None:
    """Wait until the page shows ``answers`` finished answers, no query runs, and the last answer's
    id is none of ``not_ids`` (a rewound answer is gone, its replacement finished)."""
    await page.wait_for_function(
        """([n, old]) => {
            const answers = document.querySelectorAll('#transcript > .answer');
            const last = answers[answers.length - 1];
            return answers.length === n && !window.agentstream.running && last
                && last.dataset.done === 'true' && !old.includes(last.dataset.messageId);
        }""",
        arg=[answers, list(not_ids)],
        timeout=20_000,
    )


async def asked(page: Any, text: str, answers: int) -> None:
    await ask(page, text)
    await wait_idle_with(page, answers)


@pytest.mark.parametrize("transport", ["ws", "sse"])
async def test_regenerate_answers_the_last_question_again(
    browser: Any, served: Served, transport: str
) -> None:
    page = await open_page(browser, served, f"?transport={transport}")
    await asked(page, "Tell me a story [emu:tokens=6]", 1)
    await asked(page, "Say hello [emu:tokens=4]", 2)
    session_id = await page.evaluate("window.agentstream.sessionId")
    before = await conversation(served, session_id)
    assert await shown(page) == expected_rows(before)
    # Offered on the last answer only.
    regenerate = page.locator("#transcript > .answer .regenerate")
    assert [await regenerate.nth(i).is_visible() for i in range(2)] == [False, True]

    await regenerate.nth(1).click()
    old = [row[1] for row in expected_rows(before) if row[0] == "answer"]
    await wait_idle_with(page, 2, old)
    after = await conversation(served, session_id)
    assert await shown(page) == expected_rows(after)
    assert [m["id"] for m in after["messages"]][:3] == [m["id"] for m in before["messages"]][:3]
    assert len(after["messages"]) == 4 and after["messages"][3]["id"] not in old
    assert after["messages"][2] == before["messages"][2]  # the question asked again, not a new one
    await page.close()


async def test_edit_asks_the_new_words_in_place_of_the_old(browser: Any, served: Served) -> None:
    page = await open_page(browser, served, "?transport=ws")
    await asked(page, "Name a fruit [emu:tokens=5]", 1)
    await asked(page, "Name a city [emu:tokens=5]", 2)
    session_id = await page.evaluate("window.agentstream.sessionId")
    first_id = (await conversation(served, session_id))["messages"][0]["id"]

    first = page.locator("#transcript > .user-message").first
    await first.locator(".edit-message").click()
    editor = first.locator(".edit-text")
    assert await editor.input_value() == "Name a fruit [emu:tokens=5]"
    await editor.fill("Name a colour [emu:tokens=5]")
    await first.locator(".edit-save").click()
    await page.wait_for_function(
        "() => document.querySelectorAll('#transcript > .user-message').length === 1", timeout=20_000
    )
    await wait_idle_with(page, 1)
    body = await conversation(served, session_id)
    rows = await shown(page)
    assert rows == expected_rows(body)
    assert rows[0] == ["user", first_id, "Name a colour [emu:tokens=5]"]  # the edited message keeps its id
    assert len(body["messages"]) == 2
    assert await page.locator(".edit-form").count() == 0

    # Escape leaves a message as it was.
    await page.locator(".edit-message").click()
    await page.press(".edit-text", "Escape")
    assert await page.locator(".edit-form").count() == 0
    assert await shown(page) == rows
    await page.close()


@pytest.mark.parametrize("transport", ["ws", "sse"])
async def test_a_rewind_from_another_tab_or_origin_redraws_every_tab(
    browser: Any, make_served: ServedFactory, aiohttp_server: Any, transport: str
) -> None:
    front_end = web.Application()

    async def index(_: web.Request) -> web.Response:
        return web.Response(text="<!doctype html><title>front end</title>", content_type="text/html")

    front_end.router.add_get("/", index)
    origin = str((await aiohttp_server(front_end)).make_url("")).rstrip("/")
    served = await make_served(allowed_origins=[origin])

    page = await open_page(browser, served, f"?transport={transport}&{IDLE}")
    await asked(page, "Name a fruit [emu:tokens=5]", 1)
    await asked(page, "Name a city [emu:tokens=5]", 2)
    session_id = await page.evaluate("window.agentstream.sessionId")
    other = await open_page(browser, served, f"?transport={transport}&{IDLE}&session={session_id}")
    await wait_idle_with(other, 2)
    old = [row[1] for row in await shown(page) if row[0] == "answer"]

    # The second tab edits the second question; the first tab redraws from the rewind.
    second = other.locator("#transcript > .user-message").nth(1)
    await second.locator(".edit-message").click()
    await second.locator(".edit-text").fill("Name a river [emu:tokens=5]")
    await second.locator(".edit-save").click()
    for tab in (page, other):
        await wait_idle_with(tab, 2, old)
    body = await conversation(served, session_id)
    assert [row[2] for row in expected_rows(body) if row[0] == "user"] == [
        "Name a fruit [emu:tokens=5]",
        "Name a river [emu:tokens=5]",
    ]
    assert await shown(page) == await shown(other) == expected_rows(body)

    # A front end on another origin regenerates the last answer: both tabs follow.
    last = body["messages"][-1]["id"]
    script = """async ({base, sessionId, answerId}) => {
        const reply = await fetch(`${base}sessions/${sessionId}/messages`, {
            method: 'POST', headers: {'Content-Type': 'application/json'},
            body: JSON.stringify({regenerate: answerId}),
        });
        return reply.status;
    }"""
    front = await browser.new_page()
    await front.goto(origin + "/")
    assert (
        await front.evaluate(script, {"base": served.url, "sessionId": session_id, "answerId": last}) == 202
    )
    await front.close()
    for tab in (page, other):
        await wait_idle_with(tab, 2, [*old, last])
    body = await conversation(served, session_id)
    assert await shown(page) == await shown(other) == expected_rows(body)
    assert len(body["messages"]) == 4
    await other.close()
    await page.close()


@pytest.mark.parametrize("transport", ["ws", "sse"])
async def test_a_browser_tool_call_waits_then_shows_its_result(
    browser: Any, served: Served, transport: str
) -> None:
    page = await open_page(browser, served, f"?transport={transport}&{IDLE}")
    await asked(page, "Hello [emu:tokens=3]", 1)
    session_id = await page.evaluate("window.agentstream.sessionId")
    # Another front end, which runs get_location itself, asks in the same session.
    await post(
        served,
        f"sessions/{session_id}/messages",
        {"content": "Where am I? [emu:tool=get_location]", "tools": [LOCATION]},
    )
    wait = page.locator(".tool-call .client-wait")
    await wait.wait_for(timeout=15_000)
    card = page.locator(".tool-call")
    assert await card.locator(".tool-name").inner_text() == "get_location"
    assert await card.locator(".tool-where").inner_text() == "runs in the app"
    # While the query waits, nothing may cut the conversation back under it.
    assert await page.locator(".edit-message").first.is_disabled()
    assert await page.locator(".regenerate").first.is_disabled()
    assert await page.locator("#cancel").is_enabled()

    await page.reload()  # still waiting, rebuilt from the log
    await wait.wait_for(timeout=15_000)
    [pending] = (await conversation(served, session_id))["pending_tool_calls"]
    await post(
        served, f"sessions/{session_id}/tool-results/{pending['toolUseId']}", {"output": {"city": "Lyon"}}
    )

    await wait_idle_with(page, 2)
    assert await page.locator(".client-wait").count() == 0
    assert "Lyon" in await card.locator(".tool-result").inner_text()
    assert await page.locator(".edit-message").first.is_enabled()
    assert await shown(page) == expected_rows(await conversation(served, session_id))
    await page.close()


async def test_an_interrupted_answer_stays_marked_after_a_restart_and_can_be_regenerated(
    browser: Any, make_served: ServedFactory, tmp_path: Any
) -> None:
    database_url = f"sqlite+aiosqlite:///{tmp_path}/page.db"
    served = await make_served(database_url=database_url)
    page = await open_page(browser, served, "?transport=sse")
    await ask(page, "Tell me a long story [emu:tokens=400] [emu:tps=40]")
    await page.wait_for_function(
        "(document.querySelector('.answer .answer-text')?.textContent || '').split(' ').length > 5",
        timeout=15_000,
    )
    await page.click("#cancel")
    await wait_idle_with(page, 1)
    answer = page.locator("#transcript > .answer")
    assert await answer.get_attribute("data-interrupted") == "true"
    session_id = await page.evaluate("window.agentstream.sessionId")
    body = await conversation(served, session_id)
    assert body["messages"][1]["interrupted"] is True

    # Nothing of the session is left in memory: the page rebuilds it from the database.
    await served.server.close()
    again = await make_served(database_url=database_url)
    await page.goto(again.url + f"?transport=sse&session={session_id}")
    await wait_idle_with(page, 1)
    assert await answer.get_attribute("data-interrupted") == "true"
    assert await answer.locator(".answer-state").inner_text() == "interrupted"
    assert await shown(page) == expected_rows(body)

    await answer.locator(".regenerate").click()
    await wait_idle_with(page, 1, [body["messages"][1]["id"]])
    after = await conversation(again, session_id)
    assert "interrupted" not in after["messages"][1]
    assert await answer.get_attribute("data-interrupted") is None
    assert await shown(page) == expected_rows(after)
    await page.close()


async def test_an_answer_rebuilt_from_a_snapshot_mid_query_keeps_its_id(
    browser: Any, make_served: ServedFactory
) -> None:
    """A page that opens a session whose first events were purged rebuilds the running answer
    from the snapshot, under the answer's id, so a later rewind still finds it."""
    served = await make_served(session_events_max_bytes=8192)
    async with aiohttp.ClientSession() as http, http.post(served.url + "sessions", json={}) as response:
        session_id = (await response.json())["id"]
    session = await served.app[SERVICES].sessions.get(session_id)
    after = await session.log.last_id()
    await post(
        served,
        f"sessions/{session_id}/messages",
        {"content": "Tell me a long story [emu:tokens=400] [emu:tps=100]"},
    )
    async with aclosing(session.log.subscribe(after)) as batches:
        async for _ in batches:
            if await session.log.first_id() > 2:
                break

    page = await open_page(browser, served, f"?transport=ws&session={session_id}")
    # Keyed while it is still being written (the snapshot names it), not only once it is stored.
    keyed = await page.wait_for_function(
        """() => {
            const answer = document.querySelector('#transcript > .answer');
            return answer && !answer.dataset.done && answer.dataset.messageId;
        }""",
        timeout=15_000,
    )
    await wait_idle_with(page, 1)
    body = await conversation(served, session_id)
    assert await keyed.json_value() == body["messages"][1]["id"]
    assert await shown(page) == expected_rows(body)

    old = body["messages"][1]["id"]
    await post(served, f"sessions/{session_id}/messages", {"regenerate": old})
    await wait_idle_with(page, 1, [old])
    assert await shown(page) == expected_rows(await conversation(served, session_id))
    await page.close()
