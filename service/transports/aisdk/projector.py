"""The Vercel AI SDK's UI message stream (protocol v1), projected from a session's log.

``POST /api/chat`` (the body ``DefaultChatTransport`` of npm ``ai`` 6 sends) and
``GET /api/chat/{id}/stream`` (its resume) answer with these parts, one SSE ``data:`` each, each
with the id of the log entry it comes from as ``id:``; ``data: [DONE]`` ends the stream. The part
shapes are those of ``uiMessageChunkSchema`` in the ``ai`` package:

- ``start`` ``{messageId}`` for the query (the id the server's conversation keeps its answer by), ``start-step`` / ``finish-step`` around each model turn;
- ``text-start`` / ``text-delta`` ``{id, delta}`` / ``text-end`` and the same for ``reasoning-*``;
- the service's own tools as dynamic tools: ``tool-input-start`` ``{toolCallId, toolName}``,
  ``tool-input-delta`` ``{toolCallId, inputTextDelta}``, ``tool-input-available`` ``{input}``,
  then ``tool-output-available`` ``{output}`` or ``tool-output-error`` ``{errorText}``;
- the browser's own tools (declared in the request's ``tools``) the same way but static (no
  ``dynamic``): the chat holds them as ``tool-<name>`` parts and calls ``onToolCall`` with them
  (its handlers skip ``toolCall.dynamic``). The query waits for their results, and the stream
  ends as for an approval (below); the output the browser gave is told to every reader as
  ``tool-output-available`` (or ``tool-output-error``) once it has come;
- ``finish`` ``{finishReason, messageMetadata: {usage, turns, ...}}``, or ``abort`` then ``finish``
  for a cancelled query, or ``error`` ``{errorText}`` for a failed one;
- a tool call that waits for approval: ``tool-approval-request`` ``{approvalId, toolCallId}``, and
  the stream ends as the SDK ends a step awaiting approval (``finish-step``, ``finish``
  ``{finishReason: "tool-calls"}``) while the query waits on the server; the client's next
  ``POST /api/chat`` carries the answers (tool parts in state ``approval-responded``) and gets the
  rest of the same query. A denied call is ``tool-output-denied`` ``{toolCallId}``.

Unlike the session dialect this one has state (which text block is open, whether a step is), so a
:class:`UIMessageStream` is made per stream. It is still a pure function of the events it is fed:
a stream resumed mid-query feeds it what came before without writing it (:meth:`prime`), so the
block ids a client saw stay the ids it gets. Each event kind has a handler in :data:`_HANDLERS`;
a new canonical event gets a handler there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from service import jsonsafe
from service.core.events import (
    ClientToolResult,
    Event,
    ReasoningDelta,
    RunDone,
    RunError,
    RunStarted,
    StatusChange,
    StepCompleted,
    TextDelta,
    ToolApprovalRequest,
    ToolApprovalResponse,
    ToolInputDelta,
    ToolResult,
    ToolUse,
    ToolUseStart,
)
from service.core.log import LogEntry
from service.core.sessions import WAITING
from service.transports.stream.follow import Ending
from service.transports.stream.frames import SSE_SEP, sse_block
from service.transports.stream.resume import waits_after
from service.transports.stream.session import usage_dict
from service.transports.stream.sse import Projector

HEADERS = {"x-vercel-ai-ui-message-stream": "v1"}
DONE_BLOCK = f"data: [DONE]{SSE_SEP}{SSE_SEP}"

Part = dict[str, Any]


def usage_metadata(event: RunDone | RunError) -> dict[str, Any]:
    """What ``finish`` carries as ``messageMetadata``: the usage as every wire names it, and more."""
    metadata: dict[str, Any] = {"usage": usage_dict(event.usage), "turns": event.turns}
    if isinstance(event, RunDone):
        metadata["stop_reason"] = event.stop_reason
        for flag in ("truncated", "max_turns_reached", "cancelled"):
            if getattr(event, flag):
                metadata[flag] = True
    return metadata


def finish_reason(event: RunDone) -> str:
    """The AI SDK's finish reason for a query that ended."""
    if event.truncated:
        return "length"
    if event.cancelled or event.max_turns_reached:
        return "other"
    return "stop"


class UIMessageStream(Projector):
    """The parts of one AI SDK stream, from the log entries it is fed in order."""

    def __init__(self, server_tool: Callable[[str], bool] = lambda name: True) -> None:
        self.server_tool = server_tool  # False for a tool the browser runs: a static tool part
        self.text_id: str | None = None  # the open text block
        self.reasoning_id: str | None = None  # the open reasoning block
        self.step_open = False
        self.started = False
        self.approval_calls: dict[str, str] = {}  # approval id -> its tool call id
        self.denied: set[str] = set()  # tool calls denied: their error result is not told again
        self.browser_calls: set[str] = set()  # calls of the browser's tools
        self.told: set[str] = set()  # browser tool calls whose result was told as the browser gave it

    def parts(self, entry: LogEntry) -> list[Part]:
        """The parts one log entry becomes (often none)."""
        handler = _HANDLERS.get(type(entry.event))
        return [] if handler is None else handler(self, entry.event, entry.id)

    def prime(self, entries: list[LogEntry]) -> None:
        """Take in what a resumed client has seen already, writing nothing."""
        for entry in entries:
            self.parts(entry)

    def ended(self, error: RunError) -> list[Part]:
        """The parts that end a stream cut short (the log purged or closed, the store gone)."""
        return [*self._close_blocks(), {"type": "error", "errorText": error.error}]

    def paused(self) -> list[Part]:
        """The parts that end a stream whose query now waits for approvals."""
        return [*self._close_step(), {"type": "finish", "finishReason": "tool-calls"}]

    # As the stream's projector (see service.transports.stream.sse).

    def frames(self, entry: LogEntry) -> bytes:
        """The entry's SSE blocks, each part with the entry's id.

        A text delta inside an open block (most of a stream) is the same for every reader of the
        entry, so its block is made once and kept on the entry.
        """
        event = entry.event
        if type(event) is TextDelta and self.text_id is not None:
            cached = entry.encoded.get("aisdk")
            if cached is not None and cached[0] == self.text_id:
                return cached[1]
            block = (
                f'id: {entry.id}{SSE_SEP}data: {{"type":"text-delta","id":"{self.text_id}",'
                f'"delta":{jsonsafe.quote(event.text)}}}{SSE_SEP}{SSE_SEP}'
            ).encode()
            entry.encoded["aisdk"] = (self.text_id, block)
            return block
        return "".join([sse_block(jsonsafe.dumps(part), id=entry.id) for part in self.parts(entry)]).encode()

    def shared_batch(self, entries: list[LogEntry], shared: dict[Any, Any]) -> tuple[bytes, int]:
        """A window of text deltas inside an open text block reads the same for every stream in
        that block (it changes no state): one ``text-delta`` part with their text (the SDK
        appends deltas, whatever their size) and the last one's id, made once. Anything else is
        this stream's own."""
        return self.shared_texts(entries, shared, self.text_id, self._merged)

    def _merged(self, entries: list[LogEntry]) -> tuple[bytes, int]:
        text = "".join(entry.event.text for entry in entries)  # type: ignore[attr-defined]
        block = (
            f'id: {entries[-1].id}{SSE_SEP}data: {{"type":"text-delta","id":"{self.text_id}",'
            f'"delta":{jsonsafe.quote(text)}}}{SSE_SEP}{SSE_SEP}'
        ).encode()
        return block, len(entries)

    def holds(self, entry: LogEntry) -> bool:
        event = entry.event
        return type(event) is StatusChange and event.status == WAITING

    def stops(self, batch: list[LogEntry]) -> bytes | None:
        # The query waits for its approvals: this stream's part of it is told.
        if not waits_after(batch):
            return None
        return "".join(sse_block(jsonsafe.dumps(part)) for part in self.paused()).encode()

    def end(self, ending: Ending | None) -> str:
        if ending is None or ending.clean:
            return DONE_BLOCK
        # Purged past this reader, the store gone, or the log closed under it: said in the
        # protocol's own error shape rather than by hanging up.
        return "".join(sse_block(jsonsafe.dumps(part)) for part in self.ended(ending.as_error())) + DONE_BLOCK

    # Each handler: (state, event, entry id) -> parts.

    def _close_blocks(self) -> list[Part]:
        parts: list[Part] = []
        if self.reasoning_id is not None:
            parts.append({"type": "reasoning-end", "id": self.reasoning_id})
            self.reasoning_id = None
        if self.text_id is not None:
            parts.append({"type": "text-end", "id": self.text_id})
            self.text_id = None
        return parts

    def _open_step(self) -> list[Part]:
        if self.step_open:
            return []
        self.step_open = True
        return [{"type": "start-step"}]

    def _close_step(self) -> list[Part]:
        parts = self._close_blocks()
        if self.step_open:
            parts.append({"type": "finish-step"})
            self.step_open = False
        return parts

    def _run_started(self, event: RunStarted, entry_id: int) -> list[Part]:
        self.started = True
        return [{"type": "start", "messageId": event.reply_id or f"msg-{event.run_id}"}]

    def _text(self, event: TextDelta, entry_id: int) -> list[Part]:
        parts = self._open_step()
        if self.text_id is None:
            parts += self._close_blocks()
            self.text_id = f"text-{entry_id}"
            parts.append({"type": "text-start", "id": self.text_id})
        parts.append({"type": "text-delta", "id": self.text_id, "delta": event.text})
        return parts

    def _reasoning(self, event: ReasoningDelta, entry_id: int) -> list[Part]:
        parts = self._open_step()
        if self.reasoning_id is None:
            parts += self._close_blocks()
            self.reasoning_id = f"reasoning-{entry_id}"
            parts.append({"type": "reasoning-start", "id": self.reasoning_id})
        parts.append({"type": "reasoning-delta", "id": self.reasoning_id, "delta": event.text})
        return parts

    def _tool_part(self, part: Part, tool_use_id: str) -> Part:
        if tool_use_id not in self.browser_calls:
            part["dynamic"] = True
        return part

    def _tool_start(self, event: ToolUseStart, entry_id: int) -> list[Part]:
        parts = [*self._open_step(), *self._close_blocks()]
        if not self.server_tool(event.tool):
            self.browser_calls.add(event.tool_use_id)
        start = {"type": "tool-input-start", "toolCallId": event.tool_use_id, "toolName": event.tool}
        parts.append(self._tool_part(start, event.tool_use_id))
        return parts

    def _tool_input(self, event: ToolInputDelta, entry_id: int) -> list[Part]:
        return [{"type": "tool-input-delta", "toolCallId": event.tool_use_id, "inputTextDelta": event.delta}]

    def _tool_use(self, event: ToolUse, entry_id: int) -> list[Part]:
        if not self.server_tool(event.tool):
            self.browser_calls.add(event.tool_use_id)
        available = {
            "type": "tool-input-available",
            "toolCallId": event.tool_use_id,
            "toolName": event.tool,
            "input": event.input,
        }
        return [self._tool_part(available, event.tool_use_id)]

    def _approval_request(self, event: ToolApprovalRequest, entry_id: int) -> list[Part]:
        self.approval_calls[event.approval_id] = event.tool_use_id
        return [
            {
                "type": "tool-approval-request",
                "approvalId": event.approval_id,
                "toolCallId": event.tool_use_id,
            }
        ]

    def _approval_response(self, event: ToolApprovalResponse, entry_id: int) -> list[Part]:
        call = self.approval_calls.get(event.approval_id)
        if event.approved or call is None:
            return []  # an approved call's output follows when it has run
        self.denied.add(call)
        return [{"type": "tool-output-denied", "toolCallId": call}]

    def _client_result(self, event: ClientToolResult, entry_id: int) -> list[Part]:
        # The output as the browser gave it (the model is told it as text, in the tool_result).
        call = event.tool_use_id
        self.told.add(call)
        if event.error is not None:
            part = {"type": "tool-output-error", "toolCallId": call, "errorText": event.error}
        else:
            part = {"type": "tool-output-available", "toolCallId": call, "output": event.output}
        return [self._tool_part(part, call)]

    def _tool_result(self, event: ToolResult, entry_id: int) -> list[Part]:
        call = event.tool_use_id
        if call in self.denied or call in self.told:
            return []
        if event.is_error:
            part = {"type": "tool-output-error", "toolCallId": call, "errorText": event.result}
        else:
            part = {"type": "tool-output-available", "toolCallId": call, "output": event.result}
        return [self._tool_part(part, call)]

    def _step(self, event: StepCompleted, entry_id: int) -> list[Part]:
        return self._close_step()

    def _done(self, event: RunDone, entry_id: int) -> list[Part]:
        parts = self._close_step()
        if event.cancelled:
            parts.append({"type": "abort", "reason": "cancelled"})
        parts.append(
            {"type": "finish", "finishReason": finish_reason(event), "messageMetadata": usage_metadata(event)}
        )
        return parts

    def _error(self, event: RunError, entry_id: int) -> list[Part]:
        return [*self._close_step(), {"type": "error", "errorText": event.error}]


_HANDLERS: dict[type[Event], Callable[[UIMessageStream, Any, int], list[Part]]] = {
    RunStarted: UIMessageStream._run_started,
    TextDelta: UIMessageStream._text,
    ReasoningDelta: UIMessageStream._reasoning,
    ToolUseStart: UIMessageStream._tool_start,
    ToolInputDelta: UIMessageStream._tool_input,
    ToolUse: UIMessageStream._tool_use,
    ToolResult: UIMessageStream._tool_result,
    ToolApprovalRequest: UIMessageStream._approval_request,
    ToolApprovalResponse: UIMessageStream._approval_response,
    ClientToolResult: UIMessageStream._client_result,
    StepCompleted: UIMessageStream._step,
    RunDone: UIMessageStream._done,
    RunError: UIMessageStream._error,
}
