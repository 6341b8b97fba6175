"""The page for a signed-in person, in real headless Chromium: a token handed as ``/#token=``
is taken (and taken out of the address bar), the answer streams under it, the session is that
user's alone, and a token that expires is said to have expired rather than failing silently."""

from __future__ import annotations

import time
from typing import Any

import aiohttp
import jwt
import pytest
from aiohttp import web

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


# Run in a page on another origin: a signed-in person's front end, with the token its identity
# provider gave it, streams a chat, follows the session with EventSource, and is refused another's.
CROSS_ORIGIN = """
async ({base, token, other, chatId}) => {
  const auth = {Authorization: `Bearer ${token}`};
  const chat = await fetch(`${base}api/chat`, {
    method: 'POST',
    headers: {...auth, 'Content-Type': 'application/json'},
    body: JSON.stringify({
      id: chatId, trigger: 'submit-message',
      messages: [{id: 'u1', role: 'user', parts: [{type: 'text', text: 'hello [emu:tokens=6]'}]}],
    }),
  });
  const body = await chat.text();
  const sessionId = (await (await fetch(`${base}sessions?limit=1`, {headers: auth})).json()).sessions[0].id;
  const events = await new Promise((resolve, reject) => {
    const seen = [];
    const source = new EventSource(`${base}sessions/${sessionId}/events?last_event_id=0&token=${token}`);
    source.addEventListener('done', () => { seen.push('done'); source.close(); resolve(seen); });
    source.addEventListener('assistant_text', () => seen.push('assistant_text'));
    source.onerror = () => { source.close(); reject(new Error(`EventSource failed after ${seen}`)); };
  });
  const theirs = await fetch(`${base}sessions/${sessionId}`, {headers: {Authorization: `Bearer ${other}`}});
  const expired = await fetch(`${base}sessions`, {headers: {Authorization: 'Bearer ' + token.slice(0, -4)}});
  return {
    chatStatus: chat.status, done: body.includes('[DONE]'), events,
    theirs: theirs.status,
    refused: {status: expired.status, challenge: expired.headers.get('WWW-Authenticate')},
  };
}
"""


async def test_a_front_end_on_another_origin_as_a_signed_in_person(
    browser: Any, make_served: ServedFactory, aiohttp_server: Any, tmp_path: Any
) -> None:
    page_app = web.Application()

    async def index(_: web.Request) -> web.Response:
        return web.Response(text="<!doctype html><title>front end</title>", content_type="text/html")

    page_app.router.add_get("/", index)
    page_origin = str((await aiohttp_server(page_app)).make_url("")).rstrip("/")
    served = await make_served(
        jwt_secret=SECRET,
        allowed_origins=[page_origin],
        database_url=f"sqlite+aiosqlite:///{tmp_path}/sessions.db",
    )
    page = await browser.new_page()
    try:
        await page.goto(page_origin + "/")
        arguments = {
            "base": served.url,
            "token": token("alice", 600),
            "other": token("bob", 600),
            "chatId": "c1",
        }
        result = await page.evaluate(CROSS_ORIGIN, arguments)
    finally:
        await page.close()
    assert result["chatStatus"] == 200 and result["done"]
    assert result["events"][-1] == "done" and "assistant_text" in result["events"]
    assert result["theirs"] == 404
    assert result["refused"]["status"] == 401
    assert result["refused"]["challenge"].startswith('Bearer error="invalid_token"')
