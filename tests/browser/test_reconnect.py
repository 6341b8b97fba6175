"""The browser client gets its stream back after the path to the service fails, without losing
or repeating a word.

A real reverse proxy (tests/browser/proxy.py) sits between Chromium and the service and drops
connections mid-answer, then answers 503 to a number of reconnect attempts, as a load balancer
does while the service restarts behind it. A browser's EventSource gives up for good on such an
answer, so the page has to recreate it; a WebSocket has to be reopened and resubscribed. The page
waits longer after each failure, up to a cap (set small here through the page's query string),
and resumes from the last event id it applied. Nothing here sleeps: the tests wait on the proxy's
events and on the page's state.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
from aiohttp import WSCloseCode

from service.app import SERVICES
from service.transports.ws.routes import SOCKETS
from tests.browser.proxy import Attempt, Proxy

START_MS = 50
CAP_MS = 200
BACKOFF = f"backoff_ms={START_MS}&backoff_max_ms={CAP_MS}"
# About four seconds of text: still streaming when the outage of a test ends (about a second).
LONG_STORY = "Tell me a long story [emu:tokens=240] [emu:tps=60]"
# Timer slack: the proxy's clock and the page's timers are not the same clock.
SLACK_S = 0.005


async def open_page(browser: Any, url: str) -> Any:
    page = await browser.new_page()
    await page.goto(url)
    await page.wait_for_function(
        "document.querySelector('#status')?.textContent.includes('live')", timeout=15_000
    )
    return page


async def start_long_answer(page: Any) -> str:
    """Ask for the long story and wait until some of it is on screen; returns the session id."""
    await page.fill("#message", LONG_STORY)
    await page.click("#send")
    await page.wait_for_function(
        "(document.querySelector('.answer .answer-text')?.textContent || '').split(' ').length > 10",
        timeout=15_000,
    )
    return await page.evaluate("window.agentstream.sessionId")


async def service_json(base: str, path: str) -> dict[str, Any]:
    """GET from the service itself (not through the proxy)."""
    async with aiohttp.ClientSession() as http, http.get(base + path.lstrip("/")) as response:
        assert response.status == 200, await response.text()
        return await response.json()


async def final_output(base: str, session_id: str) -> str:
    """The `done` event's output, checked against the answer the session keeps."""
    session = await service_json(base, f"/sessions/{session_id}")
    assert session["status"] == "idle"
    last = session["last_event_id"]
    events = (await service_json(base, f"/sessions/{session_id}/events/poll?since_index={last - 1}"))[
        "events"
    ]
    assert [event["type"] for event in events] == ["done"]
    kept = "".join(block["text"] for block in session["messages"][-1]["content"] if "text" in block)
    assert events[0]["output"] == kept
    return events[0]["output"]


async def rendered_answer(page: Any) -> str:
    """The finished answer's text exactly as in the DOM (textContent: no layout, no trimming)."""
    answer = page.locator('.answer[data-done="true"]')
    await answer.wait_for(timeout=20_000)
    assert await page.locator(".answer").count() == 1
    assert await page.locator(".user-message").count() == 1
    return await answer.locator(".answer-text").evaluate("node => node.textContent")


def assert_backoff_policy(delays: list[int], count: int) -> None:
    """Each delay twice the one before, starting at START_MS and never above CAP_MS."""
    assert len(delays) == count, delays
    assert delays[0] == START_MS
    for before, after in zip(delays, delays[1:], strict=False):
        assert after == min(before * 2, CAP_MS), delays
    assert delays[-1] == CAP_MS and delays.count(CAP_MS) >= 2, "the delay reaches the cap and stays there"


def assert_waited(times: list[float], delays: list[int]) -> None:
    """The proxy saw each attempt at least the page's (growing) delay after the one before it.

    Only lower bounds: how much later an attempt comes depends on the machine's load."""
    gaps = [later - earlier for earlier, later in zip(times, times[1:], strict=False)]
    assert len(gaps) == len(delays)
    for gap, delay in zip(gaps, delays, strict=True):
        assert gap >= delay / 1000 - SLACK_S, (gaps, delays)


async def outage_seen(proxy: Proxy, kind: str, attempts: int, page: Any, base: str, session_id: str) -> int:
    """Wait for the attempt after the outage, which the proxy holds: while the page waits for it,
    return the last event id the page applied (nothing reached it since the cut) and check the
    answer is still being written on the server; then let the attempt through."""
    await asyncio.wait_for(proxy.held.wait(), timeout=15)
    assert [a.status for a in proxy.of(kind)] == [proxy.of(kind)[0].status] + [503] * attempts
    last_applied = await page.evaluate("window.agentstream.lastEventId")
    assert await page.evaluate("window.agentstream.connection") == "reconnecting"
    assert (await service_json(base, f"/sessions/{session_id}"))["status"] == "running"
    proxy.release()
    return last_applied


async def test_sse_recreates_the_eventsource_through_503s_with_capped_backoff(
    browser: Any, make_served: Any, make_proxy: Any
) -> None:
    """(a) and (c) over SSE: the stream is cut mid-answer, the browser's own reconnect and the
    page's next five get 503; the page keeps recreating its EventSource from the last id it
    applied, each time waiting longer up to the cap, and finishes the answer word for word."""
    refusals = 6  # more than the five failed probes after which the page used to give up
    served = await make_served(sse_retry_ms=START_MS)
    proxy, url = await make_proxy(served)
    page = await open_page(browser, f"{url}?transport=sse&{BACKOFF}")
    session_id = await start_long_answer(page)

    proxy.outage("events", refusals)
    assert await proxy.cut() == 1  # the EventSource's stream
    last_applied = await outage_seen(proxy, "events", refusals, page, served.url, session_id)

    text = await rendered_answer(page)
    assert text == await final_output(served.url, session_id)
    await page.wait_for_function("window.agentstream.connection === 'live'")

    # After the `done` the stream ends, the browser reconnects once more by itself and the 204
    # stops it for good.
    attempts = await asyncio.wait_for(proxy.wait_for_attempts("events", refusals + 3), timeout=15)
    assert [a.status for a in attempts] == [200] + [503] * refusals + [200, 204]
    opened, browsers_own, *page_made, _ = attempts
    assert 0 < last_applied < (await service_json(served.url, f"/sessions/{session_id}"))["last_event_id"]
    # The browser reconnects first by itself, with the Last-Event-ID header it kept; after the
    # 503 it is CLOSED for good, and every later attempt is a new EventSource from the page, which
    # names the last id it applied in the URL.
    assert opened.path_qs.endswith("/events?last_event_id=0")
    assert browsers_own.last_event_id_header == str(last_applied)
    for attempt in page_made:
        assert attempt.path_qs.endswith(f"/events?last_event_id={last_applied}"), attempt
        assert attempt.last_event_id_header is None
    # The page asked each failure's status with one fetch; none of those got through either.
    assert 0 < len(proxy.probes) <= refusals
    assert all(status == 503 for _, status in proxy.probes)

    retries = await page.evaluate("window.agentstream.retries")
    assert all(retry["transport"] == "sse" and retry["reason"] == "HTTP 503" for retry in retries)
    delays = [retry["delayMs"] for retry in retries]
    assert_backoff_policy(delays, refusals)
    # The browser's own reconnect came after the server's `retry`, not after the page's backoff.
    assert_waited([a.at for a in [browsers_own, *page_made]], delays)
    # Once a stream opened, the next failure starts over from the shortest delay.
    assert await page.evaluate("window.agentstream.backoffMs") == START_MS
    await page.close()


async def test_websocket_reopens_through_refused_upgrades_and_resubscribes_from_its_last_id(
    browser: Any, make_served: Any, make_proxy: Any
) -> None:
    """(b) and (c) over WebSocket: the proxy drops the socket mid-answer (no close frame) and
    answers the next five upgrades with 503; the page reopens after growing, capped pauses,
    resubscribes from the last id it applied and finishes the answer word for word."""
    refusals = 5
    served = await make_served()
    proxy, url = await make_proxy(served)
    page = await open_page(browser, f"{url}?transport=ws&{BACKOFF}")
    session_id = await start_long_answer(page)

    proxy.outage("ws", refusals)
    cut_at = time.monotonic()
    assert await proxy.cut() == 1  # the page's socket
    last_applied = await outage_seen(proxy, "ws", refusals, page, served.url, session_id)

    text = await rendered_answer(page)
    assert text == await final_output(served.url, session_id)
    await page.wait_for_function("window.agentstream.connection === 'live'")

    sockets = proxy.of("ws")
    assert [a.status for a in sockets] == [101] + [503] * refusals + [101]
    subscribes = [m for m in proxy.ws_sent if m.get("type") == "subscribe"]
    assert subscribes == [
        {"type": "subscribe", "session_id": session_id, "last_event_id": 0},
        {"type": "subscribe", "session_id": session_id, "last_event_id": last_applied},
    ]
    assert last_applied > 0

    retries = await page.evaluate("window.agentstream.retries")
    assert all(retry["transport"] == "ws" and retry["reason"] == "socket closed" for retry in retries)
    delays = [retry["delayMs"] for retry in retries]
    assert_backoff_policy(delays, refusals + 1)  # one after the cut, one after each refusal
    assert_waited([cut_at] + [a.at for a in sockets[1:]], delays)
    assert await page.evaluate("window.agentstream.backoffMs") == START_MS
    await page.close()


async def test_websocket_closed_by_the_service_resubscribes_without_repeating_text(
    browser: Any, make_served: Any, make_proxy: Any
) -> None:
    """(b) with the service itself closing the socket (1001, as on shutdown), passed on by the
    proxy: the page reconnects after the first backoff step and resumes from its last id."""
    served = await make_served()
    proxy, url = await make_proxy(served)
    page = await open_page(browser, f"{url}?transport=ws&{BACKOFF}")
    session_id = await start_long_answer(page)

    connections = list(served.app[SOCKETS])
    assert len(connections) == 1
    await connections[0].ws.close(code=WSCloseCode.GOING_AWAY, message=b"going away (test)")
    await asyncio.wait_for(proxy.wait_for_attempts("ws", 2), timeout=15)

    text = await rendered_answer(page)
    assert text == await final_output(served.url, session_id)
    sockets: list[Attempt] = proxy.of("ws")
    assert [a.status for a in sockets] == [101, 101]
    subscribes = [m["last_event_id"] for m in proxy.ws_sent if m.get("type") == "subscribe"]
    assert len(subscribes) == 2 and subscribes[0] == 0
    session = await served.app[SERVICES].sessions.get(session_id)
    assert 0 < subscribes[1] < await session.log.last_id()
    retries = await page.evaluate("window.agentstream.retries")
    assert [(r["transport"], r["delayMs"]) for r in retries] == [("ws", START_MS)]
    await page.close()
