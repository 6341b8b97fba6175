"""The Responses face from a front end on its own origin, as a signed-in person, in Chromium: a
background response streamed with ``fetch``, the page reloaded mid-answer, the stream resumed
after the last ``sequence_number`` it showed; Stop on a second one; another person's ids refused.

Chromium enforces CORS for real: a reply without the headers reaches the page as a bare
"Failed to fetch", whatever the service sent.
"""

from __future__ import annotations

import time
from typing import Any

import jwt
from aiohttp import web

from tests.browser.conftest import ServedFactory

SECRET = "a secret of thirty-two bytes, at the very least"
PAGE = "<!doctype html><title>front end</title><p>a chat on its own origin</p>"

# Shared by both scripts: read SSE blocks from a fetch response, stopping after `limit` events.
READ = """
async function readEvents(response, limit) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  const events = [];
  let buffer = '';
  for (;;) {
    const {done, value} = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, {stream: true}).replace(/\\r\\n/g, '\\n');
    let cut;
    while ((cut = buffer.indexOf('\\n\\n')) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      const data = block.split('\\n').filter((l) => l.startsWith('data: ')).map((l) => l.slice(6)).join('');
      if (data) events.push(JSON.parse(data));
      if (limit && events.length >= limit) { await reader.cancel(); return events; }
    }
  }
  return events;
}
"""

START = (
    "async ({base, token, model}) => {"
    + READ
    + """
  const auth = {Authorization: `Bearer ${token}`, 'Content-Type': 'application/json'};
  const response = await fetch(`${base}v1/responses`, {
    method: 'POST', headers: auth,
    body: JSON.stringify({model, input: 'Tell me a story [emu:tokens=60] [emu:tps=200]', background: true, stream: true}),
  });
  const events = await readEvents(response, 12);
  sessionStorage.setItem('seen', JSON.stringify(events));
  return {status: response.status, events};
}
"""
)

RESUME = (
    "async ({base, token, model}) => {"
    + READ
    + """
  const auth = {Authorization: `Bearer ${token}`, 'Content-Type': 'application/json'};
  const seen = JSON.parse(sessionStorage.getItem('seen'));
  const id = seen[0].response.id;
  const last = seen[seen.length - 1].sequence_number;
  const rest = await readEvents(await fetch(`${base}v1/responses/${id}?stream=true&starting_after=${last}`, {headers: auth}));

  // Stop: a second background response, cancelled while it runs.
  const second = await (await fetch(`${base}v1/responses`, {
    method: 'POST', headers: auth,
    body: JSON.stringify({model, input: 'Go on [emu:tokens=500] [emu:tps=20]', background: true}),
  })).json();
  const stopped = await (await fetch(`${base}v1/responses/${second.id}/cancel`, {method: 'POST', headers: auth})).json();
  return {seen, rest, id, stopped: stopped.status};
}
"""
)

OTHER = """
async ({base, token, id}) => {
  const response = await fetch(`${base}v1/responses/${id}`, {headers: {Authorization: `Bearer ${token}`}});
  return {status: response.status, body: await response.json()};
}
"""


def token(sub: str) -> str:
    return jwt.encode({"sub": sub, "exp": int(time.time()) + 600}, SECRET, algorithm="HS256")


async def test_a_page_on_another_origin_resumes_a_response_after_a_reload(
    browser: Any, make_served: ServedFactory, aiohttp_server: Any
) -> None:
    page_app = web.Application()

    async def index(_: web.Request) -> web.Response:
        return web.Response(text=PAGE, content_type="text/html")

    page_app.router.add_get("/", index)
    page_server = await aiohttp_server(page_app)
    page_origin = str(page_server.make_url("")).rstrip("/")
    served = await make_served(jwt_secret=SECRET, allowed_origins=[page_origin], model_id="story-model")
    args = {"base": served.url, "token": token("alice"), "model": "story-model"}

    page = await browser.new_page()
    try:
        await page.goto(page_origin + "/")
        started = await page.evaluate(START, args)
        await page.reload()  # the answer goes on on the server meanwhile
        resumed = await page.evaluate(RESUME, args)
        other = await page.evaluate(OTHER, {**args, "token": token("bob"), "id": resumed["id"]})
    finally:
        await page.close()

    assert started["status"] == 200 and len(started["events"]) == 12
    events = resumed["seen"] + resumed["rest"]
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    assert events[-1]["type"] == "response.completed"
    text = "".join(event["delta"] for event in events if event["type"] == "response.output_text.delta")
    assert len(text.split()) == 60
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == text
    assert resumed["stopped"] == "cancelled"
    assert other["status"] == 404 and other["body"]["error"]["type"] == "invalid_request_error"
