"""The page's side list of sessions in real headless Chromium, on a temporary SQLite database: two
chats listed newest first with their titles, switching between them, rename and delete that hold
after a reload, and the list and conversations still there after the service is restarted on the
same database file. Without a database the list stays hidden."""

from __future__ import annotations

from typing import Any

import aiohttp

from tests.browser.conftest import Served, ServedFactory
from tests.browser.test_client import EXPECTED, ask, open_page

FIRST = "What is the square root of 144?"
SECOND = "Say hello [emu:tokens=6]"

LISTED = """() => [...document.querySelectorAll('#session-list .session-item')].map(li => [
    li.dataset.sessionId,
    li.querySelector('.session-title')?.textContent ?? null,
    li.getAttribute('aria-current') === 'true',
])"""


async def listed(page: Any) -> list[list[Any]]:
    return list(await page.evaluate(LISTED))


async def wait_listed(page: Any, expected: list[tuple[str, str]]) -> None:
    """Wait until the list shows exactly ``expected`` (id, title), in that order."""
    want = [list(pair) for pair in expected]
    await page.wait_for_function(
        f"(want) => JSON.stringify(({LISTED})().map(([id, title]) => [id, title])) === JSON.stringify(want)",
        arg=want,
        timeout=15_000,
    )


async def wait_done(page: Any, count: int) -> None:
    await page.wait_for_function(
        "(n) => document.querySelectorAll('.answer[data-done=\"true\"]').length === n",
        arg=count,
        timeout=15_000,
    )


async def shown_conversation(page: Any) -> list[str]:
    """The user messages and answers on screen, in order."""
    return list(
        await page.evaluate(
            """() => [...document.querySelectorAll('#transcript .user-text, #transcript .answer-text')]
                .map(node => node.textContent.trim())"""
        )
    )


async def switch_to(page: Any, session_id: str) -> None:
    await page.click(f'#session-list .session-item[data-session-id="{session_id}"] .session-open')
    await page.wait_for_function("(id) => window.agentstream.sessionId === id", arg=session_id)
    await wait_done(page, 1)


async def test_the_side_list_keeps_chats_across_reloads_and_restarts(
    browser: Any, make_served: ServedFactory, tmp_path: Any
) -> None:
    database_url = f"sqlite+aiosqlite:///{tmp_path}/page.db"
    served = await make_served(database_url=database_url)
    page = await open_page(browser, served, "?transport=ws")
    await page.wait_for_function("window.agentstream.sessionList === true")
    assert await page.locator("#sidelist").is_visible()
    first = await page.evaluate("window.agentstream.sessionId")
    await wait_listed(page, [(first, "New chat")])  # listed at once, untitled until its first query

    await ask(page, FIRST)
    await wait_done(page, 1)
    await wait_listed(page, [(first, FIRST)])

    await page.click("#side-new-chat")
    await page.wait_for_function("(id) => window.agentstream.sessionId !== id", arg=first)
    second = await page.evaluate("window.agentstream.sessionId")
    assert await page.locator("#transcript .user-message").count() == 0
    await ask(page, SECOND)
    await wait_done(page, 1)
    second_answer = (await shown_conversation(page))[1]
    await wait_listed(page, [(second, "Say hello [emu:tokens=6]"), (first, FIRST)])  # newest first
    assert [row[2] for row in await listed(page)] == [True, False]  # the one on screen is marked
    assert await page.locator("#session-list .session-time").first.inner_text()

    await switch_to(page, first)
    assert await shown_conversation(page) == [FIRST, EXPECTED]
    assert await page.locator(".tool-call .tool-name").inner_text() == "calculator"
    assert await page.locator("#notice").inner_text() == ""
    await switch_to(page, second)
    assert await shown_conversation(page) == [SECOND, second_answer]
    await switch_to(page, first)
    assert "session=" + first in page.url

    # Rename the first (Enter keeps it), delete the second (after the browser's confirm).
    await page.click(f'.session-item[data-session-id="{first}"] .session-rename')
    await page.fill(".session-title-input", "Square roots")
    await page.press(".session-title-input", "Enter")
    await wait_listed(page, [(first, "Square roots"), (second, SECOND)])  # a rename updates it
    page.once("dialog", lambda dialog: dialog.accept())
    await page.click(f'.session-item[data-session-id="{second}"] .session-delete')
    await wait_listed(page, [(first, "Square roots")])
    async with aiohttp.ClientSession() as http:
        async with http.get(served.url + f"sessions/{second}") as response:
            assert response.status == 404

    await page.reload()
    await page.wait_for_function("window.agentstream.sessionList === true")
    await wait_listed(page, [(first, "Square roots")])
    await wait_done(page, 1)
    assert await shown_conversation(page) == [FIRST, EXPECTED]

    # The service restarts on the same database file (a new process would do the same: nothing
    # of the sessions is left in memory).
    await served.server.close()
    again = await make_served(database_url=database_url)
    await page.goto(again.url + f"?transport=sse&session={first}")
    await page.wait_for_function("window.agentstream.sessionList === true")
    await wait_listed(page, [(first, "Square roots")])
    await wait_done(page, 1)
    assert await shown_conversation(page) == [FIRST, EXPECTED]
    assert await page.locator("#notice").inner_text() == ""  # nothing the reader had was lost

    # The chat goes on after the restart, and the list follows it.
    await ask(page, "And of 169?")
    await wait_done(page, 2)
    assert (await shown_conversation(page))[2] == "And of 169?"
    await page.click("#side-new-chat")
    await page.wait_for_function("(id) => window.agentstream.sessionId !== id", arg=first)
    third = await page.evaluate("window.agentstream.sessionId")
    await wait_listed(page, [(third, "New chat"), (first, "Square roots")])
    await page.close()


async def test_deleting_the_chat_on_screen_opens_a_new_one(
    browser: Any, make_served: ServedFactory, tmp_path: Any
) -> None:
    served = await make_served(database_url=f"sqlite+aiosqlite:///{tmp_path}/page.db")
    page = await open_page(browser, served, "?transport=sse")
    first = await page.evaluate("window.agentstream.sessionId")
    await ask(page, FIRST)
    await wait_done(page, 1)
    await wait_listed(page, [(first, FIRST)])
    page.once("dialog", lambda dialog: dialog.accept())
    await page.click(f'.session-item[data-session-id="{first}"] .session-delete')
    await page.wait_for_function(
        "(id) => window.agentstream.sessionId && window.agentstream.sessionId !== id", arg=first
    )
    fresh = await page.evaluate("window.agentstream.sessionId")
    await wait_listed(page, [(fresh, "New chat")])
    assert await page.locator("#transcript .user-message").count() == 0
    await page.close()


async def test_more_sessions_load_on_demand(browser: Any, make_served: ServedFactory, tmp_path: Any) -> None:
    served = await make_served(database_url=f"sqlite+aiosqlite:///{tmp_path}/page.db")
    made = []
    async with aiohttp.ClientSession() as http:
        for _ in range(22):
            async with http.post(served.url + "sessions", json={}) as response:
                made.append((await response.json())["id"])
    page = await open_page(browser, served, f"?session={made[0]}")
    await page.wait_for_function("document.querySelectorAll('#session-list .session-item').length === 20")
    assert await page.locator("#more-sessions").is_visible()
    await page.click("#more-sessions")
    await page.wait_for_function("document.querySelectorAll('#session-list .session-item').length === 22")
    assert sorted(row[0] for row in await listed(page)) == sorted(made)
    assert await page.locator("#more-sessions").is_hidden()
    await page.close()


async def test_without_a_database_the_list_is_hidden(browser: Any, served: Served) -> None:
    page = await open_page(browser, served, "?transport=ws")
    await page.wait_for_function("window.agentstream.sessionList === false")
    assert await page.locator("#sidelist").is_hidden()
    await ask(page, FIRST)
    await wait_done(page, 1)
    assert await shown_conversation(page) == [FIRST, EXPECTED]
    await page.close()
