"""Tool approvals in the browser page, in real headless Chromium: the pending call with its input
and Approve / Deny in every open tab, still there after a reload, gone from all tabs once one
answers, and the query resumed."""

from __future__ import annotations

from typing import Any

import pytest

from tests.browser.conftest import ServedFactory
from tests.browser.test_client import ask, open_page


@pytest.mark.parametrize("transport", ["ws", "sse"])
async def test_a_reload_still_shows_the_buttons_and_approving_resumes_the_run(
    browser: Any, make_served: ServedFactory, transport: str
) -> None:
    served = await make_served(tools_require_approval="calculator")
    page = await open_page(browser, served, f"?transport={transport}")
    await ask(page, "What is 6*7?")
    box = page.locator(".tool-call .approval")
    await box.wait_for(timeout=15_000)
    assert '"6*7"' in await page.locator(".tool-call .tool-input").inner_text()
    session_id = await page.evaluate("window.agentstream.sessionId")
    # A second tab on the same session sees the same pending call.
    other = await open_page(browser, served, f"?transport={transport}&session={session_id}")
    await other.locator(".tool-call .approval").wait_for(timeout=15_000)

    await page.reload()
    await page.wait_for_function("(id) => window.agentstream.sessionId === id", arg=session_id)
    await box.wait_for(timeout=15_000)
    assert await page.locator(".approval-approve").is_enabled()
    await page.click(".approval-approve")

    answer = page.locator('.answer[data-done="true"]')
    await answer.wait_for(timeout=15_000)
    assert "42" in await page.locator(".tool-call .tool-result").inner_text()
    assert await page.locator(".approval").count() == 0
    # The other tab cleared its buttons too, and saw the run resume.
    await other.locator('.answer[data-done="true"]').wait_for(timeout=15_000)
    assert await other.locator(".approval").count() == 0
    assert "42" in await other.locator(".tool-call .tool-result").inner_text()
    await other.close()
    await page.close()


async def test_deny_with_a_reason_from_the_page(browser: Any, make_served: ServedFactory) -> None:
    served = await make_served(tools_require_approval="*")
    page = await open_page(browser, served, "?transport=ws")
    await ask(page, "What is 6*7?")
    await page.locator(".approval").wait_for(timeout=15_000)
    await page.fill(".approval-reason", "not now")
    await page.click(".approval-deny")
    await page.locator('.answer[data-done="true"]').wait_for(timeout=15_000)
    card = page.locator(".tool-call")
    assert "not now" in await card.locator(".tool-result").inner_text()
    assert await page.locator(".approval").count() == 0
    await page.close()
