"""The live benchmark's client (``scripts/peers/viewers.py``): against the service, every token
reaches every subscriber in each dialect, counted by its text; a text part cut between two reads
counts once, when it is whole."""

from __future__ import annotations

import asyncio
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from peers.live import PATHS, answer_texts, token_ends  # noqa: E402
from peers.viewers import DIALECTS, HIST_BUCKET_S, Viewer, figures, percentile_of, watch  # noqa: E402

TOKENS = 40


@pytest.mark.parametrize("dialect", ["sse", "ws", "aisdk"])
async def test_every_token_reaches_every_subscriber(make_client: Any, dialect: str) -> None:
    # A lagging reader gets merged deltas: with merging after 2 events and an unpaced answer,
    # some parts carry several tokens, and each still counts by its text.
    client = await make_client(merge_deltas_after=2)
    message = f"viewers [emu:tokens={TOKENS}] [emu:tps=0] [emu:ttft=1000]"
    async with client.post("/sessions", json={}) as response:
        session_id = (await response.json())["id"]
    async with client.post(f"/sessions/{session_id}/messages", json={"content": message}) as response:
        assert response.status == 202
    started = time.monotonic()
    spec = {
        "host": client.server.host,
        "port": client.server.port,
        "path": PATHS[dialect].format(id=session_id),
        "dialect": dialect,
        "session_id": session_id,
        "n": 3,
        "batch": 3,
        "timeout": 30,
    }
    viewers = await asyncio.to_thread(watch, spec)  # the service runs on this loop
    result = figures(viewers, token_ends(answer_texts(message, TOKENS)), [started] * TOKENS)
    assert result["tokens_delivered"] == 3 * TOKENS
    assert result["complete"] == result["ended"] == 3
    assert 0 < result["text_parts"] <= 3 * TOKENS
    assert 0 <= result["max_s"] < 30
    hist = {int(bucket): count for bucket, count in result["hist"].items()}
    assert sum(hist.values()) == 3 * TOKENS
    assert percentile_of(hist, 0.99) <= (result["max_s"] + HIST_BUCKET_S) * 1000  # type: ignore[operator]


def test_a_part_cut_between_reads_counts_once_whole() -> None:
    dialect = DIALECTS["sse"]
    viewer = Viewer({"dialect": "sse"}, re.compile(dialect["text"]), dialect)
    viewer.feed(b"HTTP/1.1 200 OK\r\n\r\n", 1.0)
    assert viewer.ready
    viewer.feed(b'data: {"type":"assistant_text","text":"Here","id":3}\r\n\r\n', 2.0)
    viewer.feed(b'data: {"type":"assistant_text","text":" is a', 3.0)
    assert list(viewer.lengths) == [4]
    viewer.feed(b'n \\"answer\\"","first_id":4,"id":5}\r\n\r\nevent: do', 4.0)
    assert list(viewer.lengths) == [4, 4 + len(' is an \\"answer\\"')]
    assert not viewer.ended
    viewer.feed(b"ne\r\ndata: {}\r\n\r\n", 5.0)
    assert viewer.ended == 5.0 and viewer.parts == 2 and list(viewer.clocks) == [2.0, 4.0]
    ends = token_ends(["Here", " is", ' an "answer"'])
    result = figures([viewer], ends, [1.5, 1.5, 3.5])
    assert result["tokens_delivered"] == 3 and result["complete"] == 1
    # Received at 2.0, 4.0 and 4.0: 0.5, 2.5 and 0.5 s after they were produced.
    assert result["max_s"] == 2.5 and result["hist"] == {"5000": 2, "25000": 1}
