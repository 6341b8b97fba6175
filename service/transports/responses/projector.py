"""A query's log as one OpenAI response: its events, numbered, and the object they build.

A :class:`ResponseProjection` reads the query's entries from its ``run_started`` on and makes
OpenAI's stream events of them, each with its ``sequence_number``: one more per event, from 0 at
``response.created``. The numbering is a function of the log alone (so are the item ids, made
from the response's and the tool calls' ids), so any instance that reads the query from its first
entry numbers every event as the one that first sent it did: a stream resumed after ``N``
(``starting_after``) is the same projection with the events up to ``N`` left unwritten.

Each model turn's text is a ``message`` item and its reasoning a ``reasoning`` item; a call of
the client's functions is a ``function_call`` item, handed back unrun (the response then
completes); a call of the service's own tools is an ``mcp_call`` item, with its output when it
has run, and a call that waits for a person's approval an ``mcp_approval_request`` item first.
The projection keeps the response object as it stands (:meth:`ResponseProjection.response`),
for ``response.completed`` and for ``GET /v1/responses/{id}``.
"""

from __future__ import annotations

from typing import Any

from service import jsonsafe
from service.core import conversation
from service.core.events import (
    Event,
    ReasoningDelta,
    RunDone,
    RunError,
    RunStarted,
    TextDelta,
    ToolApprovalRequest,
    ToolInputDelta,
    ToolResult,
    ToolUse,
    ToolUseStart,
    Usage,
)
from service.core.log import LogEntry
from service.transports.stream.follow import Ending
from service.transports.stream.frames import SSE_SEP
from service.transports.stream.sse import Projector

SERVER_LABEL = "agentstream"
EVENT = dict[str, Any]
RESPONSE_PREFIX = "resp_"


def usage_body(usage: Usage) -> dict[str, Any]:
    """Usage in the Responses API's words."""
    return {
        "input_tokens": usage.input_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.total_tokens,
    }


def tool_error(text: str) -> dict[str, Any]:
    """A failed call's ``error``: OpenAI's clients read an object there, not a string."""
    return {"type": "mcp_tool_execution_error", "content": [{"type": "text", "text": text}]}


def unique_id(base: str, output: list[dict[str, Any]]) -> str:
    """``base``, or ``base_<n>`` for the n-th item of that turn and kind (text after reasoning
    after text, in one model turn), so no two items of a response share an id."""
    taken = sum(1 for item in output if item["id"] == base or item["id"].startswith(f"{base}_"))
    return base if taken == 0 else f"{base}_{taken}"


def _token(response_id: str) -> str:
    return response_id.removeprefix(RESPONSE_PREFIX)


class ResponseProjection:
    """One response's events as OpenAI's, numbered; and the response object they build."""

    def __init__(self, response_id: str, session_id: str, client_tools: frozenset[str] = frozenset()) -> None:
        self.response_id = response_id
        self.session_id = session_id
        self.client_tools = client_tools
        self.seq = 0
        self.started = False
        self.ended = False
        self.status = "in_progress"
        self.created_at = 0.0
        self.completed_at: float | None = None
        self.request: dict[str, Any] = {}
        self.output: list[dict[str, Any]] = []
        self.usage: Usage | None = None
        self.error: dict[str, str] | None = None
        self.incomplete: dict[str, str] | None = None
        # The open message and reasoning items (output indices) and their text so far.
        self.message: int | None = None
        self.reasoning: int | None = None
        self.pieces: dict[int, list[str]] = {}
        # The open message as a text delta of the same turn goes on in it: (turn, item id, output
        # index, its text so far), None otherwise. Kept as one value so that the stream's path for
        # such a delta, taken once per token and subscriber, reads one attribute.
        self.open_text: tuple[int, str, int, list[str]] | None = None
        self.now = 0.0  # when the entry being read was logged
        # Tool calls by tool-use id: their output index.
        self.calls: dict[str, int] = {}

    # --- the object -------------------------------------------------------------------------

    def response(self) -> dict[str, Any]:
        """The response as it stands."""
        request = self.request
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created_at,
            "completed_at": self.completed_at,
            "status": self.status,
            "background": bool(request.get("background")),
            "store": request.get("store", True),
            "error": self.error,
            "incomplete_details": self.incomplete,
            "instructions": request.get("instructions"),
            "max_output_tokens": request.get("max_output_tokens"),
            "metadata": request.get("metadata") or {},
            "model": request.get("model", ""),
            "output": [self._item(index) for index in range(len(self.output))],
            "parallel_tool_calls": True,
            "previous_response_id": request.get("previous_response_id"),
            "temperature": None,
            "top_p": None,
            "text": {"format": {"type": "text"}},
            "tool_choice": request.get("tool_choice") or "auto",
            "tools": request.get("tools") or [],
            "truncation": "disabled",
            "usage": usage_body(self.usage) if self.usage is not None else None,
            "user": None,
            "session_id": self.session_id,
        }

    def _item(self, index: int) -> dict[str, Any]:
        item = dict(self.output[index])
        pieces = self.pieces.get(index)
        if item["type"] == "message":
            text = "".join(pieces or [])
            item["content"] = [_output_text(text)] if pieces is not None else []
        elif item["type"] == "reasoning":
            item["summary"] = (
                [{"type": "summary_text", "text": "".join(pieces or [])}] if pieces is not None else []
            )
        elif pieces is not None:
            item["arguments"] = "".join(pieces)
        return item

    # --- events -----------------------------------------------------------------------------

    def _event(self, kind: str, **fields: Any) -> EVENT:
        event = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return event

    def feed(self, event: Event, ts: float = 0.0) -> list[EVENT]:
        """The stream events of one of the query's events (often none); ``ts`` is when it was logged."""
        if self.ended:
            return []
        self.now = ts
        handler = _HANDLERS.get(type(event))
        return [] if handler is None else handler(self, event)

    def _started(self, event: RunStarted) -> list[EVENT]:
        self.started = True
        self.created_at = event.at
        self.request = dict(event.request or {})
        self.client_tools = frozenset(tool["name"] for tool in self.request.get("tools") or [])
        if self.request.get("tool_choice") == "none":
            self.client_tools = frozenset()
        snapshot = self.response()
        return [
            self._event("response.created", response=snapshot),
            self._event("response.in_progress", response=snapshot),
        ]

    def _open(self, item: dict[str, Any], pieces: list[str] | None = None) -> tuple[int, list[EVENT]]:
        index = len(self.output)
        self.output.append(item)
        if pieces is not None:
            self.pieces[index] = pieces
        return index, [self._event("response.output_item.added", output_index=index, item=self._item(index))]

    def _close_text(self, status: str = "completed") -> list[EVENT]:
        events = self._close_reasoning(status)
        index = self.message
        if index is None:
            return events
        self.message = None
        self.open_text = None
        item = self.output[index]
        item["status"] = status
        text = "".join(self.pieces[index])
        where = {"item_id": item["id"], "output_index": index, "content_index": 0}
        events += [
            self._event("response.output_text.done", **where, text=text, logprobs=[]),
            self._event("response.content_part.done", **where, part=_output_text(text)),
            self._event("response.output_item.done", output_index=index, item=self._item(index)),
        ]
        return events

    def _close_reasoning(self, status: str = "completed") -> list[EVENT]:
        index = self.reasoning
        if index is None:
            return []
        self.reasoning = None
        item = self.output[index]
        item["status"] = status
        text = "".join(self.pieces[index])
        where = {"item_id": item["id"], "output_index": index, "summary_index": 0}
        return [
            self._event("response.reasoning_summary_text.done", **where, text=text),
            self._event(
                "response.reasoning_summary_part.done", **where, part={"type": "summary_text", "text": text}
            ),
            self._event("response.output_item.done", output_index=index, item=self._item(index)),
        ]

    def _text(self, event: TextDelta) -> list[EVENT]:
        events: list[EVENT] = []
        open_text = self.open_text
        if open_text is None or open_text[0] != event.turn:
            events += self._close_text()
            item_id = unique_id(
                "msg_" + _token(conversation.turn_message_id(self.response_id, event.turn)), self.output
            )
            item = {
                "id": item_id,
                "type": "message",
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
            self.message, opened = self._open(item, [])
            # Opening it closed any reasoning (_close_text): a delta of this turn goes on in it.
            self.open_text = (event.turn, item_id, self.message, self.pieces[self.message])
            events += opened
            events.append(
                self._event(
                    "response.content_part.added",
                    item_id=item_id,
                    output_index=self.message,
                    content_index=0,
                    part=_output_text(""),
                )
            )
        index = self.message
        assert index is not None
        self.pieces[index].append(event.text)
        events.append(
            self._event(
                "response.output_text.delta",
                item_id=self.output[index]["id"],
                output_index=index,
                content_index=0,
                delta=event.text,
                logprobs=[],
            )
        )
        return events

    def _reasoning(self, event: ReasoningDelta) -> list[EVENT]:
        events: list[EVENT] = []
        if self.reasoning is None:
            events += self._close_text()
            item_id = unique_id(
                "rs_" + _token(conversation.turn_message_id(self.response_id, event.turn)), self.output
            )
            self.reasoning, opened = self._open(
                {"id": item_id, "type": "reasoning", "summary": [], "status": "in_progress"}, []
            )
            events += opened
            events.append(
                self._event(
                    "response.reasoning_summary_part.added",
                    item_id=item_id,
                    output_index=self.reasoning,
                    summary_index=0,
                    part={"type": "summary_text", "text": ""},
                )
            )
        index = self.reasoning
        self.pieces[index].append(event.text)
        events.append(
            self._event(
                "response.reasoning_summary_text.delta",
                item_id=self.output[index]["id"],
                output_index=index,
                summary_index=0,
                delta=event.text,
            )
        )
        return events

    def _call(self, tool: str, tool_use_id: str) -> tuple[int, list[EVENT]]:
        """The call's item, opened now if it is new."""
        index = self.calls.get(tool_use_id)
        if index is not None:
            return index, []
        events = self._close_text()
        if tool in self.client_tools:
            item = {
                "id": f"fc_{tool_use_id}",
                "type": "function_call",
                "status": "in_progress",
                "call_id": tool_use_id,
                "name": tool,
                "arguments": "",
            }
        else:
            item = {
                "id": f"mcp_{tool_use_id}",
                "type": "mcp_call",
                "status": "in_progress",
                "server_label": SERVER_LABEL,
                "name": tool,
                "arguments": "",
                "output": None,
                "error": None,
            }
        index, opened = self._open(item, [])
        self.calls[tool_use_id] = index
        events += opened
        if item["type"] == "mcp_call":
            events.append(
                self._event("response.mcp_call.in_progress", item_id=item["id"], output_index=index)
            )
        return index, events

    def _arguments_kind(self, index: int) -> str:
        return "function_call" if self.output[index]["type"] == "function_call" else "mcp_call"

    def _tool_start(self, event: ToolUseStart) -> list[EVENT]:
        return self._call(event.tool, event.tool_use_id)[1]

    def _tool_delta(self, event: ToolInputDelta) -> list[EVENT]:
        index = self.calls.get(event.tool_use_id)
        if index is None:
            return []
        self.pieces[index].append(event.delta)
        kind = self._arguments_kind(index)
        return [
            self._event(
                f"response.{kind}_arguments.delta",
                item_id=self.output[index]["id"],
                output_index=index,
                delta=event.delta,
            )
        ]

    def _tool_use(self, event: ToolUse) -> list[EVENT]:
        index, events = self._call(event.tool, event.tool_use_id)
        pieces = self.pieces[index]
        arguments = "".join(pieces) or jsonsafe.arguments_text(event.input)
        pieces[:] = [arguments]
        item = self.output[index]
        kind = self._arguments_kind(index)
        # A function call's names the function, as OpenAI's own does (openai 3.3's types require it).
        named = {"name": item["name"]} if kind == "function_call" else {}
        events.append(
            self._event(
                f"response.{kind}_arguments.done",
                item_id=item["id"],
                output_index=index,
                arguments=arguments,
                **named,
            )
        )
        if kind == "function_call":
            item["status"] = "completed"
            events.append(
                self._event("response.output_item.done", output_index=index, item=self._item(index))
            )
        return events

    def _tool_result(self, event: ToolResult) -> list[EVENT]:
        index = self.calls.get(event.tool_use_id)
        if index is None or self.output[index]["type"] != "mcp_call":
            return []
        item = self.output[index]
        item["status"] = "failed" if event.is_error else "completed"
        item["output"] = event.result
        item["error"] = tool_error(event.result) if event.is_error else None
        outcome = "failed" if event.is_error else "completed"
        return [
            self._event(f"response.mcp_call.{outcome}", item_id=item["id"], output_index=index),
            self._event("response.output_item.done", output_index=index, item=self._item(index)),
        ]

    def _approval(self, event: ToolApprovalRequest) -> list[EVENT]:
        events = self._close_text()
        index, opened = self._open(
            {
                "id": f"mcpr_{event.approval_id}",
                "type": "mcp_approval_request",
                "server_label": SERVER_LABEL,
                "name": event.tool,
                "arguments": jsonsafe.arguments_text(event.input),
                "approval_id": event.approval_id,
            }
        )
        events += opened
        events.append(self._event("response.output_item.done", output_index=index, item=self._item(index)))
        return events

    def _close_all(self, status: str) -> list[EVENT]:
        """Close every open item: ``completed`` text at a clean end, else ``status``."""
        events = self._close_text("completed" if self.status == "completed" else status)
        for index, item in enumerate(self.output):
            if item.get("status") == "in_progress":
                item["status"] = status
                events.append(
                    self._event("response.output_item.done", output_index=index, item=self._item(index))
                )
        return events

    def _done(self, event: RunDone) -> list[EVENT]:
        self.usage = event.usage
        self.completed_at = self.now
        if event.cancelled:
            self.status, kind = "cancelled", "response.incomplete"
        elif event.stop_reason in {"content_filtered", "guardrail_intervened"}:
            self.status, kind = "incomplete", "response.incomplete"
            self.incomplete = {"reason": "content_filter"}
        elif event.max_turns_reached:
            self.status, kind = "incomplete", "response.incomplete"
            self.incomplete = {"reason": "max_turns"}
        elif event.truncated or event.stop_reason == "max_tokens":
            self.status, kind = "incomplete", "response.incomplete"
            self.incomplete = {"reason": "max_output_tokens"}
        else:
            self.status, kind = "completed", "response.completed"
        events = self._close_all("incomplete")
        self.ended = True
        events.append(self._event(kind, response=self.response()))
        return events

    def _failed(self, event: RunError) -> list[EVENT]:
        self.usage = event.usage
        self.error = {"code": event.code, "message": event.error}
        self.status = "failed"
        events = self._close_all("incomplete")
        self.ended = True
        events.append(self._event("response.failed", response=self.response()))
        return events

    def cut_short(self, ending: Ending) -> list[EVENT]:
        """The ``error`` event of a stream that ended before the response did."""
        error = ending.as_error()
        return [self._event("error", code=error.code, message=error.error, param=None)]


def _output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


_HANDLERS: dict[type, Any] = {
    RunStarted: ResponseProjection._started,
    TextDelta: ResponseProjection._text,
    ReasoningDelta: ResponseProjection._reasoning,
    ToolUseStart: ResponseProjection._tool_start,
    ToolInputDelta: ResponseProjection._tool_delta,
    ToolUse: ResponseProjection._tool_use,
    ToolResult: ResponseProjection._tool_result,
    ToolApprovalRequest: ResponseProjection._approval,
    RunDone: ResponseProjection._done,
    RunError: ResponseProjection._failed,
}


def sse_event(event: EVENT) -> str:
    """One stream event as OpenAI writes it, ``event:`` its type and ``data:`` it, with its
    sequence number as ``id:``: a browser's ``EventSource`` that reconnects to
    ``GET /v1/responses/{id}?stream=true`` sends it back as ``Last-Event-ID`` and resumes after it."""
    return (
        f"id: {event['sequence_number']}{SSE_SEP}event: {event['type']}{SSE_SEP}"
        f"data: {jsonsafe.dumps(event)}{SSE_SEP}{SSE_SEP}"
    )


_CACHE_KEY = "responses"
_EVENTS_KEY = "responses.events"


class ResponseStream(Projector):
    """A response's events on SSE, written after ``starting_after`` (-1: all of them).

    A text delta inside an open message (most of a stream) is the same bytes for every reader of
    the entry, numbered as every reader numbers it, so its block is made once and kept on the
    entry (keyed by its number and item, which any reader of the same response agrees on). Every
    other entry's events are too, once the projection has seen the entry (it keeps the response's
    state per reader): their blocks are kept on the entry by the response and the first number.
    """

    __slots__ = ("projection", "starting_after")

    def __init__(self, projection: ResponseProjection, starting_after: int = -1) -> None:
        self.projection = projection
        self.starting_after = starting_after

    def frames(self, entry: LogEntry) -> bytes:
        event = entry.event
        projection = self.projection
        # open_text is None before the response starts and after it ends, so this path is a
        # delta inside the open message alone: the event the projection would make, as bytes,
        # without making its dict for every reader.
        open_text = projection.open_text
        if open_text is not None and type(event) is TextDelta and open_text[0] == event.turn:
            _, item_id, index, pieces = open_text
            seq = projection.seq
            projection.seq = seq + 1
            pieces.append(event.text)
            if seq <= self.starting_after:
                return b""
            cached = entry.encoded.get(_CACHE_KEY)
            if cached is not None and cached[0] == seq and cached[1] == item_id:
                return cached[2]
            block = (
                f"id: {seq}{SSE_SEP}event: response.output_text.delta{SSE_SEP}"
                f'data: {{"type":"response.output_text.delta","sequence_number":{seq},'
                f'"item_id":"{item_id}","output_index":{index},"content_index":0,'
                f'"delta":{jsonsafe.quote(event.text)},"logprobs":[]}}{SSE_SEP}{SSE_SEP}'
            ).encode()
            entry.encoded[_CACHE_KEY] = (seq, item_id, block)
            return block
        seq = projection.seq
        events = projection.feed(event, entry.ts)
        if not events:
            return b""
        after = self.starting_after
        if seq <= after:
            return "".join([sse_event(item) for item in events if item["sequence_number"] > after]).encode()
        # All of the entry's events are written: the same blocks as every reader's that numbered
        # them alike (the snapshots of response.created and response.completed among them).
        cached = entry.encoded.get(_EVENTS_KEY)
        if cached is not None and cached[0] == seq and cached[1] == projection.response_id:
            return cached[2]
        block = "".join([sse_event(item) for item in events]).encode()
        entry.encoded[_EVENTS_KEY] = (seq, projection.response_id, block)
        return block

    def end(self, ending: Ending | None) -> str:
        if ending is None or ending.clean or self.projection.ended:
            return ""
        # Purged past this reader, the store gone, or the log closed under it (the session
        # deleted, the server going away): said in OpenAI's way rather than by hanging up.
        return "".join(sse_event(item) for item in self.projection.cut_short(ending))
