"""The browser client in real headless Chromium: answers over WebSocket and SSE, reload, no loops."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from service.app import SERVICES
from tests.browser.conftest import Served

EXPECTED = "The square root of 144 is 12."


async def open_page(browser: Any, served: Served, query: str) -> Any:
    page = await browser.new_page()
    await page.goto(served.url + query)
    await page.wait_for_function(
        "document.querySelector('#status')?.textContent.includes('live')", timeout=15_000
    )
    return page


async def ask(page: Any, text: str) -> None:
    await page.fill("#message", text)
    await page.click("#send")


@pytest.mark.parametrize("transport", ["ws", "sse"])
async def test_an_answer_renders(browser: Any, served: Served, transport: str) -> None:
    page = await open_page(browser, served, f"?transport={transport}")
    await ask(page, "What is the square root of 144?")
    answer = page.locator('.answer[data-done="true"]')
    await answer.wait_for(timeout=15_000)
    assert await answer.locator(".answer-text").inner_text() == EXPECTED
    tool = page.locator(".tool-call")
    assert await tool.locator(".tool-name").inner_text() == "calculator"
    assert "sqrt(144)" in await tool.locator(".tool-input").inner_text()
    assert "12" in await tool.locator(".tool-result").inner_text()
    assert "tokens" in await page.locator("#usage").inner_text()
    assert await page.evaluate("window.agentstream.transport") == transport
    await page.close()


@pytest.mark.parametrize("transport", ["ws", "sse"])
async def test_reload_mid_answer_resumes_without_repeating_text(
    browser: Any, served: Served, transport: str
) -> None:
    page = await open_page(browser, served, f"?transport={transport}")
    await ask(page, "Tell me a long story [emu:tokens=120] [emu:tps=40]")
    await page.wait_for_function(
        "(document.querySelector('.answer .answer-text')?.textContent || '').split(' ').length > 10",
        timeout=15_000,
    )
    session_id = await page.evaluate("window.agentstream.sessionId")
    await page.reload()
    # The page adopts the session from its URL once the server has confirmed it exists.
    await page.wait_for_function("(id) => window.agentstream.sessionId === id", arg=session_id)
    answer = page.locator('.answer[data-done="true"]')
    await answer.wait_for(timeout=20_000)
    session = await served.app[SERVICES].sessions.get(session_id)
    full = "".join(block["text"] for block in session.messages[-1]["content"] if "text" in block)
    assert await page.locator(".answer").count() == 1
    assert await answer.locator(".answer-text").inner_text() == full
    assert await page.locator(".user-message").count() == 1
    await page.close()


async def test_eventsource_does_not_reconnect_in_a_loop_after_done(browser: Any, served: Served) -> None:
    """A plain EventSource that never closes itself: the server's 204 stops it after done."""
    page = await browser.new_page()
    await page.goto(served.url + "?transport=sse")
    async with aiohttp.ClientSession() as http:
        async with http.post(served.url + "sessions", json={}) as response:
            session_id = (await response.json())["id"]
        async with http.post(
            served.url + f"sessions/{session_id}/messages", json={"content": "hi [emu:tokens=5]"}
        ):
            pass
    await page.evaluate(
        """(id) => new Promise(resolve => {
            window.seen = [];
            const source = new EventSource(`/sessions/${id}/events?last_event_id=0`);
            source.addEventListener('done', () => resolve());
            window.naive = source;  // never closed by the page
        })""",
        session_id,
    )

    def event_requests() -> list[tuple[str, str, int]]:
        return [r for r in served.requests if r[1].startswith(f"/sessions/{session_id}/events")]

    # The browser reconnects once with Last-Event-ID, gets 204, and gives up for good:
    # readyState CLOSED (2) is final, an EventSource never reconnects from it by itself.
    await page.wait_for_function("window.naive.readyState === 2", timeout=15_000)
    assert [status for _, _, status in event_requests()] == [200, 204]
    await page.close()


async def test_the_connection_check_reports_a_live_path(browser: Any, served: Served) -> None:
    """The page reads /selftest/stream and tells the user whether the path holds streams back."""
    page = await open_page(browser, served, "?transport=sse")
    await page.click("#selftest")
    await page.wait_for_function("window.agentstream.selftest !== undefined", timeout=15_000)
    result = await page.evaluate("window.agentstream.selftest")
    assert result["ticks"] == 10 and result["ended"] is True
    assert result["buffered"] is False and result["compressed"] is False
    assert result["tookMs"] >= 900  # ten ticks 100 ms apart: they came as written, not at once
    notice = await page.locator("#notice").inner_text()
    assert notice.startswith("Connection check: streams arrive live")
    await page.close()
