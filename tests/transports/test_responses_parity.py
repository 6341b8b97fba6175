"""One background response read at once through three faces: the Responses stream (the unmodified
``openai`` client), the session's SSE stream and the WebSocket. Each reader's events are mapped to
one canonical list of what the answer says (text and reasoning pieces in order, tool calls and
their results, the ending), and the lists must be equal: the faces are projections of one log, so
no face may drop, repeat, reorder or reword a piece of the answer.

The readers join while the answer is being written (it is paced), so each reads what the log
already holds and then follows it live.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import openai
import pytest
from aiohttp.test_utils import TestClient

from tests.conftest import ClientFactory, sse_events
from tests.transports.test_openai_chat import (  # noqa: F401 - the fixture closes the clients
    _close_openai_clients,
    openai_client,
)

WAIT_S = 20.0
# A canonical piece of the answer: ("text", piece), ("reasoning", piece),
# ("call", tool use id, tool name, input), ("result", tool use id, output, is_error),
# ("end", status).
Piece = tuple[Any, ...]

# --- each face mapped to the canonical list --------------------------------------------------------


def from_responses(events: list[Any]) -> list[Piece]:
    """The Responses stream's events (the client's typed objects) as canonical pieces."""
    assert [event.sequence_number for event in events] == list(range(len(events)))
    pieces: list[Piece] = []
    names: dict[str, str] = {}  # a call item's id: its tool's name (told when the item is added)
    for event in events:
        kind = event.type
        if kind == "response.output_text.delta":
            pieces.append(("text", event.delta))
        elif kind == "response.reasoning_summary_text.delta":
            pieces.append(("reasoning", event.delta))
        elif kind == "response.output_item.added" and event.item.type in {"mcp_call", "function_call"}:
            names[event.item.id] = event.item.name
        elif kind in {"response.mcp_call_arguments.done", "response.function_call_arguments.done"}:
            call_id = event.item_id.partition("_")[2]
            pieces.append(("call", call_id, names[event.item_id], json.loads(event.arguments)))
        elif kind == "response.output_item.done" and event.item.type == "mcp_call":
            item = event.item
            failed = item.status == "failed"
            pieces.append(
                ("result", item.id.partition("_")[2], item.error if failed else item.output, failed)
            )
        elif kind in {"response.completed", "response.incomplete", "response.failed"}:
            pieces.append(("end", event.response.status))
        elif kind == "error":
            pieces.append(("end", "cut short"))
    return pieces


def from_session(payloads: list[dict[str, Any]], response_id: str) -> list[Piece]:
    """The session dialect's payloads (SSE ``data`` or WebSocket frames), from the run whose
    ``processing`` names the response, as canonical pieces."""
    starts = [
        i for i, p in enumerate(payloads) if p["type"] == "processing" and p.get("reply_id") == response_id
    ]
    assert len(starts) == 1, [p["type"] for p in payloads]
    pieces: list[Piece] = []
    for payload in payloads[starts[0] :]:
        kind = payload["type"]
        if kind == "assistant_text":
            pieces.append(("text", payload["text"]))
        elif kind == "reasoning_text":
            pieces.append(("reasoning", payload["text"]))
        elif kind == "tool_use":
            pieces.append(("call", payload["toolUseId"], payload["toolName"], payload["toolInput"]))
        elif kind == "tool_result":
            pieces.append(("result", payload["toolUseId"], payload["result"], payload["isError"]))
        elif kind == "done":
            pieces.append(("end", _status(payload)))
            break
        elif kind == "error":
            pieces.append(("end", "failed"))
            break
    return pieces


def _status(done: dict[str, Any]) -> str:
    if done.get("cancelled"):
        return "cancelled"
    if done.get("truncated") or done.get("max_turns_reached"):
        return "incomplete"
    return "completed"


# --- the readers ---------------------------------------------------------------------------------


async def over_responses(api: openai.AsyncOpenAI, response_id: str) -> list[Piece]:
    stream = await api.responses.retrieve(response_id, stream=True)
    return from_responses([event async for event in stream])


async def over_sse(client: TestClient, session_id: str, response_id: str) -> list[Piece]:
    # The response made the session: its log begins with the response's query, so reading
    # after event 0 starts at its run.
    async with client.get(f"/sessions/{session_id}/events", headers={"Last-Event-ID": "0"}) as response:
        assert response.status == 200, await response.text()
        payloads = [dict(event["data"]) async for event in sse_events(response)]
    return from_session(payloads, response_id)


async def over_ws(client: TestClient, session_id: str, response_id: str) -> list[Piece]:
    frames: list[dict[str, Any]] = []
    async with client.ws_connect("/ws") as ws:
        await ws.send_json({"type": "subscribe", "session_id": session_id, "last_event_id": 0})
        while not frames or frames[-1]["type"] not in {"done", "error"} or "id" not in frames[-1]:
            frame = await ws.receive_json()
            if "id" in frame:  # a logged event (not the subscription's acknowledgement)
                assert frame.pop("session_id") == session_id
                frames.append(frame)
    assert [frame["id"] for frame in frames] == list(range(1, len(frames) + 1))
    return from_session(frames, response_id)


CASES = {
    "paced text": "Count [emu:tokens=30] [emu:tps=200]",
    "calculator": "What is 17 * 3? [emu:tps=200]",
    "reasoning": "Think first [emu:reasoning] [emu:tokens=12] [emu:tps=200]",
}


@pytest.mark.parametrize("prompt", CASES.values(), ids=list(CASES))
async def test_every_face_tells_the_same_answer(make_client: ClientFactory, prompt: str) -> None:
    # Deltas are never merged for a reader that lags: each face then carries every piece as logged.
    client = await make_client(merge_deltas_after=100_000)
    api = openai_client(client)
    model = (await api.models.list()).data[0].id
    started = await api.responses.create(model=model, input=prompt, background=True)
    assert started.status in {"queued", "in_progress"}
    session_id = started.model_extra["session_id"]  # type: ignore[index]
    async with asyncio.timeout(WAIT_S):
        responses, sse, ws = await asyncio.gather(
            over_responses(api, started.id),
            over_sse(client, session_id, started.id),
            over_ws(client, session_id, started.id),
        )
    assert responses == sse == ws
    # The answer itself is what the prompt asked for (equal empty lists would prove nothing).
    texts = [piece[1] for piece in responses if piece[0] == "text"]
    assert responses[-1] == ("end", "completed")
    if "tokens=30" in prompt:
        assert len("".join(texts).split()) == 30 and len(texts) >= 30
    if "17 * 3" in prompt:
        [call] = [piece for piece in responses if piece[0] == "call"]
        [result] = [piece for piece in responses if piece[0] == "result"]
        assert call[2] == "calculator" and result[1] == call[1] and result[2] == "51" and not result[3]
        assert responses.index(result) == responses.index(call) + 1
        assert "51" in "".join(texts)
    if "reasoning" in prompt:
        assert [piece for piece in responses if piece[0] == "reasoning"]
    polled = await api.responses.retrieve(started.id)
    assert polled.status == "completed" and polled.output_text == "".join(texts)
