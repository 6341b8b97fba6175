"""A load run (``service/loadtest/load.py``, ``clients.py``) against the real service.

Each mode runs in-process against the real service on a real port (the embedded emulator,
unpaced), and must come out clean: every query finished with ``done``, no errors, no id lost or
repeated, a time to first token for each.
"""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from service.loadtest.cli import parse_args
from service.loadtest.load import run


async def _load(client: TestClient, *args: str) -> dict[str, Any]:
    config = parse_args(["--url", str(client.make_url("")), "--quiet", "--no-selftest", *args])
    return await run(config)


@pytest.mark.slow
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
