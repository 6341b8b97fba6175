"""The bare relay ``bench_concurrency.py --paced`` measures the service against (``scripts/intake/relay.py``),
run as its own process against the emulator over HTTP: every text delta of the model's stream goes
out as the service's agent dialect, then ``done``; an upstream failure ends the stream with an error."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from service.emulator.embedded import EmbeddedEmulator
from service.emulator.script import plan_response
from service.emulator.steps import EmitText
from service.loadtest.sse import read_events
from tests.support._pipes import PipeDrain, free_port

RELAY = Path(__file__).resolve().parents[2] / "scripts" / "intake" / "relay.py"


@pytest.fixture
def relay(emulator: EmbeddedEmulator) -> Iterator[str]:
    port = free_port()
    child = subprocess.Popen(
        [sys.executable, str(RELAY), "--port", str(port), "--upstream", emulator.url],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    assert child.stdout is not None
    output = PipeDrain(child.stdout, "relay", marker=lambda line: "Running on" in line)
    try:
        assert output.wait_ready(30), output.tail()
        yield f"http://127.0.0.1:{port}"
    finally:
        child.terminate()
        child.wait(10)


async def stream(url: str, message: str) -> list[dict[str, Any]]:
    """``POST /agent/stream`` to the relay: every event's data, parsed."""
    async with (
        aiohttp.ClientSession() as http,
        http.post(url + "/agent/stream", json={"message": message}) as response,
    ):
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        return [json.loads(data) async for _, _, data in read_events(response.content)]


async def test_every_text_delta_then_done(relay: str, emulator: EmbeddedEmulator) -> None:
    message = "relay me [emu:tokens=12]"
    events = await stream(relay, message)

    plan = plan_response({"messages": [{"role": "user", "content": [{"text": message}]}]})
    expected = [step.text for step in plan.steps if isinstance(step, EmitText)]
    assert len(expected) == 12
    assert events == [{"type": "text_delta", "text": text} for text in expected] + [{"type": "done"}]
    record = emulator.wait_for(lambda r: r.user_text == message and r.outcome != "running")
    assert (record.outcome, record.deltas_sent) == ("completed", 12)


async def test_in_stream_exception_ends_with_an_error(relay: str) -> None:
    events = await stream(relay, "[emu:tokens=12] [emu:fail=modelStreamErrorException] [emu:fail_after=3]")

    assert [e["type"] for e in events] == ["text_delta"] * 3 + ["error"]
    assert events[-1]["error"] == "modelStreamErrorException"


async def test_http_error_ends_with_an_error(relay: str) -> None:
    assert await stream(relay, "[emu:http=500]") == [{"type": "error", "status": 500}]


async def test_healthz_reports_the_loop_lag(relay: str) -> None:
    async with aiohttp.ClientSession() as http, http.get(relay + "/healthz?lag_since=0") as response:
        body = await response.json()
    assert response.status == 200
    assert set(body["loop_lag_ms"]) >= {"p50", "p99", "max", "samples"}
