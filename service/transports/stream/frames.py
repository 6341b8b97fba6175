"""SSE framing: one event block, as every SSE face writes it."""

from __future__ import annotations

SSE_SEP = "\r\n"  # aiohttp-sse's separator, so every frame of a stream looks the same


def sse_block(data: str, *, id: int | str | None = None, event: str | None = None) -> str:
    """One SSE event block; ``data`` is compact JSON (one line)."""
    head = "" if id is None else f"id: {id}{SSE_SEP}"
    if event is not None:
        head += f"event: {event}{SSE_SEP}"
    return f"{head}data: {data}{SSE_SEP}{SSE_SEP}"
