"""A front end on its own origin: a page served from another port streams the AI SDK's
``/api/chat``, follows a session with ``EventSource`` and reads the service's errors, in Chromium.

Chromium enforces CORS for real: a reply without the headers reaches the page as a bare
"Failed to fetch" (or an EventSource error), whatever the service sent.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from tests.browser.conftest import ServedFactory

PAGE = "<!doctype html><title>front end</title><p>a chat on its own origin</p>"

# Run in the page: every request below is cross-origin, with the key as a signed-in page holds it.
SCRIPT = """
async ({base, key, chatId}) => {
  const auth = {Authorization: `Bearer ${key}`};
  const out = {};
  const chat = await fetch(`${base}api/chat`, {
    method: 'POST',
    headers: {...auth, 'Content-Type': 'application/json'},
    body: JSON.stringify({
      id: chatId, trigger: 'submit-message',
      messages: [{id: 'u1', role: 'user', parts: [{type: 'text', text: 'hello [emu:tokens=6]'}]}],
    }),
  });
  out.chatStatus = chat.status;
  out.marker = chat.headers.get('x-vercel-ai-ui-message-stream');
  const reader = chat.body.getReader();
  const decoder = new TextDecoder();
  let body = '';
  for (;;) {
    const {done, value} = await reader.read();
    if (done) break;
    body += decoder.decode(value, {stream: true});
  }
  out.parts = body.split('\\n').map((l) => l.replace(/\\r$/, '')).filter((l) => l.startsWith('data: ')).map((l) => l.slice(6));

  const token = await (await fetch(`${base}auth/token`, {method: 'POST', headers: auth})).json();
  out.events = await new Promise((resolve, reject) => {
    const seen = [];
    const source = new EventSource(`${base}sessions/${chatId}/events?last_event_id=0&token=${token.token}`);
    source.addEventListener('done', (e) => { seen.push('done'); source.close(); resolve(seen); });
    source.addEventListener('assistant_text', () => seen.push('assistant_text'));
    source.onerror = () => { source.close(); reject(new Error(`EventSource failed after ${seen}`)); };
  });

  const missing = await fetch(`${base}sessions/no-such-session`, {headers: auth});
  out.missing = {status: missing.status, body: await missing.json()};
  const renamed = await fetch(`${base}sessions/${chatId}`, {
    method: 'PATCH', headers: {...auth, 'Content-Type': 'application/json'},
    body: JSON.stringify({title: 'renamed from another origin'}),
  });
  out.patchStatus = renamed.status;
  const unauthorised = await fetch(`${base}sessions`);
  out.unauthorised = {status: unauthorised.status, body: await unauthorised.json(),
                      challenge: unauthorised.headers.get('WWW-Authenticate')};
  return out;
}
"""


async def test_a_page_on_another_origin_streams_and_reads_errors(
    browser: Any, make_served: ServedFactory, aiohttp_server: Any, tmp_path: Any
) -> None:
    page_app = web.Application()

    async def index(_: web.Request) -> web.Response:
        return web.Response(text=PAGE, content_type="text/html")

    page_app.router.add_get("/", index)
    page_server = await aiohttp_server(page_app)
    page_origin = str(page_server.make_url("")).rstrip("/")
    served = await make_served(
        api_keys=["k1"],
        allowed_origins=[page_origin],
        database_url=f"sqlite+aiosqlite:///{tmp_path}/sessions.db",  # PATCH renames a recorded session
    )
    assert page_origin.rsplit(":", 1)[1] != served.url.rstrip("/").rsplit(":", 1)[1]

    page = await browser.new_page()
    try:
        await page.goto(page_origin + "/")
        result = await page.evaluate(SCRIPT, {"base": served.url, "key": "k1", "chatId": "cross-origin-chat"})
    finally:
        await page.close()

    assert result["chatStatus"] == 200 and result["marker"] == "v1"
    assert result["parts"][-1] == "[DONE]"
    assert any('"text-delta"' in part for part in result["parts"])
    assert result["events"][-1] == "done" and "assistant_text" in result["events"]
    assert result["missing"] == {"status": 404, "body": {"error": "Session not found"}}
    assert result["patchStatus"] == 200
    assert result["unauthorised"]["status"] == 401
    assert result["unauthorised"]["challenge"].startswith("Bearer")
