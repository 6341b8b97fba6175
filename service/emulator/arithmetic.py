"""Recognising an arithmetic question and the calculator expression it asks for."""

from __future__ import annotations

import re

_SQRT_RE = re.compile(r"square\s+root\s+of\s+(-?\d+(?:\.\d+)?)", re.IGNORECASE)
_FACTORIAL_RE = re.compile(r"factorial\s+of\s+(\d+)|(\d+)\s*factorial\b", re.IGNORECASE)
_ARITH_RUN_RE = re.compile(r"[0-9 .+\-*/()%^]+")
# An operator with an operand on each side; the right operand may open with a sign or paren.
_BINARY_OP_RE = re.compile(r"[0-9.)]\s*(?:\*\*|[+\-*/%^])\s*[-+(]*\s*[0-9.(]")


def square_root_operand(question: str) -> str | None:
    """The number whose square root ``question`` asks for, as written, or None."""
    match = _SQRT_RE.search(question)
    return match.group(1) if match else None


def extract_expression(question: str) -> str | None:
    """The calculator expression a question asks for, or None if it is not arithmetic."""
    operand = square_root_operand(question)
    if operand is not None:
        return f"sqrt({operand})"
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
