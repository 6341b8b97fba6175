"""JSON log lines carry the session and run ids of whatever they were logged for."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from service.logs import ContextFilter, JsonFormatter
from tests.conftest import sse_events


@contextlib.contextmanager
def json_log_lines() -> Iterator[list[dict[str, Any]]]:
    """The service's log lines at INFO and above, as its JSON formatter writes them: the list is
    filled when the block ends."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(ContextFilter())
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("service")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    lines: list[dict[str, Any]] = []
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        lines.extend(json.loads(line) for line in stream.getvalue().splitlines())


async def test_json_lines_carry_session_and_run_ids(client: TestClient) -> None:
    with json_log_lines() as lines:
        async with client.post("/sessions") as response:
            session_id = (await response.json())["id"]
        async with client.post(f"/sessions/{session_id}/messages", json={"content": "hi"}) as response:
            run_id = (await response.json())["run_id"]
        async with client.get(f"/sessions/{session_id}/events", headers={"Last-Event-ID": "0"}) as response:
            [event async for event in sse_events(response)]
        logging.getLogger("service.test").info("outside any request")
    ours = [line for line in lines if line["run_id"] == run_id]
    assert [line["message"] for line in ours][:1] == ["query started (max 10 turns)"]
    assert any(line["message"].startswith("query ended: end_turn") for line in ours)
    assert all(line["session_id"] == session_id and line["level"] == "INFO" for line in ours)
    assert lines[-1]["message"] == "outside any request" and lines[-1]["session_id"] is None
    assert {"ts", "time", "logger"} <= lines[-1].keys()


async def test_a_request_the_parser_refuses_is_one_warning_not_an_error(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="aiohttp.server")
    for bad in (b"X-Long: " + b"a" * 20_000, b"X-Nul: 1\x002"):
        reader, writer = await asyncio.open_connection(client.host, client.port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + bad + b"\r\nConnection: close\r\n\r\n")
        await writer.drain()
        reply = await reader.read()  # the server answers and closes
        writer.close()
        assert reply.split(b"\r\n", 1)[0].split(b" ")[1] == b"400"
    records = [r for r in caplog.records if r.name == "aiohttp.server"]
    assert len(records) == 2 and all(r.levelno == logging.WARNING and not r.exc_info for r in records)
    assert all(r.getMessage().startswith("refused a malformed request: ") for r in records)
