"""The load tool (``service/loadtest.py``, ``scripts/loadtest.py``, ``agentstream-load``).

Each mode runs in-process against the real service on a real port (the embedded emulator,
unpaced), and must come out clean: every query finished with ``done``, no errors, no id lost or
repeated, a time to first token for each.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient

from service import loadtest

ROOT = Path(__file__).resolve().parent.parent


async def _load(client: TestClient, *args: str) -> dict[str, Any]:
    config = loadtest.parse_args(["--url", str(client.make_url("")), "--quiet", "--no-selftest", *args])
    return await loadtest.run(config)


@pytest.mark.parametrize("mode", ["sse", "ws", "agent", "mixed"])
async def test_each_mode_runs_clean(client: TestClient, mode: str) -> None:
    # Three queries per session, so sessions are reused and rotated (ids continue across queries).
    report = await _load(
        client, "--mode", mode, "--clients", "4", "--count", "16", "--queries-per-session", "3",
        "--message", "Tell me a story [emu:tokens=30]",
    )  # fmt: skip
    assert report["queries"] == {"started": 16, "finished": 16, "ok": 16, "failed": 0}, report
    assert report["errors"] == {} and report["ids"] == {"lost": 0, "repeated": 0}
    assert report["clean"] is True
    assert report["ttft_ms"]["n"] == 16 and report["e2e_ms"]["n"] == 16
    assert report["gap_ms"]["n"] == 16 * 29  # 30 text events each: 29 gaps
    assert report["events"] >= 16 * 30
    if mode == "mixed":
        assert set(report["by_mode"]) == {"sse", "ws", "agent"}
    # The clients deleted the sessions they made.
    async with client.get("/healthz") as response:
        assert (await response.json())["sessions"] == 0


async def test_duration_mode_and_failures_are_counted(client: TestClient) -> None:
    report = await _load(
        client, "--mode", "mixed", "--clients", "3", "--duration", "0.3",
        "--message", "hi [emu:tokens=5] [emu:fail=modelStreamErrorException] [emu:fail_after=2]",
    )  # fmt: skip
    queries = report["queries"]
    assert queries["started"] == queries["finished"] == queries["failed"] >= 3
    assert report["errors"] == {"error event (modelStreamErrorException)": queries["failed"]}
    assert report["clean"] is False and report["ids"] == {"lost": 0, "repeated": 0}
    assert report["ttft_ms"]["n"] == queries["failed"]  # two tokens came before the failure


async def test_http_errors_are_counted_by_status(make_client: Any) -> None:
    client = await make_client(api_keys="right")
    report = await _load(client, "--mode", "mixed", "--clients", "3", "--api-key", "wrong")
    assert report["errors"] == {
        "http 401 (POST /sessions)": 1,
        "http 401 (GET /ws)": 1,
        "http 401 (POST /agent/stream)": 1,
    }
    report = await _load(client, "--mode", "mixed", "--clients", "3", "--api-key", "right")
    assert report["clean"] is True, report


async def test_selftest_finds_the_direct_path_clean(client: TestClient) -> None:
    async with aiohttp.ClientSession() as http:
        result = await loadtest.selftest(
            http, str(client.make_url("")), ticks=10, interval_ms=40, idle_ms=300
        )
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
    result = loadtest.judge_selftest(arrivals, 10, 50, 2000, "gzip", False, "server disconnected", 3.0)
    assert result["buffering"] and result["compressed"] and result["idle_cut"]
    assert set(result["problems"]) == {"buffering", "compressed", "idle streams cut"}
    # The same ticks arriving on schedule, through the pause, uncompressed.
    arrivals = [(n, 100.0 + n * 0.05, 100.001 + n * 0.05) for n in range(1, 11)]
    result = loadtest.judge_selftest(arrivals, 10, 50, 2000, None, True, None, 2.5)
    assert result["problems"] == [] and result["lag_ms"]["p50"] == pytest.approx(1.0, abs=0.01)


def test_selftest_unavailable_when_nothing_listens() -> None:
    config = loadtest.parse_args(["--url", "http://127.0.0.1:1", "--selftest"])
    result = asyncio.run(loadtest.run_selftest(config))
    assert result["available"] is False and result["problems"]


def test_id_check_flags_gaps_and_repeats() -> None:
    assert loadtest.check_ids([1, 2, 3, 4]) == (0, 0)
    assert loadtest.check_ids([6, 7], after=5) == (0, 0)
    assert loadtest.check_ids([1, 2, 4, 5]) == (1, 0)  # 3 lost
    assert loadtest.check_ids([1, 2, 2, 3]) == (0, 1)  # 2 twice
    assert loadtest.check_ids([1, 2, 5, 5, 6]) == (2, 1)
    assert loadtest.check_ids([2], after=0) == (1, 0)  # the first after `after` missing
    # Merged assistant_text events cover first_id..id.
    assert loadtest.check_ids([(1, 1), (2, 9), (10, 10)]) == (0, 0)
    assert loadtest.check_ids([(1, 1), (3, 9), (10, 10)]) == (1, 0)
    assert loadtest.check_ids([(1, 5), (4, 9)]) == (0, 2)  # 4 and 5 again
    assert loadtest.check_ids([(1, 5), (1, 5)]) == (0, 5)


def test_sse_parser_across_chunk_boundaries() -> None:
    stream = (
        b'retry: 1000\r\nid: 7\r\nevent: assistant_text\r\ndata: {"a":1}\r\n\r\n'
        b": ping\r\n\r\nevent: heartbeat\r\ndata: {}\r\n\r\n"
        b"id: 8\nevent: done\ndata: x\ndata: y\n\n"
    )
    expected = [("assistant_text", "7", '{"a":1}'), ("heartbeat", None, "{}"), ("done", "8", "x\ny")]
    for size in (1, 2, 3, 7, len(stream)):
        parser = loadtest.SSEParser()
        events = []
        for start in range(0, len(stream), size):
            events += parser.feed(stream[start : start + size])
        events += parser.close()
        assert events == expected, size


def test_cli_help() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "loadtest.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    for option in (
        "--clients",
        "--count",
        "--duration",
        "--ramp-up",
        "--mode",
        "--selftest",
        "--json",
        "--plot",
    ):
        assert option in result.stdout


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
        result = await loadtest.selftest(http, str(server.make_url("")), ticks=10, interval_ms=40, idle_ms=0)
    assert result["available"] and result["ticks_received"] == 10
    assert result["buffering"] is True and result["compressed"] is True, result["lines"]
    assert "buffering" in result["problems"]
