"""The agent loop: model, then tools, then model again, told as canonical events.

A plain class: it knows a provider (whose stream is one turn's canonical events, then its
result), a tool executor and the conversation, and nothing of HTTP or of a model's wire. The
conversation stays in Bedrock's message format: the assistant message with its toolUse blocks,
then a user message with the toolResult blocks (``status: error`` for a failed tool). The
conversation is only extended at consistent points, so a cancelled or failed query never leaves
a toolUse without its result.

Tools named in ``require_approval`` (``*``: every tool) wait for a person: the loop hands their
uses to the ``approve`` callback the run manager gives it (see :mod:`service.core.approvals`)
once the model's stream for that turn has ended, so nothing upstream is held while it waits. An
approved call runs (with the approver's edited input, if any, which the conversation then
records); a denied or expired one gets an error result that tells the model the user declined.

A query's :class:`~service.core.options.RunOptions` may bring tools the client runs itself: they
are offered beside the agent's own, and a turn that calls one ends the query there (``done`` with
``stop_reason: tool_use``), its calls handed back unanswered; the client's next query brings their
results (``resume``). Calls to the agent's own tools in that same turn are not run: the client's
conversation could not carry their results. With ``options.client_tools_wait`` (and a
``hand_over`` callback from the run manager) the query does not end there: the calls are handed
to the client and the loop waits for their results as it waits for approvals (see
:mod:`service.core.approvals`), after running the turn's calls of its own tools, then goes on.
"""

from __future__ import annotations

import asyncio
import copy
import json
import math
import random
from collections.abc import AsyncIterator, Callable, Collection
from contextlib import aclosing
from typing import Any

from opentelemetry.trace import Tracer

from service.agent import calls, spans
from service.agent.context import ContextWindow, Window
from service.agent.query import Query, Turn
from service.agent.tools import ToolExecutor, ToolOutcome
from service.core.approvals import Approver, Decision, HandOver
from service.core.conversation import for_model
from service.core.events import (
    ContextTrimmed,
    Event,
    PlanCreated,
    RunError,
    Sink,
    StepCompleted,
    TextDelta,
    ToolCall,
    ToolExecuting,
    ToolResult,
    ToolUse,
    Usage,
)
from service.core.model_calls import TurnObserver, ignore
from service.core.options import RunOptions
from service.core.traces import NO_TRACER
from service.errors import ModelStreamError, ProviderError
from service.providers.base import ModelProvider, ModelRequest, PendingToolUse, TurnResult

# Who "answers" a call that needs approval when the query has no approver: nobody can.
NO_APPROVER = "no_approver"
PLANNING_PROMPT = (
    "Before acting, write a short numbered plan for answering the user's last message. "
    "Do not answer it yet and do not call tools."
)


class AgentLoop:
    """Runs one query against a model with tools, yielding events that end with done or error."""

    def __init__(
        self,
        provider: ModelProvider | None,
        tools: ToolExecutor,
        *,
        system_prompt: str = "",
        max_tokens: int = 4096,
        throttle_retries: int = 2,
        backoff_s: float = 0.5,
        backoff_max_s: float = 8.0,
        planning: bool = False,
        require_approval: Collection[str] = (),
        context_max_tokens: int = 0,
        name: str = "default",
        model: str = "",
        temperature: float | None = None,
        max_turns: int | None = None,
        tracer: Tracer | None = None,
        turn_observer: TurnObserver = ignore,
    ) -> None:
        self.name = name
        self.tracer = tracer or NO_TRACER
        self.turn_observer = turn_observer  # told of each model turn as it ends (the GenAI metrics)
        self.model = model  # "" : the provider's own
        self.temperature = temperature
        self.max_turns = max_turns  # None: the run manager's default
        self.provider = provider
        self.tools = tools
        self.system_prompt = system_prompt
        self.max_tokens = max_tokens
        self.throttle_retries = throttle_retries
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self.planning = planning
        self.context = ContextWindow(context_max_tokens)
        self.require_approval = frozenset(require_approval)

    def needs_approval(self, tool: str) -> bool:
        """True when a call of ``tool`` waits for a person's approval before it runs."""
        return "*" in self.require_approval or tool in self.require_approval

    async def run(
        self,
        messages: list[dict[str, Any]],
        user_text: str,
        max_turns: int,
        options: RunOptions | None = None,
        approve: Approver | None = None,
        sink: Sink | None = None,
        charge: Callable[[Usage], None] | None = None,
        hand_over: HandOver | None = None,
    ) -> AsyncIterator[Event]:
        """Append ``user_text`` to ``messages`` (unless ``options.resume``) and work until end of
        turn, max tokens, max turns, or a call to one of the client's tools; ``approve`` decides
        the tool calls that need approval (without it they are declined). The answer's text
        deltas go to ``sink`` first, if the provider takes one; those it takes are not yielded.
        A model turn cancelled mid-answer reports no usage of its own, though it was billed:
        ``charge`` is then told an estimate of it (see :meth:`_cut_short`) before the
        cancellation goes on."""
        if self.provider is None:
            raise RuntimeError("the agent loop has no model provider yet")
        provider = self.provider
        query = self._query(messages, user_text, options or RunOptions())
        if self.planning:
            async for event in self._plan(provider, query):
                yield event
            if query.over:
                return
        while True:
            if query.turn >= max_turns:
                yield query.done(stop_reason="max_turns", max_turns_reached=True)
                return
            query.turn += 1
            window, request, trimmed = self._request(query)
            if trimmed is not None:
                yield trimmed
            current = Turn()
            # The model's stream is read here, not in a generator of its own: on a store that
            # takes no sink every token passes through, and each generator between costs it.
            try:
                async for event in self._stream_turn(provider, request, query.turn, current, sink=sink):
                    yield event
            except BaseException as stopped:
                query.close(current, interrupted=isinstance(stopped, asyncio.CancelledError))
                if charge is not None and isinstance(stopped, asyncio.CancelledError):
                    charge(self._cut_short(window, current))
                raise
            if current.error is not None:
                query.close(current)
                for event in query.failed(current, current.error):
                    yield event
                return
            result = current.result
            assert result is not None
            self.context.learn(window, result.usage.input_tokens)
            yield query.completed(result)
            waits = hand_over is not None and query.options.client_tools_wait
            if (
                result.stop_reason == "tool_use"
                and not waits
                and any(use.tool in query.client_names for use in result.tool_uses)
            ):
                for event in query.handed_back(result):
                    yield event
                return
            if result.stop_reason == "tool_use" and result.tool_uses:
                async for event in self._tool_step(query, current, result, approve, hand_over):
                    yield event
                continue
            for event in query.answered(result):
                yield event
            return

    def _query(self, messages: list[dict[str, Any]], user_text: str, options: RunOptions) -> Query:
        """A query's state before its first turn, the user's text appended to the conversation
        (after the client's own messages, ``options.prelude``)."""
        messages.extend(copy.deepcopy(list(options.prelude)))
        if not options.resume:
            message: dict[str, Any] = {"role": "user", "content": [{"text": user_text}]}
            if options.message_id:
                message["id"] = options.message_id
            messages.append(message)
        return Query(
            messages=messages,
            options=options,
            system="\n\n".join(part for part in (self.system_prompt, options.system) if part),
            max_tokens=min(self.max_tokens, options.max_tokens or self.max_tokens),
            offset=1 if self.planning else 0,  # the plan is step 1 when there is one
            agent=self.name,
        )

    async def _plan(self, provider: ModelProvider, query: Query) -> AsyncIterator[Event]:
        """The planning turn: its plan, or the error that ends the query (``query.over``)."""
        plan = Turn()
        request = ModelRequest(
            messages=for_model(query.messages),
            system=PLANNING_PROMPT,
            max_tokens=min(query.max_tokens, 1024),
            model=self.model,
            temperature=self.temperature,
        )
        async for event in self._stream_turn(provider, request, 0, plan, emit=False):
            yield event
        if plan.error is not None:
            query.over = True
            yield RunError(error=str(plan.error), code=plan.error.code, recoverable=plan.error.retryable)
            return
        assert plan.result is not None
        query.total = query.total + plan.result.usage
        yield PlanCreated(plan=plan.result.text, usage=plan.result.usage)

    def _request(self, query: Query) -> tuple[Window, ModelRequest, ContextTrimmed | None]:
        """The next model request: the tools on offer (a client's tool hides an own tool of its
        name) and the window of the conversation that fits, with a notice when the window moved."""
        client_names = query.client_names
        own = (spec for spec in self.tools.specs() if spec["name"] not in client_names)
        tool_specs = (*own, *query.options.client_tools)
        messages = query.messages
        window = self.context.fit(messages, query.system, tool_specs)
        trimmed = None
        if window.dropped != query.dropped:
            query.dropped = window.dropped
            trimmed = ContextTrimmed(
                turn=query.turn,
                dropped_messages=window.dropped,
                kept_messages=len(messages) - window.dropped,
                estimated_tokens=window.estimated_tokens,
                max_tokens=self.context.max_tokens,
            )
        request = ModelRequest(
            messages=for_model(messages[window.dropped :] if window.dropped else messages),
            system=query.system,
            tool_specs=tool_specs,
            max_tokens=query.max_tokens,
            model=self.model,
            temperature=self.temperature,
        )
        return window, request, trimmed

    async def _tool_step(
        self,
        query: Query,
        current: Turn,
        result: TurnResult,
        approve: Approver | None,
        hand_over: HandOver | None,
    ) -> AsyncIterator[Event]:
        """Run the turn's tool calls (approved where they need it), hand the client's to the
        client, and put their results in the conversation for the next turn."""
        outcomes: dict[str, ToolOutcome] = {}
        client = query.client_names if hand_over is not None else frozenset()
        try:
            async for event in self._run_tools(result, query.turn, outcomes, approve, client):
                yield event
            if client:
                async for event in self._client_tools(result, query.turn, outcomes, client, hand_over):
                    yield event
        except BaseException as stopped:
            query.close(current, interrupted=isinstance(stopped, asyncio.CancelledError))
            raise
        query.keep(result.message, usage=result.usage)
        query.keep(
            {
                "role": "user",
                "content": [_tool_result_block(outcomes[use.tool_use_id]) for use in result.tool_uses],
            },
            results=True,
        )
        calls = [
            ToolCall(
                tool=use.tool,
                input=outcomes[use.tool_use_id].input,
                tool_use_id=use.tool_use_id,
                is_error=outcomes[use.tool_use_id].is_error,
                result=outcomes[use.tool_use_id].result,
            )
            for use in result.tool_uses
        ]
        query.tool_calls.extend(calls)
        yield StepCompleted(
            turn=query.turn,
            step_number=query.step,
            text=result.text,
            tool_calls=calls,
            observations=[call.result or "" for call in calls],
            usage=result.usage,
        )

    def _cut_short(self, window: Window, turn: Turn) -> Usage:
        """The usage of a model turn cancelled before its end, as Bedrock bills one: the whole
        request's input and the output generated so far. The model reports usage only at a
        stream's end, so both are estimated at the rate the context window has learned."""
        if turn.result is not None:
            return turn.result.usage  # the model had reported it: no estimate needed
        output = math.ceil(sum(map(len, turn.seen)) * self.context.tokens_per_char)
        return Usage(
            input_tokens=window.estimated_tokens,
            output_tokens=output,
            total_tokens=window.estimated_tokens + output,
        )

    def retry_delay(self, attempt: int) -> float:
        """Exponential backoff from ``backoff_s``, capped at ``backoff_max_s``, with full jitter
        in its upper half (so retries of many runs do not land together)."""
        ceiling = min(self.backoff_max_s, self.backoff_s * (2**attempt))
        return ceiling * (0.5 + random.random() / 2)

    async def _stream_turn(
        self,
        provider: ModelProvider,
        request: ModelRequest,
        turn: int,
        into: Turn,
        *,
        emit: bool = True,
        sink: Sink | None = None,
    ) -> AsyncIterator[Event]:
        """Stream one model turn, yielding its events (the text deltas ``sink`` takes excepted);
        the result or the error lands in ``into``."""
        hand_down = emit and sink is not None
        span = spans.start_chat(self.tracer, provider, request)
        request = spans.carry(span, request)
        started, first_at = spans.now(), 0.0
        stopped: BaseException | None = None
        try:
            for attempt in range(self.throttle_retries + 1):
                seen: list[str] = []
                into.seen = seen
                emitted = False

                def take(event: Event, seen: list[str] = seen) -> bool:
                    nonlocal emitted, first_at
                    if sink is None or not sink(event):
                        return False
                    if not emitted:
                        first_at = spans.now()
                    emitted = True
                    seen.append(event.text)  # type: ignore[attr-defined]  # providers offer text deltas only
                    return True

                extra: dict[str, Any] = {"sink": take} if hand_down else {}
                try:
                    async with aclosing(provider.stream(request, turn, **extra)) as stream:
                        async for item in stream:
                            if isinstance(item, TurnResult):
                                into.result = item
                            elif emit:
                                if not emitted:
                                    first_at = spans.now()
                                emitted = True
                                if isinstance(item, TextDelta):
                                    into.seen.append(item.text)
                                yield item
                    return
                except ModelStreamError as error:
                    # The provider retried what failed before the stream; an error inside it
                    # (throttling, modelStreamError, internalServer, serviceUnavailable) is retried
                    # here, and only while the client has seen none of the turn: a replayed
                    # half-answer would show twice. Validation and access errors are not
                    # retryable and end the turn at once.
                    if not error.retryable or emitted or attempt == self.throttle_retries:
                        into.error = error
                        return
                    delay = self.retry_delay(attempt)
                    spans.retried(span, error, attempt, delay)
                    await asyncio.sleep(delay)
                except ProviderError as error:
                    into.error = error
                    return
        except BaseException as exc:
            stopped = exc
            raise
        finally:
            spans.end_chat(span, into, started, first_at, stopped)
            self.turn_observer(calls.model_call(provider, request, into, spans.now() - started, stopped))

    async def _decide(
        self, uses: list[PendingToolUse], turn: int, approve: Approver | None
    ) -> dict[str, Decision]:
        """Ask a person about the uses that need it; the turn goes on once all are answered."""
        asking = [use for use in uses if not use.input_error and self.needs_approval(use.tool)]
        if not asking:
            return {}
        if approve is None:
            return {use.tool_use_id: Decision(approved=False, by=NO_APPROVER) for use in asking}
        return await approve(
            [
                ToolUse(tool=use.tool, tool_use_id=use.tool_use_id, input=use.input, turn=turn)
                for use in asking
            ]
        )

    async def _run_tools(
        self,
        result: TurnResult,
        turn: int,
        outcomes: dict[str, ToolOutcome],
        approve: Approver | None,
        client: frozenset[str] = frozenset(),
    ) -> AsyncIterator[Event]:
        """Run the turn's tool uses concurrently (those needing approval once it is given), the
        calls of ``client`` tools aside; results are told as they come."""
        uses = [use for use in result.tool_uses if use.tool not in client]
        decisions = await self._decide(uses, turn, approve)
        runnable = []
        for use in uses:
            decision = decisions.get(use.tool_use_id)
            if decision is not None and not decision.approved:
                outcomes[use.tool_use_id] = _unrun(use, _declined(decision))
                yield _result_event(outcomes[use.tool_use_id], turn)
                continue
            if decision is not None and decision.input is not None:
                use = PendingToolUse(use.tool, use.tool_use_id, decision.input)
                _edit_input(result.message, use)
            yield ToolExecuting(tool=use.tool, tool_use_id=use.tool_use_id, turn=turn)
            if use.input_error:
                outcomes[use.tool_use_id] = _unrun(use, use.input_error)
                yield _result_event(outcomes[use.tool_use_id], turn)
            else:
                runnable.append((use.tool, use.tool_use_id, use.input))
        if runnable:
            # One span per call, siblings under the query's: started together, as the calls run.
            running = {
                call_id: spans.start_tool(self.tracer, tool, call_id, input)
                for tool, call_id, input in runnable
            }
            contexts = {call_id: spans.context_of(span) for call_id, span in running.items()}
            try:
                async with aclosing(self.tools.run_all(runnable, contexts)) as results:
                    async for outcome in results:
                        spans.end_tool(running.pop(outcome.tool_use_id, None), outcome)
                        outcomes[outcome.tool_use_id] = outcome
                        yield _result_event(outcome, turn)
            finally:
                for span in running.values():
                    spans.abandon(span)

    async def _client_tools(
        self,
        result: TurnResult,
        turn: int,
        outcomes: dict[str, ToolOutcome],
        client: frozenset[str],
        hand_over: HandOver,
    ) -> AsyncIterator[Event]:
        """Hand the turn's calls of the client's tools to the client and wait for their results
        (a call whose input the model botched gets its error at once)."""
        handed = []
        for use in result.tool_uses:
            if use.tool not in client:
                continue
            if use.input_error:
                outcomes[use.tool_use_id] = _unrun(use, use.input_error)
                yield _result_event(outcomes[use.tool_use_id], turn)
            else:
                handed.append(ToolUse(tool=use.tool, tool_use_id=use.tool_use_id, input=use.input, turn=turn))
        if not handed:
            return
        answers = await hand_over(handed)
        for use in handed:
            answer = answers[use.tool_use_id]
            if answer.error is not None:
                text, is_error = answer.error or "the tool failed", True
            else:
                text, is_error = _output_text(answer.output), False
            outcomes[use.tool_use_id] = _unrun(use, text, is_error=is_error)
            yield _result_event(outcomes[use.tool_use_id], turn)


def _unrun(use: PendingToolUse | ToolUse, result: str, *, is_error: bool = True) -> ToolOutcome:
    """The outcome of a call the service did not run itself: declined, botched by the model, or
    answered by the client."""
    return ToolOutcome(
        tool=use.tool,
        tool_use_id=use.tool_use_id,
        input=use.input,
        result=result,
        is_error=is_error,
        duration_ms=0.0,
    )


def _output_text(output: Any) -> str:
    """A client tool's output as the model is told it: a string as it is, anything else as JSON."""
    if isinstance(output, str):
        return output
    return json.dumps(output, ensure_ascii=False, separators=(",", ":"))


def _declined(decision: Decision) -> str:
    if decision.by == NO_APPROVER:
        return (
            "This tool needs a person's approval before it runs, and no one can give it where this "
            "query was asked, so it did not run. Answer without it."
        )
    reason = decision.reason.strip() or "no reason given"
    return f"The user declined this tool call, so it did not run (reason: {reason})."


def _edit_input(message: dict[str, Any], use: PendingToolUse) -> None:
    """Record an approver's edited input in the assistant's toolUse block, so the conversation
    holds the call that really ran."""
    for block in message.get("content", []):
        tool_use = block.get("toolUse") if isinstance(block, dict) else None
        if isinstance(tool_use, dict) and tool_use.get("toolUseId") == use.tool_use_id:
            tool_use["input"] = use.input


def _result_event(outcome: ToolOutcome, turn: int) -> ToolResult:
    return ToolResult(
        tool=outcome.tool,
        tool_use_id=outcome.tool_use_id,
        result=outcome.result,
        is_error=outcome.is_error,
        turn=turn,
    )


def _tool_result_block(outcome: ToolOutcome) -> dict[str, Any]:
    block: dict[str, Any] = {
        "toolUseId": outcome.tool_use_id,
        "content": [{"text": outcome.result}],
    }
    if outcome.is_error:
        block["status"] = "error"
    return {"toolResult": block}
