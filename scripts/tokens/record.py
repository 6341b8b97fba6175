"""The model streams the parse stages are fed: recorded from the emulator, split into network reads."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from service.emulator.embedded import EmbeddedEmulator


async def _post(url: str, body: dict[str, Any]) -> bytes:
    async with aiohttp.ClientSession() as http, http.post(url, json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"{url}: HTTP {response.status} {await response.text()}")
        return await response.read()


def record_streams(tokens: int) -> dict[str, bytes]:
    """One answer of ``tokens`` text tokens, as the emulator sends it on each wire: the raw body of
    a ConverseStream response (AWS event-stream frames) and of an OpenAI chat-completions stream."""
    prompt = f"budget [emu:tokens={tokens}]"
    emulator = EmbeddedEmulator().start()
    try:
        bedrock = asyncio.run(
            _post(
                emulator.url + "/model/bench/converse-stream",
                {"messages": [{"role": "user", "content": [{"text": prompt}]}]},
            )
        )
        openai = asyncio.run(
            _post(
                emulator.url + "/v1/chat/completions",
                {
                    "model": "bench",
                    "messages": [{"role": "user", "content": prompt}],
                    "stream": True,
                    "stream_options": {"include_usage": True},
                },
            )
        )
    finally:
        emulator.stop()
    return {"bedrock": bedrock, "openai": openai}


def event_stream_frames(raw: bytes) -> list[bytes]:
    """An AWS event stream split into its messages (each opens with its total length), one per read:
    a paced model's stream arrives a frame per network read."""
    frames = []
    at = 0
    while at < len(raw):
        length = int.from_bytes(raw[at : at + 4], "big")
        frames.append(raw[at : at + length])
        at += length
    return frames


def sse_frames(raw: bytes) -> list[bytes]:
    """An SSE body split after each event's blank line, one event per read."""
    pieces = raw.split(b"\n\n")
    frames = [piece + b"\n\n" for piece in pieces[:-1]]
    if pieces[-1]:
        frames.append(pieces[-1])
    return frames
