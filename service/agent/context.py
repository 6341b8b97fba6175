"""The model's window on a long conversation: the newest whole turns that fit its input budget.

The session keeps every message; what is sent is cut at a turn's start (a user message with
text, never one that carries tool results), so a tool call always goes with its result and the
conversation still begins with the user. Sizes are estimated from the characters of each
message's JSON, at a rate of tokens per character that the model's own reports correct: after
each turn, the input tokens it counted for the request over the characters that were sent.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# Before the model has reported anything: about four characters per token (English text and
# JSON on Claude's tokenizer), a little on the safe side.
DEFAULT_TOKENS_PER_CHAR = 0.3


@dataclass(frozen=True)
class Window:
    """What to send: the messages from index ``dropped`` on; their estimated size, and the
    characters sent (for :meth:`ContextWindow.learn`)."""

    dropped: int
    estimated_tokens: int
    chars: int


def _chars(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str))


def starts_turn(message: dict[str, Any]) -> bool:
    """True for a user message that a person wrote (not one carrying tool results)."""
    if message.get("role") != "user":
        return False
    content = message.get("content") or []
    return not any(isinstance(block, dict) and "toolResult" in block for block in content)


class ContextWindow:
    """Chooses the window for each request; ``max_tokens`` 0 sends the whole conversation."""

    def __init__(self, max_tokens: int = 0) -> None:
        self.max_tokens = max_tokens
        self.tokens_per_char = DEFAULT_TOKENS_PER_CHAR

    def fit(self, messages: Sequence[dict[str, Any]], system: str, tool_specs: Sequence[Any]) -> Window:
        """The window of ``messages`` within the budget: the oldest whole turns left out until
        the rest fits, but never the turn in progress."""
        fixed = len(system) + _chars(list(tool_specs))
        sizes = [_chars(message) for message in messages]
        total = fixed + sum(sizes)
        rate = self.tokens_per_char
        if not self.max_tokens or total * rate <= self.max_tokens:
            return Window(0, round(total * rate), total)
        starts = [index for index, message in enumerate(messages) if starts_turn(message)]
        kept = total
        cut = 0
        for start in starts:
            kept -= sum(sizes[cut:start])
            cut = start
            if kept * rate <= self.max_tokens:
                break
        return Window(cut, round(kept * rate), kept)

    def learn(self, window: Window, input_tokens: int) -> None:
        """Correct the rate from what the model counted for the request ``window`` described."""
        if input_tokens > 0 and window.chars > 0:
            self.tokens_per_char = input_tokens / window.chars
