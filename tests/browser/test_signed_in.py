"""The page for a signed-in person, in real headless Chromium: a token handed as ``/#token=``
is taken (and taken out of the address bar), the answer streams under it, the session is that
user's alone, and a token that expires is said to have expired rather than failing silently."""

from __future__ import annotations

import time
from typing import Any

import aiohttp
import jwt
import pytest

from tests.browser.conftest import ServedFactory

SECRET = "a secret of thirty-two bytes, at the very least"


def token(sub: str, lifetime_s: int) -> str:
    return jwt.encode({"sub": sub, "exp": int(time.time()) + lifetime_s}, SECRET, algorithm="HS256")


@pytest.mark.parametrize("transport", ["ws", "sse"])
async def test_a_signed_in_person_chats_with_the_token_the_app_handed_over(
    browser: Any, make_served: ServedFactory, transport: str
) -> None:
    served = await make_served(jwt_secret=SECRET)
    page = await browser.new_page()
    await page.goto(f"{served.url}?transport={transport}#token={token('alice', 600)}")
    await page.wait_for_function("document.querySelector('#status')?.textContent.includes('live')")
    assert "token=" not in page.url  # out of the address bar: not bookmarked, not shared
    await page.fill("#message", "What is the square root of 144?")
    await page.click("#send")
    answer = page.locator('.answer[data-done="true"]')
    await answer.wait_for(timeout=15_000)
    assert "12" in await answer.locator(".answer-text").inner_text()
    session_id = await page.evaluate("window.agentstream.sessionId")
    # Another person's token: the session is not theirs to see.
    async with aiohttp.ClientSession() as http:
        bob = {"Authorization": f"Bearer {token('bob', 600)}"}
        async with http.get(f"{served.url}sessions/{session_id}", headers=bob) as reply:
            assert reply.status == 404
    await page.close()


async def test_an_expired_sign_in_is_said_so(browser: Any, make_served: ServedFactory) -> None:
    served = await make_served(jwt_secret=SECRET, jwt_leeway_s=0)
    page = await browser.new_page()
    await page.goto(f"{served.url}?transport=sse#token={token('alice', -5)}")
    message = page.locator("#auth-message")
    await message.wait_for(state="visible", timeout=15_000)
    assert "sign-in has expired" in await message.inner_text()
    await page.close()
