"""A query's state across its model turns, the events that end it, and the conversation kept
whole when a turn ends early. The agent loop (:mod:`service.agent.loop`) drives it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from service.core.conversation import results_message_id, turn_message_id
from service.core.events import Event, RunDone, RunError, StepCompleted, ToolCall, TurnCompleted, Usage
from service.core.options import RunOptions
from service.errors import ProviderError
from service.providers.base import TurnResult


@dataclass
class Turn:
    """How one model turn ended: a result, or a provider error; and the text the client saw of it."""

    seen: list[str] = field(default_factory=list)
    result: TurnResult | None = None
    error: ProviderError | None = None


@dataclass
class Query:
    """One query's state across its model turns, and the events that end it."""

    messages: list[dict[str, Any]]
    options: RunOptions
    system: str
    max_tokens: int
    offset: int  # steps before the first model turn's: the plan's
    total: Usage = field(default_factory=Usage)
    tool_calls: list[ToolCall] = field(default_factory=list)
    turn: int = 0
    dropped: int = 0  # messages the window left out at the last turn
    over: bool = False  # the planning turn failed: the query has ended
    agent: str = ""  # the agent's name, told on done

    @property
    def client_names(self) -> frozenset[str]:
        return self.options.client_tool_names

    def keep(self, message: dict[str, Any], *, usage: Usage | None = None, results: bool = False) -> None:
        """Add a message of this turn to the conversation, with its id (see
        :mod:`service.core.conversation`) and the usage of the turn that wrote it."""
        reply_id = self.options.reply_id
        if reply_id:
            message["id"] = (results_message_id if results else turn_message_id)(reply_id, self.turn)
        if usage is not None:
            message["usage"] = usage.model_dump()
        self.messages.append(message)

    def close(self, turn: Turn, *, interrupted: bool = False) -> None:
        """After a failed or cancelled turn, keep what the user saw of the answer, if anything;
        an answer cut short by a cancel is marked so."""
        text = "".join(turn.seen)
        if text.strip():
            message: dict[str, Any] = {"role": "assistant", "content": [{"text": text}]}
            if interrupted:
                message["interrupted"] = True
            self.keep(message)

    @property
    def step(self) -> int:
        return self.turn + self.offset

    def done(self, **fields: Any) -> RunDone:
        return RunDone(
            turns=self.turn,
            final_step=self.step + 1,
            tool_calls=self.tool_calls,
            usage=self.total,
            agent=self.agent,
            **fields,
        )

    def completed(self, result: TurnResult) -> TurnCompleted:
        self.total = self.total + result.usage
        return TurnCompleted(
            turn=self.turn,
            stop_reason=result.stop_reason,
            usage=result.usage,
            total_usage=self.total,
            latency_ms=result.latency_ms,
        )

    def failed(self, current: Turn, error: ProviderError) -> list[Event]:
        """The model turn failed: the step with what the client saw of it, and the error."""
        return [
            StepCompleted(
                turn=self.turn, step_number=self.step, text="".join(current.seen), error=str(error)
            ),
            RunError(
                error=str(error),
                code=error.code,
                turns=self.turn,
                recoverable=error.retryable,
                usage=self.total,
            ),
        ]

    def handed_back(self, result: TurnResult) -> list[Event]:
        """The turn called some of the client's tools: the query ends for the client to run them."""
        names = self.client_names
        self.keep(handed_back(result, names), usage=result.usage)
        handed = [use for use in result.tool_uses if use.tool in names]
        return [
            StepCompleted(
                turn=self.turn,
                step_number=self.step,
                text=result.text,
                tool_calls=[
                    ToolCall(tool=use.tool, input=use.input, tool_use_id=use.tool_use_id) for use in handed
                ],
                usage=result.usage,
            ),
            self.done(output=result.text, stop_reason="tool_use"),
        ]

    def answered(self, result: TurnResult) -> list[Event]:
        """The model answered without tools: the last step and the end of the query."""
        self.keep(assistant_message(result), usage=result.usage)
        return [
            StepCompleted(turn=self.turn, step_number=self.step, text=result.text, usage=result.usage),
            self.done(
                output=result.text,
                stop_reason=result.stop_reason,
                truncated=result.stop_reason == "max_tokens",
            ),
        ]


def assistant_message(result: TurnResult) -> dict[str, Any]:
    content = [block for block in result.message.get("content", []) if "toolUse" not in block]
    if not content:
        # Bedrock wants every assistant message to hold something.
        content = [{"text": result.text or "(no answer)"}]
    return {"role": "assistant", "content": content}


def handed_back(result: TurnResult, client_names: frozenset[str]) -> dict[str, Any]:
    """The assistant message of a turn that called client tools: its calls to them (the client
    answers them next), without its calls to the agent's own tools, which were not run."""
    content = [
        block
        for block in result.message.get("content", [])
        if "toolUse" not in block or block["toolUse"].get("name") in client_names
    ]
    return {"role": "assistant", "content": content}
