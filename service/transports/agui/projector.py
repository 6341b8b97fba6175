"""AG-UI events, projected from a session's log with the models and encoder of ``ag-ui-protocol``.

``POST /ag-ui`` (a ``RunAgentInput``) and ``GET /ag-ui/{threadId}/events`` (its resume) answer
with these events, one SSE ``data:`` each, with the log entry's id as ``id:`` (AG-UI itself has no
resume): ``RUN_STARTED``, then ``MESSAGES_SNAPSHOT`` (the conversation so far, so a client that
joins late has it), ``STEP_STARTED`` / ``STEP_FINISHED`` around each model turn,
``TEXT_MESSAGE_START`` / ``_CONTENT`` / ``_END``, ``REASONING_START`` with
``REASONING_MESSAGE_*`` and ``REASONING_END``, ``TOOL_CALL_START`` / ``_ARGS`` / ``_END`` and
``TOOL_CALL_RESULT``, and ``RUN_FINISHED`` (usage and the answer in ``result``) or ``RUN_ERROR``.

The ids are the conversation's own (:mod:`service.transports.agui.models`): a model turn's text
and tool calls belong to the assistant message ``turn_message_id(reply_id, turn)``, which the
session stores under the same id, so a later snapshot names every message as the stream did.

A query that waits ends the HTTP run while it keeps waiting on the server: for tool approvals
with ``RUN_FINISHED`` whose ``outcome`` is ``{"type": "interrupt", "interrupts": [...]}``, one
interrupt per pending approval (``id`` the approval id, ``toolCallId``, ``expiresAt``, the call
in ``metadata``), answered by the next ``RunAgentInput``'s ``resume``; for calls of the client's
own tools with a ``success`` outcome naming them in ``pendingToolCallIds``, answered by the next
input's ``role: "tool"`` messages. Either way that next run streams the rest of the same query,
from a ``MESSAGES_SNAPSHOT`` of what the client was shown up to the wait.

As with :mod:`service.transports.aisdk.projector`, an :class:`AgUiStream` per stream keeps which message is
open, fed in order (and primed with what a resumed client has seen); each event kind has a handler
in :data:`_HANDLERS`.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from ag_ui.core import (
    BaseEvent,
    Interrupt,
    MessagesSnapshotEvent,
    ReasoningEndEvent,
    ReasoningMessageContentEvent,
    ReasoningMessageEndEvent,
    ReasoningMessageStartEvent,
    ReasoningStartEvent,
    RunErrorEvent,
    RunFinishedEvent,
    RunFinishedInterruptOutcome,
    RunFinishedSuccessOutcome,
    RunStartedEvent,
    StepFinishedEvent,
    StepStartedEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    TokenUsage,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
    UserMessage,
)
from ag_ui.encoder import EventEncoder

from service.core.conversation import turn_message_id
from service.core.events import (
    ClientToolRequest,
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
from service.transports.agui.models import Transcript, history_before, messages_of, tool_message_id
from service.transports.stream.follow import Ending
from service.transports.stream.resume import waits_after
from service.transports.stream.sse import Projector

ENCODER = EventEncoder()
INTERRUPT_REASON = "tool_approval"
# What a resume entry's payload holds (the service's own approval answer).
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {
        "approved": {"type": "boolean"},
        "reason": {"type": "string", "maxLength": 2000},
        "input": {"type": "object", "description": "An edited input for the tool (approved only)."},
    },
    "required": ["approved"],
}


class AgUiStream(Projector):
    """The AG-UI events of one stream, from the log entries it is fed in order."""

    def __init__(
        self,
        thread_id: str,
        conversation: list[dict[str, Any]],
        run_id: str | None = None,
        *,
        continued: bool = False,
    ) -> None:
        self.thread_id = thread_id
        # The session's conversation (Bedrock's format); the query's history is cut from it when
        # its RUN_STARTED is projected, as the query may have added to it by then, or not yet.
        self.conversation = conversation
        self.run_id = run_id  # the client's runId, else the log's
        self.continued = continued  # a run that goes on with a query that waited
        self.reply_id = ""  # the query's answer (the ids of its messages derive from it)
        self.message_id: str | None = None  # the open text message
        self.reasoning_id: str | None = None  # the open reasoning message
        self.step: str | None = None  # the open step's name
        self.interrupts: dict[str, Interrupt] = {}  # the approvals pending, by id
        self.pending_calls: dict[str, None] = {}  # the client tool calls waiting, in order
        self.transcript: Transcript | None = None  # what a primed client was shown

    def events(self, entry: LogEntry) -> list[BaseEvent]:
        """The AG-UI events one log entry becomes (often none)."""
        handler = _HANDLERS.get(type(entry.event))
        return [] if handler is None else handler(self, entry.event, entry.id)

    def prime(self, entries: list[LogEntry]) -> None:
        """Take in what a resumed client has seen already, writing nothing."""
        transcript = self.transcript = self.transcript or Transcript()
        for entry in entries:
            for event in self.events(entry):
                transcript.apply(event)

    def ended(self, error: RunError) -> list[BaseEvent]:
        """The events that end a stream cut short (the log purged or closed, the store gone)."""
        return [RunErrorEvent(message=error.error, code=error.code)]

    def paused(self) -> list[BaseEvent]:
        """The events that end a run whose query now waits: for approvals (an interrupt), or for
        the results of the client's tools (they are the run's pending tool calls)."""
        events = self._close_step()
        outcome: RunFinishedInterruptOutcome | RunFinishedSuccessOutcome | None = None
        if self.interrupts:
            outcome = RunFinishedInterruptOutcome(interrupts=list(self.interrupts.values()))
        elif self.pending_calls:
            outcome = RunFinishedSuccessOutcome(pending_tool_call_ids=list(self.pending_calls))
        events.append(RunFinishedEvent(thread_id=self.thread_id, run_id=self.run_id or "", outcome=outcome))
        return events

    # As the stream's projector (see service.transports.stream.sse).

    def head(self) -> str:
        """A continued run's start: its own RUN_STARTED, and the messages the client was shown up
        to the wait (so it drops what it added itself, such as its tool messages, for the
        service's own, which the stream brings next)."""
        if not self.continued:
            return ""
        shown = self.transcript.messages if self.transcript is not None else []
        return "".join(
            [
                encode(RunStartedEvent(thread_id=self.thread_id, run_id=self.run_id or "")),
                encode(MessagesSnapshotEvent(messages=shown)),
            ]
        )

    def frames(self, entry: LogEntry) -> bytes:
        """The entry's SSE blocks (AG-UI's client splits events on a bare ``\\n\\n``).

        A text delta inside an open message and step (most of a stream) is the same
        ``TEXT_MESSAGE_CONTENT`` for every reader of the entry, so it is encoded once and kept on
        the entry, keyed by the message it belongs to.
        """
        event = entry.event
        open_text = type(event) is TextDelta and self.message_id is not None and self.step is not None
        if open_text:
            cached = entry.encoded.get("ag-ui")
            if cached is not None and cached[0] == self.message_id:
                return cached[1]
        block = "".join([encode(each, entry.id) for each in self.events(entry)]).encode()
        if open_text:
            entry.encoded["ag-ui"] = (self.message_id, block)
        return block

    def shared_batch(self, entries: list[LogEntry], shared: dict[Any, Any]) -> tuple[bytes, int]:
        """A window of text deltas inside an open message and step reads the same for every
        stream in it (it changes no state): one ``TEXT_MESSAGE_CONTENT`` with their text and the
        last one's id, made once. Anything else is this stream's own."""
        block = self.message_id if self.step is not None else None
        return self.shared_texts(entries, shared, block, self._merged)

    def _merged(self, entries: list[LogEntry]) -> tuple[bytes, int]:
        text = "".join(entry.event.text for entry in entries)  # type: ignore[attr-defined]
        if not text:
            return b"", len(entries)
        content = TextMessageContentEvent(message_id=self.message_id, delta=text)  # type: ignore[arg-type]
        return encode(content, entries[-1].id).encode(), len(entries)

    def holds(self, entry: LogEntry) -> bool:
        event = entry.event
        return type(event) is StatusChange and event.status == WAITING

    def stops(self, batch: list[LogEntry]) -> bytes | None:
        # The query waits for its approvals: this run ends with its interrupts.
        if not waits_after(batch):
            return None
        return "".join(encode(event) for event in self.paused()).encode()

    def end(self, ending: Ending | None) -> str:
        if ending is None or ending.clean:
            return ""
        # Purged past this reader, the store gone, or the log closed under it: RUN_ERROR.
        return "".join(encode(event) for event in self.ended(ending.as_error()))

    def _close_blocks(self) -> list[BaseEvent]:
        events: list[BaseEvent] = []
        if self.reasoning_id is not None:
            events.append(ReasoningMessageEndEvent(message_id=self.reasoning_id))
            events.append(ReasoningEndEvent(message_id=self.reasoning_id))
            self.reasoning_id = None
        if self.message_id is not None:
            events.append(TextMessageEndEvent(message_id=self.message_id))
            self.message_id = None
        return events

    def _turn_message(self, turn: int) -> str:
        return turn_message_id(self.reply_id, turn)

    def _open_step(self, turn: int) -> list[BaseEvent]:
        if self.step is not None:
            return []
        self.step = f"turn-{turn}"
        return [StepStartedEvent(step_name=self.step)]

    def _close_step(self) -> list[BaseEvent]:
        events = self._close_blocks()
        if self.step is not None:
            events.append(StepFinishedEvent(step_name=self.step))
            self.step = None
        return events

    def _run_started(self, event: RunStarted, entry_id: int) -> list[BaseEvent]:
        run_id = self.run_id = self.run_id or event.run_id
        self.reply_id = event.reply_id or event.run_id  # a log from before the ids: the run's
        history = history_before(self.conversation, event.message_id)
        messages = [
            *messages_of(history),
            UserMessage(id=event.message_id or f"m{len(history)}", content=event.message),
        ]
        return [
            RunStartedEvent(thread_id=self.thread_id, run_id=run_id),
            MessagesSnapshotEvent(messages=messages),
        ]

    def _text(self, event: TextDelta, entry_id: int) -> list[BaseEvent]:
        events = self._open_step(event.turn)
        if self.message_id is None:
            events += self._close_blocks()
            self.message_id = self._turn_message(event.turn)
            events.append(TextMessageStartEvent(message_id=self.message_id, role="assistant"))
        if event.text:  # AG-UI wants a delta to say something
            events.append(TextMessageContentEvent(message_id=self.message_id, delta=event.text))
        return events

    def _reasoning(self, event: ReasoningDelta, entry_id: int) -> list[BaseEvent]:
        events = self._open_step(event.turn)
        if self.reasoning_id is None:
            events += self._close_blocks()
            self.reasoning_id = f"{self._turn_message(event.turn)}-reasoning"
            events.append(ReasoningStartEvent(message_id=self.reasoning_id))
            events.append(ReasoningMessageStartEvent(message_id=self.reasoning_id, role="reasoning"))
        if event.text:
            events.append(ReasoningMessageContentEvent(message_id=self.reasoning_id, delta=event.text))
        return events

    def _tool_start(self, event: ToolUseStart, entry_id: int) -> list[BaseEvent]:
        events = [*self._open_step(event.turn), *self._close_blocks()]
        events.append(
            ToolCallStartEvent(
                tool_call_id=event.tool_use_id,
                tool_call_name=event.tool,
                parent_message_id=self._turn_message(event.turn),
            )
        )
        return events

    def _tool_input(self, event: ToolInputDelta, entry_id: int) -> list[BaseEvent]:
        return [ToolCallArgsEvent(tool_call_id=event.tool_use_id, delta=event.delta)] if event.delta else []

    def _tool_use(self, event: ToolUse, entry_id: int) -> list[BaseEvent]:
        return [ToolCallEndEvent(tool_call_id=event.tool_use_id)]

    def _tool_result(self, event: ToolResult, entry_id: int) -> list[BaseEvent]:
        return [
            ToolCallResultEvent(
                message_id=tool_message_id(event.tool_use_id),
                tool_call_id=event.tool_use_id,
                content=event.result,
                role="tool",
            )
        ]

    def _approval_request(self, event: ToolApprovalRequest, entry_id: int) -> list[BaseEvent]:
        self.interrupts[event.approval_id] = Interrupt(
            id=event.approval_id,
            reason=INTERRUPT_REASON,
            message=f"Run the tool {event.tool}?",
            tool_call_id=event.tool_use_id,
            response_schema=ANSWER_SCHEMA,
            expires_at=datetime.fromtimestamp(event.expires_at, UTC).isoformat(),
            metadata={"toolName": event.tool, "toolInput": event.input},
        )
        return []

    def _approval_response(self, event: ToolApprovalResponse, entry_id: int) -> list[BaseEvent]:
        self.interrupts.pop(event.approval_id, None)
        return []

    def _client_tool_request(self, event: ClientToolRequest, entry_id: int) -> list[BaseEvent]:
        self.pending_calls[event.tool_use_id] = None
        return []

    def _client_tool_result(self, event: ClientToolResult, entry_id: int) -> list[BaseEvent]:
        self.pending_calls.pop(event.tool_use_id, None)
        return []

    def _step(self, event: StepCompleted, entry_id: int) -> list[BaseEvent]:
        return self._close_step()

    def _done(self, event: RunDone, entry_id: int) -> list[BaseEvent]:
        usage = event.usage
        result: dict[str, Any] = {
            "output": event.output,
            "turns": event.turns,
            "stop_reason": event.stop_reason,
        }
        for flag in ("truncated", "max_turns_reached", "cancelled"):
            if getattr(event, flag):
                result[flag] = True
        return [
            *self._close_step(),
            RunFinishedEvent(
                thread_id=self.thread_id,
                run_id=self.run_id or "",
                result=result,
                usage=[
                    TokenUsage(
                        input_tokens=usage.input_tokens,
                        output_tokens=usage.output_tokens,
                        total_tokens=usage.total_tokens,
                    )
                ],
            ),
        ]

    def _error(self, event: RunError, entry_id: int) -> list[BaseEvent]:
        # RUN_ERROR ends the run as it stands: nothing may follow it, open messages included.
        return [RunErrorEvent(message=event.error, code=event.code)]


_HANDLERS: dict[type[Event], Callable[[AgUiStream, Any, int], list[BaseEvent]]] = {
    RunStarted: AgUiStream._run_started,
    TextDelta: AgUiStream._text,
    ReasoningDelta: AgUiStream._reasoning,
    ToolUseStart: AgUiStream._tool_start,
    ToolInputDelta: AgUiStream._tool_input,
    ToolUse: AgUiStream._tool_use,
    ToolResult: AgUiStream._tool_result,
    ToolApprovalRequest: AgUiStream._approval_request,
    ToolApprovalResponse: AgUiStream._approval_response,
    ClientToolRequest: AgUiStream._client_tool_request,
    ClientToolResult: AgUiStream._client_tool_result,
    StepCompleted: AgUiStream._step,
    RunDone: AgUiStream._done,
    RunError: AgUiStream._error,
}


def encode(event: BaseEvent, entry_id: int | None = None) -> str:
    """One event as AG-UI's encoder writes it, with the log's id as ``id:`` before it."""
    block = ENCODER.encode(event)
    return block if entry_id is None else f"id: {entry_id}\n{block}"
