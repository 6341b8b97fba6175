"""The scripted model: decides what the emulator answers, independently of any wire format.

:func:`plan_response` takes a ConverseStream request body (``messages``, optional ``system``,
``toolConfig``, ``inferenceConfig``) and returns a :class:`~service.emulator.steps.Plan`: either
an HTTP error to give before any stream, or an ordered list of abstract steps (message start,
block start, deltas, block stop, message stop, usage, injected exception). A wire writer renders
the steps; the Bedrock event-stream writer lives in :mod:`service.emulator.bedrock`, and other
dialects can be written over the same plans.

Behaviour is steered by directives written in the user's prompt as ``[emu:NAME]`` or
``[emu:NAME=VALUE]`` (see :mod:`service.emulator.directives`). They are read from the latest user
message that carries text (in a one-query conversation that is the first user message), so they
keep applying to every turn of that query, including the follow-ups that carry tool results.
The words said come from :mod:`service.emulator.answers`; which questions call the calculator,
from :mod:`service.emulator.arithmetic`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from service.emulator.answers import (
    answer_words,
    plan_text,
    reasoning_deltas,
    said_deltas,
    tool_result_answer,
    wants_plan,
    word_deltas,
)
from service.emulator.arithmetic import extract_expression
from service.emulator.directives import (
    DEFAULT_FAIL_AFTER,
    error_message,
    exception_name,
    float_value,
    http_error_for,
    int_value,
    json_object_value,
    parse_directives,
    said_text,
    strip_directives,
)
from service.emulator.request import content_blocks, count_input_tokens, tool_names, tool_results, user_prompt
from service.emulator.steps import (
    EmitReasoning,
    EmitSignature,
    EmitText,
    EmitToolInput,
    HttpError,
    Plan,
    RaiseException,
    ReportUsage,
    StartMessage,
    StartToolUse,
    Step,
    StopBlock,
    StopMessage,
    is_token,
)

DEFAULT_ANSWER_TOKENS = 12
MAX_TOKENS_DIRECTIVE_DELTAS = 5
CALCULATOR = "calculator"
STALL_FOREVER_MS = 3_600_000.0


def _tool_use_id(question: str, conversation_length: int, index: int) -> str:
    digest = hashlib.sha256(f"{question}|{conversation_length}|{index}".encode()).hexdigest()
    return f"tooluse_{digest[:22]}"


def _split_fragments(text: str, parts: int = 3) -> list[str]:
    cuts = [len(text) * k // parts for k in range(parts + 1)]
    return [text[a:b] for a, b in zip(cuts, cuts[1:], strict=False) if b > a]


@dataclass(frozen=True, slots=True)
class _ToolCall:
    name: str
    input: dict[str, Any]


class _Builder:
    """Accumulates the content blocks of one response."""

    def __init__(self, question: str, conversation_length: int) -> None:
        self.question = question
        self.conversation_length = conversation_length
        self.steps: list[Step] = [StartMessage()]
        self.index = 0

    def reasoning(self) -> None:
        index = self._next_index()
        self.steps.extend(EmitReasoning(index, d) for d in reasoning_deltas())
        digest = hashlib.sha256(f"reasoning|{self.question}|{self.conversation_length}".encode())
        self.steps.append(EmitSignature(index, f"sig_{digest.hexdigest()[:32]}"))
        self.steps.append(StopBlock(index))

    def text(self, deltas: list[str]) -> None:
        if not deltas:
            return
        index = self._next_index()
        self.steps.extend(EmitText(index, d) for d in deltas)
        self.steps.append(StopBlock(index))

    def tool_use(self, call: _ToolCall) -> None:
        index = self._next_index()
        tool_use_id = _tool_use_id(self.question, self.conversation_length, index)
        self.steps.append(StartToolUse(index, tool_use_id, call.name))
        for fragment in _split_fragments(json.dumps(call.input)):
            self.steps.append(EmitToolInput(index, fragment))
        self.steps.append(StopBlock(index))

    def _next_index(self) -> int:
        index = self.index
        self.index += 1
        return index


def _inject_failure(steps: list[Step], exception_type: str, after: int) -> list[Step]:
    """Cut ``steps`` after ``after`` output tokens (or before the stop) and raise there."""
    out: list[Step] = []
    count = 0
    for step in steps:
        if isinstance(step, (StopMessage, ReportUsage)):
            break
        out.append(step)
        if is_token(step):
            count += 1
        if count >= after and (after > 0 or isinstance(step, StartMessage)):
            break
    out.append(RaiseException(exception_type, error_message(exception_type)))
    return out


def _invalid(message: str) -> Plan:
    return Plan(http_error=HttpError(400, "ValidationException", message))


# Bedrock's words when a request is longer than the model's context window.
INPUT_TOO_LONG = "Input is too long for requested model."


def plan_response(
    body: Any, *, default_tokens: int = DEFAULT_ANSWER_TOKENS, attempt: int = 1, context_tokens: int = 0
) -> Plan:
    """Decide the whole response to one ConverseStream request body.

    With ``context_tokens``, a request of more input tokens than that is refused as Bedrock
    refuses one past the model's window (a ValidationException). ``attempt`` counts identical requests (a client retrying): with ``[emu:fail_times=N]`` the
    directive's failure (``http``, ``fail``, ``throttle``, ``stall``) applies to the first N
    attempts only, and later ones are answered normally.
    """
    if not isinstance(body, dict):
        return _invalid("The request body must be a JSON object.")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return _invalid("The request must hold a non-empty 'messages' list.")

    if context_tokens and count_input_tokens(body) > context_tokens:
        return _invalid(INPUT_TOO_LONG)
    prompt = user_prompt(messages)
    directives = parse_directives(prompt)
    question = strip_directives(prompt)
    ttft_ms = float_value(directives, "ttft")
    tps = float_value(directives, "tps")

    fail_times = int_value(directives, "fail_times", None)
    failing = fail_times is None or attempt <= fail_times
    http_error = http_error_for(directives) if failing else None
    if http_error is not None:
        return Plan(http_error=http_error, user_text=prompt, ttft_ms=ttft_ms, tokens_per_second=tps)

    builder = _Builder(question, len(messages))
    if "reasoning" in directives:
        builder.reasoning()

    calls, deltas = _decide(body, messages, directives, question, default_tokens)
    stop_reason = "end_turn"
    if calls:
        for call in calls:
            builder.tool_use(call)
        stop_reason = "tool_use"
    else:
        limit: int | None = None
        if "max_tokens" in directives:
            limit = MAX_TOKENS_DIRECTIVE_DELTAS
        max_tokens = (body.get("inferenceConfig") or {}).get("maxTokens")
        if isinstance(max_tokens, int) and max_tokens >= 0:
            limit = max_tokens if limit is None else min(limit, max_tokens)
        if "max_tokens" in directives or (limit is not None and len(deltas) > limit):
            deltas = deltas[:limit]
            stop_reason = "max_tokens"
        elif directives.get("stop"):
            stop_reason = directives["stop"]
        builder.text(deltas)

    steps = builder.steps
    steps.append(StopMessage(stop_reason))
    steps.append(ReportUsage(count_input_tokens(body), sum(1 for s in steps if is_token(s))))

    fail = "throttlingException" if "throttle" in directives else None
    if directives.get("fail"):
        fail = exception_name(directives["fail"])
    if fail is not None and failing:
        after = int_value(directives, "fail_after", DEFAULT_FAIL_AFTER)
        steps = _inject_failure(steps, fail, max(0, after or 0))

    stall_after: int | None = None
    stall_ms = 0.0
    if failing and ("stall" in directives or "stall_ms" in directives):
        stall_after = max(0, int_value(directives, "stall_after", DEFAULT_FAIL_AFTER) or 0)
        stall_ms = float_value(directives, "stall_ms") or STALL_FOREVER_MS

    return Plan(
        steps=tuple(steps),
        user_text=prompt,
        ttft_ms=ttft_ms,
        tokens_per_second=tps,
        stall_after_tokens=stall_after,
        stall_ms=stall_ms,
    )


def _decide(
    body: dict[str, Any],
    messages: list[Any],
    directives: dict[str, str],
    question: str,
    default_tokens: int,
) -> tuple[list[_ToolCall], list[str]]:
    """The decision table: tool calls to make, or else the text deltas of an answer."""
    if wants_plan(body):
        return [], word_deltas(plan_text(question).split())
    last = messages[-1]
    from_user = isinstance(last, dict) and last.get("role") == "user"
    results = tool_results(content_blocks(last)) if from_user else []
    if results:
        if "loop" in directives:
            return [_ToolCall(CALCULATOR, {"expression": "1+1"})], []
        return [], word_deltas(tool_result_answer(results, question).split())
    if directives.get("tool"):
        # One call per comma-separated name, each with the ``tool_input`` directive's JSON object.
        names = [name.strip() for name in directives["tool"].split(",") if name.strip()]
        return [_ToolCall(name, json_object_value(directives, "tool_input")) for name in names], []
    tools_count = int_value(directives, "tools", None)
    if tools_count is not None and tools_count >= 1:
        return [_ToolCall(CALCULATOR, {"expression": f"{k}+{k}"}) for k in range(1, tools_count + 1)], []
    if "loop" in directives:
        return [_ToolCall(CALCULATOR, {"expression": "1+1"})], []
    said = said_text(directives)
    if said is not None:  # a dictated answer, even to an arithmetic question
        return [], said_deltas(said)
    expression = extract_expression(question)
    if expression is not None and CALCULATOR in tool_names(body):
        return [_ToolCall(CALCULATOR, {"expression": expression})], []
    count = int_value(directives, "tokens", default_tokens)
    return [], word_deltas(answer_words(question, max(0, count if count is not None else default_tokens)))
