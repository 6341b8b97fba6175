"""JSON log lines carry the session and run ids of whatever they were logged for."""

from __future__ import annotations

import io
import json
import logging

from aiohttp.test_utils import TestClient

from service.logs import ContextFilter, JsonFormatter
from tests.conftest import sse_events


async def test_json_lines_carry_session_and_run_ids(client: TestClient) -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(ContextFilter())
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("service")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        async with client.post("/sessions") as response:
            session_id = (await response.json())["id"]
        async with client.post(f"/sessions/{session_id}/messages", json={"content": "hi"}) as response:
            run_id = (await response.json())["run_id"]
        async with client.get(f"/sessions/{session_id}/events", headers={"Last-Event-ID": "0"}) as response:
            [event async for event in sse_events(response)]
        logging.getLogger("service.test").info("outside any request")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    ours = [line for line in lines if line["run_id"] == run_id]
    assert [line["message"] for line in ours][:1] == ["query started (max 10 turns)"]
    assert any(line["message"].startswith("query ended: end_turn") for line in ours)
    assert all(line["session_id"] == session_id and line["level"] == "INFO" for line in ours)
    assert lines[-1]["message"] == "outside any request" and lines[-1]["session_id"] is None
    assert {"ts", "time", "logger"} <= lines[-1].keys()
