"""The path check (``service/loadtest/selftest.py``): buffering, compression and idle cuts."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient

from service.loadtest.cli import parse_args
from service.loadtest.load import run_selftest
from service.loadtest.selftest import judge_selftest, selftest


@pytest.mark.slow
async def test_selftest_finds_the_direct_path_clean(client: TestClient) -> None:
    async with aiohttp.ClientSession() as http:
        result = await selftest(http, str(client.make_url("")), ticks=10, interval_ms=40, idle_ms=300)
    assert result["available"] and result["problems"] == [], result["lines"]
    assert result["buffering"] is False and result["compressed"] is False and result["idle_cut"] is False
    assert result["ticks_received"] == 10 and result["ended"] is True
    assert result["lag_ms"]["p50"] is not None
    assert [line.split(":")[0] for line in result["lines"]] == [
        "selftest buffering",
        "selftest compression",
        "selftest idle",
        "selftest lag",
    ]


def test_selftest_verdicts_on_a_buffering_and_cutting_path() -> None:
    # Ticks written 50 ms apart that all arrive in one burst at the end, and no `end`.
    arrivals = [(n, 100.0 + n * 0.05, 101.0 + n * 0.0001) for n in range(1, 10)]
    result = judge_selftest(arrivals, 10, 50, 2000, "gzip", False, "server disconnected", 3.0)
    assert result["buffering"] and result["compressed"] and result["idle_cut"]
    assert set(result["problems"]) == {"buffering", "compressed", "idle streams cut"}
    # The same ticks arriving on schedule, through the pause, uncompressed.
    arrivals = [(n, 100.0 + n * 0.05, 100.001 + n * 0.05) for n in range(1, 11)]
    result = judge_selftest(arrivals, 10, 50, 2000, None, True, None, 2.5)
    assert result["problems"] == [] and result["lag_ms"]["p50"] == pytest.approx(1.0, abs=0.01)


def test_selftest_unavailable_when_nothing_listens() -> None:
    config = parse_args(["--url", "http://127.0.0.1:1", "--selftest"])
    result = asyncio.run(run_selftest(config))
    assert result["available"] is False and result["problems"]


async def test_selftest_sees_a_proxy_that_buffers_and_compresses(
    client: TestClient, aiohttp_server: Any
) -> None:
    """A real proxy in front of the service that holds each response until it is complete."""
    from aiohttp import web

    async def proxy(request: web.Request) -> web.StreamResponse:
        async with aiohttp.ClientSession() as http:
            async with http.get(str(client.make_url(request.path_qs))) as upstream:
                body = await upstream.read()
        response = web.Response(body=body, content_type="text/event-stream")
        response.enable_compression()
        return response

    app = web.Application()
    app.router.add_get("/{tail:.*}", proxy)
    server = await aiohttp_server(app)
    async with aiohttp.ClientSession(headers={"Accept-Encoding": "gzip"}) as http:
        result = await selftest(http, str(server.make_url("")), ticks=10, interval_ms=40, idle_ms=0)
    assert result["available"] and result["ticks_received"] == 10
    assert result["buffering"] is True and result["compressed"] is True, result["lines"]
    assert "buffering" in result["problems"]
