"""The scripted model: decides what the emulator answers, independently of any wire format.

:func:`plan_response` takes a ConverseStream request body (``messages``, optional ``system``,
``toolConfig``, ``inferenceConfig``) and returns a :class:`Plan`: either an HTTP error to give
before any stream, or an ordered list of abstract steps (message start, block start, deltas,
block stop, message stop, usage, injected exception). A wire writer renders the steps; the
Bedrock event-stream writer lives in :mod:`service.emulator.bedrock`, and other dialects can be
written over the same plans.

Behaviour is steered by directives written in the user's prompt as ``[emu:NAME]`` or
``[emu:NAME=VALUE]``. They are read from the latest user message that carries text (in a
one-query conversation that is the first user message), so they keep applying to every turn
of that query, including the follow-ups that carry tool results.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, Union

DEFAULT_ANSWER_TOKENS = 12
DEFAULT_FAIL_AFTER = 3
MAX_TOKENS_DIRECTIVE_DELTAS = 5
# A flat charge per tool spec stands in for the tokens its JSON schema would cost.
TOKENS_PER_TOOL_SPEC = 50
CALCULATOR = "calculator"

_DIRECTIVE_RE = re.compile(r"\[emu:([A-Za-z_][A-Za-z0-9_]*)(?:=([^\]]*))?\]")
_SQRT_RE = re.compile(r"square\s+root\s+of\s+(-?\d+(?:\.\d+)?)", re.IGNORECASE)
_FACTORIAL_RE = re.compile(r"factorial\s+of\s+(\d+)|(\d+)\s*factorial\b", re.IGNORECASE)
_ARITH_RUN_RE = re.compile(r"[0-9 .+\-*/()%^]+")
# An operator with an operand on each side; the right operand may open with a sign or paren.
_BINARY_OP_RE = re.compile(r"[0-9.)]\s*(?:\*\*|[+\-*/%^])\s*[-+(]*\s*[0-9.(]")

_ANSWER_PREFIX = ("Here", "is", "an", "answer", "to:")
_FILLER = (
    "the",
    "emulator",
    "answers",
    "with",
    "a",
    "steady",
    "stream",
    "of",
    "plain",
    "words",
    "so",
    "that",
    "every",
    "run",
    "is",
    "repeatable.",
)
_REASONING_WORDS = ("Let", "me", "think", "this", "through", "step", "by", "step.")

_HTTP_ERROR_TYPES: dict[int, str] = {
    400: "ValidationException",
    403: "AccessDeniedException",
    404: "ResourceNotFoundException",
    408: "ModelTimeoutException",
    424: "ModelErrorException",
    429: "ThrottlingException",
    500: "InternalServerException",
    503: "ServiceUnavailableException",
}
_ERROR_MESSAGES: dict[str, str] = {
    "throttling": "Too many requests, please wait before trying again.",
    "internalserver": "The server encountered an internal error.",
    "serviceunavailable": "The service is temporarily unavailable.",
    "validation": "The request is not valid.",
    "modelstreamerror": "The model stream failed.",
}


# --- plan steps ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StartMessage:
    """The assistant message begins."""

    role: str = "assistant"


@dataclass(frozen=True, slots=True)
class StartToolUse:
    """A tool-use block begins (text and reasoning blocks have no start step)."""

    index: int
    tool_use_id: str
    name: str


@dataclass(frozen=True, slots=True)
class EmitText:
    """One token of answer text."""

    index: int
    text: str


@dataclass(frozen=True, slots=True)
class EmitReasoning:
    """One token of reasoning text."""

    index: int
    text: str


@dataclass(frozen=True, slots=True)
class EmitSignature:
    """The signature that closes a reasoning block's content."""

    index: int
    signature: str


@dataclass(frozen=True, slots=True)
class EmitToolInput:
    """A fragment of a tool use's JSON input."""

    index: int
    fragment: str


@dataclass(frozen=True, slots=True)
class StopBlock:
    """A content block ends."""

    index: int


@dataclass(frozen=True, slots=True)
class StopMessage:
    """The assistant message ends with this stop reason."""

    stop_reason: str


@dataclass(frozen=True, slots=True)
class ReportUsage:
    """Token usage of the response (latency is measured by the writer)."""

    input_tokens: int
    output_tokens: int


@dataclass(frozen=True, slots=True)
class RaiseException:
    """An exception inside the stream; nothing follows it."""

    exception_type: str
    message: str


Step = Union[
    StartMessage,
    StartToolUse,
    EmitText,
    EmitReasoning,
    EmitSignature,
    EmitToolInput,
    StopBlock,
    StopMessage,
    ReportUsage,
    RaiseException,
]

# The steps that count as output tokens: these are paced and counted in usage.
TOKEN_STEPS: tuple[type, ...] = (EmitText, EmitReasoning, EmitToolInput)


def is_token(step: Step) -> bool:
    """True for a step that is an output token (paced, counted in usage)."""
    return isinstance(step, TOKEN_STEPS)


@dataclass(frozen=True, slots=True)
class HttpError:
    """An error answered with an HTTP status before any stream starts."""

    status: int
    error_type: str
    message: str


@dataclass(frozen=True, slots=True)
class Plan:
    """What to answer to one request: an HTTP error, or steps to stream."""

    steps: tuple[Step, ...] = ()
    http_error: HttpError | None = None
    user_text: str = ""
    ttft_ms: float | None = None
    tokens_per_second: float | None = None
    # ``[emu:stall]``: after this many output tokens the stream goes quiet for ``stall_ms``.
    stall_after_tokens: int | None = None
    stall_ms: float = 0.0

    @property
    def token_count(self) -> int:
        """How many output-token steps the plan holds."""
        return sum(1 for step in self.steps if is_token(step))

    @property
    def stop_reason(self) -> str | None:
        """The stop reason the plan ends with, if it gets that far."""
        for step in self.steps:
            if isinstance(step, StopMessage):
                return step.stop_reason
        return None


# --- reading the request -----------------------------------------------------------------------


def parse_directives(text: str) -> dict[str, str]:
    """Directives in ``text`` as name -> value (``""`` when valueless); later ones win."""
    return {m.group(1).lower(): (m.group(2) or "").strip() for m in _DIRECTIVE_RE.finditer(text)}


def strip_directives(text: str) -> str:
    """``text`` without its directives, whitespace collapsed."""
    return " ".join(_DIRECTIVE_RE.sub(" ", text).split())


def _blocks(message: Any) -> list[dict[str, Any]]:
    if not isinstance(message, dict):
        return []
    content = message.get("content")
    if isinstance(content, str):
        # Tolerated for hand-written requests; the real API always sends a list of blocks.
        return [{"text": content}]
    if not isinstance(content, list):
        return []
    return [block for block in content if isinstance(block, dict)]


def _text_of(blocks: list[dict[str, Any]]) -> str:
    return " ".join(b["text"] for b in blocks if isinstance(b.get("text"), str))


def _tool_results(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [b["toolResult"] for b in blocks if isinstance(b.get("toolResult"), dict)]


def _tool_result_text(result: dict[str, Any]) -> str:
    parts: list[str] = []
    for item in result.get("content") or []:
        if not isinstance(item, dict):
            continue
        if isinstance(item.get("text"), str):
            parts.append(item["text"])
        elif "json" in item:
            parts.append(json.dumps(item["json"], separators=(",", ":")))
    return " ".join(parts).strip()


def user_prompt(messages: list[Any]) -> str:
    """Text of the latest user message that carries text (the prompt of the current query)."""
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            text = _text_of(_blocks(message))
            if text.strip():
                return text
    return ""


def count_input_tokens(body: dict[str, Any]) -> int:
    """A deterministic input-token count: words in every text, plus a flat cost per tool spec."""
    words = 0
    for block in body.get("system") or []:
        if isinstance(block, dict) and isinstance(block.get("text"), str):
            words += len(block["text"].split())
    for message in body.get("messages") or []:
        for block in _blocks(message):
            if isinstance(block.get("text"), str):
                words += len(block["text"].split())
            elif isinstance(block.get("toolResult"), dict):
                words += len(_tool_result_text(block["toolResult"]).split())
            elif isinstance(block.get("toolUse"), dict):
                words += len(json.dumps(block["toolUse"].get("input", {})).split())
    tools = ((body.get("toolConfig") or {}).get("tools")) or []
    return words + TOKENS_PER_TOOL_SPEC * len(tools)


def _tool_names(body: dict[str, Any]) -> set[str]:
    names: set[str] = set()
    for tool in ((body.get("toolConfig") or {}).get("tools")) or []:
        spec = tool.get("toolSpec") if isinstance(tool, dict) else None
        if isinstance(spec, dict) and isinstance(spec.get("name"), str):
            names.add(spec["name"])
    return names


def extract_expression(question: str) -> str | None:
    """The calculator expression a question asks for, or None if it is not arithmetic."""
    match = _SQRT_RE.search(question)
    if match:
        return f"sqrt({match.group(1)})"
    match = _FACTORIAL_RE.search(question)
    if match:
        return f"factorial({match.group(1) or match.group(2)})"
    best: str | None = None
    for run in _ARITH_RUN_RE.findall(question):
        candidate = _tidy_expression(run)
        if not _BINARY_OP_RE.search(candidate):
            continue
        if best is None or len(candidate) > len(best):
            best = candidate
    return best.replace("^", "**") if best is not None else None


def _tidy_expression(run: str) -> str:
    # A run can swallow a sentence's full stop or a bracket that belongs to the prose.
    text = run.strip().rstrip(".").strip()
    while text.endswith(")") and text.count(")") > text.count("("):
        text = text[:-1].rstrip()
    while text.startswith("(") and text.count("(") > text.count(")"):
        text = text[1:].lstrip()
    return text


# --- directive values --------------------------------------------------------------------------


def _int_value(directives: dict[str, str], name: str, default: int | None) -> int | None:
    # A malformed value is ignored rather than rejected, so a typo degrades to the default.
    try:
        return int(directives[name])
    except (KeyError, ValueError):
        return default


def _float_value(directives: dict[str, str], name: str) -> float | None:
    try:
        value = float(directives[name])
    except (KeyError, ValueError):
        return None
    return value if value >= 0 else None


def _exception_type(name: str) -> str:
    # botocore names stream exceptions in camelCase; accept the PascalCase spelling too.
    return name[:1].lower() + name[1:] if name else "internalServerException"


def _error_message(error_type: str) -> str:
    key = error_type.lower().removesuffix("exception")
    return _ERROR_MESSAGES.get(key, f"Emulated {error_type}.")


def _http_error(directives: dict[str, str]) -> HttpError | None:
    status = _int_value(directives, "http", None)
    if status is None or not 400 <= status <= 599:
        return None
    error_type = _HTTP_ERROR_TYPES.get(
        status, "InternalServerException" if status >= 500 else "ValidationException"
    )
    return HttpError(status, error_type, _error_message(error_type))


# --- building the answer -----------------------------------------------------------------------


def _tool_use_id(question: str, conversation_length: int, index: int) -> str:
    digest = hashlib.sha256(f"{question}|{conversation_length}|{index}".encode()).hexdigest()
    return f"tooluse_{digest[:22]}"


def _split_fragments(text: str, parts: int = 3) -> list[str]:
    cuts = [len(text) * k // parts for k in range(parts + 1)]
    return [text[a:b] for a, b in zip(cuts, cuts[1:], strict=False) if b > a]


def _word_deltas(words: list[str]) -> list[str]:
    return [word if i == 0 else f" {word}" for i, word in enumerate(words)]


PLANNING_MARKER = "numbered plan"


def _wants_plan(body: dict[str, Any]) -> bool:
    """A request whose system prompt asks for a plan (the agent's planning step)."""
    system = body.get("system")
    blocks = system if isinstance(system, list) else []
    return any(isinstance(b, dict) and PLANNING_MARKER in str(b.get("text", "")).lower() for b in blocks)


def _plan_for(question: str) -> str:
    if extract_expression(question) is not None:
        return "1. Work out the arithmetic with the calculator. 2. Give the result in one sentence."
    return "1. Read the question. 2. Answer it plainly."


def answer_words(question: str, count: int) -> list[str]:
    """Exactly ``count`` deterministic words answering ``question``."""
    words = [*_ANSWER_PREFIX, *question.split()][:count]
    filler = 0
    while len(words) < count:
        words.append(_FILLER[filler % len(_FILLER)])
        filler += 1
    return words


def _tool_result_answer(results: list[dict[str, Any]], question: str) -> str:
    ok = [_tool_result_text(r).rstrip(".") for r in results if r.get("status") != "error"]
    failed = [_tool_result_text(r).rstrip(".") for r in results if r.get("status") == "error"]
    sentences: list[str] = []
    if len(ok) == 1:
        sqrt = _SQRT_RE.search(question)
        if sqrt:
            sentences.append(f"The square root of {sqrt.group(1)} is {ok[0]}.")
        else:
            sentences.append(f"The result is {ok[0]}.")
    elif ok:
        sentences.append(f"The results are {', '.join(ok[:-1])} and {ok[-1]}.")
    sentences.extend(f"The tool failed: {text}." for text in failed)
    return " ".join(sentences) or "The tool returned nothing."


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
        self.steps.extend(EmitReasoning(index, d) for d in _word_deltas(list(_REASONING_WORDS)))
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
    out.append(RaiseException(exception_type, _error_message(exception_type)))
    return out


def _invalid(message: str) -> Plan:
    return Plan(http_error=HttpError(400, "ValidationException", message))


STALL_FOREVER_MS = 3_600_000.0


def plan_response(body: Any, *, default_tokens: int = DEFAULT_ANSWER_TOKENS, attempt: int = 1) -> Plan:
    """Decide the whole response to one ConverseStream request body.

    ``attempt`` counts identical requests (a client retrying): with ``[emu:fail_times=N]`` the
    directive's failure (``http``, ``fail``, ``throttle``, ``stall``) applies to the first N
    attempts only, and later ones are answered normally.
    """
    if not isinstance(body, dict):
        return _invalid("The request body must be a JSON object.")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return _invalid("The request must hold a non-empty 'messages' list.")

    prompt = user_prompt(messages)
    directives = parse_directives(prompt)
    question = strip_directives(prompt)
    ttft_ms = _float_value(directives, "ttft")
    tps = _float_value(directives, "tps")

    fail_times = _int_value(directives, "fail_times", None)
    failing = fail_times is None or attempt <= fail_times
    http_error = _http_error(directives) if failing else None
    if http_error is not None:
        return Plan(http_error=http_error, user_text=prompt, ttft_ms=ttft_ms, tokens_per_second=tps)

    builder = _Builder(question, len(messages))
    if "reasoning" in directives:
        builder.reasoning()

    calls, text = _decide(body, messages, directives, question, default_tokens)
    stop_reason = "end_turn"
    if calls:
        for call in calls:
            builder.tool_use(call)
        stop_reason = "tool_use"
    else:
        deltas = _word_deltas(text)
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
        fail = _exception_type(directives["fail"])
    if fail is not None and failing:
        after = _int_value(directives, "fail_after", DEFAULT_FAIL_AFTER)
        steps = _inject_failure(steps, fail, max(0, after or 0))

    stall_after: int | None = None
    stall_ms = 0.0
    if failing and ("stall" in directives or "stall_ms" in directives):
        stall_after = max(0, _int_value(directives, "stall_after", DEFAULT_FAIL_AFTER) or 0)
        stall_ms = _float_value(directives, "stall_ms") or STALL_FOREVER_MS

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
    """The decision table: tool calls to make, or else the words of a text answer."""
    if _wants_plan(body):
        return [], _plan_for(question).split()
    last = messages[-1]
    results = _tool_results(_blocks(last)) if isinstance(last, dict) and last.get("role") == "user" else []
    if results:
        if "loop" in directives:
            return [_ToolCall(CALCULATOR, {"expression": "1+1"})], []
        return [], _tool_result_answer(results, question).split()
    if directives.get("tool"):
        return [_ToolCall(directives["tool"], {})], []
    tools_count = _int_value(directives, "tools", None)
    if tools_count is not None and tools_count >= 1:
        return [_ToolCall(CALCULATOR, {"expression": f"{k}+{k}"}) for k in range(1, tools_count + 1)], []
    if "loop" in directives:
        return [_ToolCall(CALCULATOR, {"expression": "1+1"})], []
    expression = extract_expression(question)
    if expression is not None and CALCULATOR in _tool_names(body):
        return [_ToolCall(CALCULATOR, {"expression": expression})], []
    count = _int_value(directives, "tokens", default_tokens)
    return [], answer_words(question, max(0, count if count is not None else default_tokens))
