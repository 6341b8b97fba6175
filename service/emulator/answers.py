"""The words the scripted model says: answers, plans, reasoning, and replies to tool results.

All of it is deterministic, so a run can be repeated word for word.
"""

from __future__ import annotations

import re
from typing import Any

from service.emulator.arithmetic import extract_expression, square_root_operand
from service.emulator.request import tool_result_text

# A system prompt holding this asks for a plan (the agent's planning step).
PLANNING_MARKER = "numbered plan"

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


def word_deltas(words: list[str]) -> list[str]:
    """Text deltas for ``words``: each after the first carries its leading space."""
    return [word if i == 0 else f" {word}" for i, word in enumerate(words)]


def said_deltas(text: str) -> list[str]:
    """``text`` as deltas of one word each with the white space after it (newlines kept), so the
    deltas join to exactly ``text``."""
    return re.findall(r"^\s+|\S+\s*", text)


def reasoning_deltas() -> list[str]:
    """The reasoning text, as deltas."""
    return word_deltas(list(_REASONING_WORDS))


def wants_plan(body: dict[str, Any]) -> bool:
    """A request whose system prompt asks for a plan (the agent's planning step)."""
    system = body.get("system")
    blocks = system if isinstance(system, list) else []
    return any(isinstance(b, dict) and PLANNING_MARKER in str(b.get("text", "")).lower() for b in blocks)


def plan_text(question: str) -> str:
    """The plan given for ``question``: the calculator's for arithmetic, a plain one otherwise."""
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


def tool_result_answer(results: list[dict[str, Any]], question: str) -> str:
    """The answer that reports tool results (and failures) back to the user."""
    ok = [tool_result_text(r).rstrip(".") for r in results if r.get("status") != "error"]
    failed = [tool_result_text(r).rstrip(".") for r in results if r.get("status") == "error"]
    sentences: list[str] = []
    if len(ok) == 1:
        operand = square_root_operand(question)
        if operand is not None:
            sentences.append(f"The square root of {operand} is {ok[0]}.")
        else:
            sentences.append(f"The result is {ok[0]}.")
    elif ok:
        sentences.append(f"The results are {', '.join(ok[:-1])} and {ok[-1]}.")
    sentences.extend(f"The tool failed: {text}." for text in failed)
    return " ".join(sentences) or "The tool returned nothing."
