"""An OpenAI-compatible chat-completions stream, read into canonical events and one finished turn.

Three layers, each fed by the one before it:

- :class:`SSELineReader` takes the raw bytes of network reads and hands over the payload of each
  ``data:`` line: with or without the space, comments and ``event:``/``id:``/``retry:`` lines
  ignored, LF, CRLF and CR line ends, and lines split anywhere across reads (inside a UTF-8
  character, between ``\\r`` and ``\\n``);
- :func:`decode_data` turns a payload into a chunk (its JSON object) or ``"[DONE]"``;
- :class:`OpenAIStreamParser` is fed those chunks (from the Bedrock Access Gateway, vLLM,
  LiteLLM, OpenAI itself) and produces the same canonical events as the Bedrock parser, and a
  :class:`~service.providers.base.TurnResult` whose message is in Bedrock's format, because the
  agent loop keeps the conversation in that one format whatever the provider.

Anything malformed is a :class:`~service.errors.ProviderError` with the code ``malformed_chunk``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from service.core.events import (
    Event,
    ReasoningDelta,
    ToolInputDelta,
    ToolUse,
    ToolUseStart,
    Usage,
    text_delta,
)
from service.errors import ModelStreamError, ProviderError
from service.providers import upstream_json
from service.providers.base import PendingToolUse, TurnResult
from service.providers.bedrock_stream import RETRYABLE_CODES, RETRYABLE_STREAM_CODES
from service.providers.blocks import ReasoningBlock, TextBlock, ToolBlock, as_int, usage_from

__all__ = ["DONE", "OPENAI_FINISH_REASONS", "OpenAIStreamParser", "SSELineReader", "decode_data"]

DONE = "[DONE]"

# A line never ends inside these bytes, so an EOL found in fresh bytes is always a real one.
_EOL = re.compile(rb"\r\n|\r|\n")

DEFAULT_MAX_LINE_BYTES = 16 * 1024 * 1024


class SSELineReader:
    """Incremental Server-Sent Events reader: network reads in, the payload of each ``data:`` line out.

    Each ``data:`` line is handed over as soon as its line end arrives, without waiting for the
    blank line that closes the event: OpenAI-compatible servers put one whole JSON chunk on each
    ``data:`` line, and waiting would hold a token back until the next network read.
    """

    def __init__(self, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> None:
        self._partial = bytearray()  # the current line, not yet ended
        self._skip_lf = False  # the last read ended with "\r": a "\n" opening the next one is its pair
        self._first_line = True
        self._max_line_bytes = max_line_bytes

    def feed(self, data: bytes) -> list[str]:
        """Take the bytes of one network read; return the payloads of the data lines it completed."""
        if self._skip_lf and data:
            self._skip_lf = False
            if data.startswith(b"\n"):
                data = data[1:]
        payloads: list[str] = []
        start = 0
        for match in _EOL.finditer(data):
            piece = data[start : match.start()]
            if self._partial:
                self._partial += piece
                line = bytes(self._partial)
                self._partial.clear()
            else:
                line = piece
            start = match.end()
            payload = self._line(line)
            if payload is not None:
                payloads.append(payload)
        if start < len(data):
            self._partial += data[start:]
            if len(self._partial) > self._max_line_bytes:
                raise ProviderError(
                    f"The model stream sent a line longer than {self._max_line_bytes} bytes",
                    code="malformed_chunk",
                )
        self._skip_lf = data.endswith(b"\r")
        return payloads

    def close(self) -> list[str]:
        """The payload of a last line that ended with the stream instead of a line end, if any."""
        if not self._partial:
            return []
        line = bytes(self._partial)
        self._partial.clear()
        payload = self._line(line)
        return [payload] if payload is not None else []

    def _line(self, raw: bytes) -> str | None:
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ProviderError(
                f"The model stream sent a line that is not valid UTF-8: {exc}", code="malformed_chunk"
            ) from None
        if self._first_line:
            self._first_line = False
            line = line.removeprefix("\ufeff")  # a byte-order mark may open the stream
        if not line or line.startswith(":"):
            return None  # an event's end, or a comment (a keep-alive)
        name, _, value = line.partition(":")
        if name != "data":
            return None  # event:, id:, retry: and unknown fields carry nothing a chunk needs
        return value[1:] if value.startswith(" ") else value


def decode_data(payload: str) -> dict[str, Any] | str | None:
    """One data line's payload as a chunk (a dict), ``"[DONE]"``, or None for an empty line."""
    text = payload.strip()
    if not text:
        return None
    if text == DONE:
        return DONE
    try:
        # A chunk carries text as strings and counts that as_int refuses unless finite; a tool's
        # input, where a number matters, is checked whole when its block closes. Looking for an
        # overflowed float here would walk every token's chunk.
        value = upstream_json.loads(text, finite_only=False)
    except ValueError as exc:
        raise ProviderError(
            f"The model stream sent malformed JSON ({exc}): {text[:120]!r}", code="malformed_chunk"
        ) from None
    if not isinstance(value, dict):
        raise ProviderError(
            f"The model stream sent a chunk that is not a JSON object: {text[:120]!r}",
            code="malformed_chunk",
        )
    return value


# OpenAI's finish reasons in Bedrock's words: the agent loop and every client speak one vocabulary.
# A reason not listed here is passed on as it came.
OPENAI_FINISH_REASONS: dict[str, str] = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "length": "max_tokens",
    "content_filter": "content_filtered",
}

# Error codes found inside an OpenAI-compatible stream that a retry may cure (compared lowercased):
# OpenAI's own, plus Bedrock's, which the Bedrock Access Gateway passes through.
_RETRYABLE_OPENAI_CODES = (
    RETRYABLE_CODES
    | RETRYABLE_STREAM_CODES
    | {
        "rate_limit_exceeded",
        "rate_limit_error",
        "server_error",
        "overloaded_error",
    }
)

# The Bedrock Access Gateway reports a mid-stream failure as {"error": {"message": str(exc)}} with
# boto3's text, "An error occurred (throttlingException) when calling ...": the code is in there.
_BOTO_CODE_RE = re.compile(r"An error occurred \(([A-Za-z][A-Za-z0-9_.]*)\)")


@dataclass
class _StreamedToolCall:
    """One tool call streamed under its ``index``: a Bedrock tool block plus whether it was announced."""

    block: ToolBlock
    started: bool = False


class OpenAIStreamParser:
    """Parse one OpenAI-compatible chat-completions stream, chunk by chunk, into events and a TurnResult."""

    def __init__(self, turn: int = 1) -> None:
        self.turn = turn
        self.finish_reason: str | None = None  # as the server sent it
        self.stop_reason: str | None = None  # in Bedrock's words; set by finish_reason or [DONE]
        self.usage = Usage()
        self.latency_ms: int | None = None  # the wire carries no latency
        self.response_id = ""  # every chunk repeats them; the first one's are kept
        self.response_model = ""
        self.done = False
        self._text = TextBlock()
        self._reasoning = ReasoningBlock()
        self._tools: dict[int, _StreamedToolCall] = {}
        self._closed = False  # the tool calls are parsed: later deltas cannot change the message

    # -- public API -------------------------------------------------------------------------

    def feed(self, event: dict[str, Any] | str) -> list[Event]:
        """Take one chunk (the JSON object of a ``data:`` line) or ``"[DONE]"``; return events to emit now."""
        if isinstance(event, str):
            if event.strip() != DONE:
                raise ProviderError(
                    f"The model stream sent a data line that is not JSON: {event[:80]!r}",
                    code="malformed_chunk",
                )
            return self._on_done()
        if not isinstance(event, dict):
            raise ProviderError(
                f"The model stream sent a chunk that is not a JSON object: {type(event).__name__}",
                code="malformed_chunk",
            )
        if self.done:
            return []  # [DONE] is the last word; anything after it is not part of the answer
        error = event.get("error")
        if error:
            raise _openai_stream_error(error)
        if not self.response_id:
            self._identify(event)
        usage = event.get("usage")
        if isinstance(usage, dict):
            self._onusage_from(usage)
        choice = _first_choice(event.get("choices"))
        if choice is None:
            return []  # the usage chunk (choices: []), or a keep-alive
        emitted: list[Event] = []
        delta = choice.get("delta")
        if isinstance(delta, dict) and not self._closed:
            emitted.extend(self._on_delta(delta))
        reason = choice.get("finish_reason")
        if isinstance(reason, str) and reason and self.finish_reason is None:
            self.finish_reason = reason
            self.stop_reason = OPENAI_FINISH_REASONS.get(reason, reason)
            emitted.extend(self._close())
        return emitted

    def text_so_far(self) -> str:
        """The answer's text received so far, for a turn that will not finish."""
        return "".join(self._text.parts)

    def result(self) -> TurnResult:
        """The finished turn; raises ProviderError if neither a finish_reason nor [DONE] arrived."""
        if self.stop_reason is None:
            raise ProviderError(
                "The model stream ended without a finish_reason or [DONE]: the answer is incomplete",
                code="incomplete_stream",
                retryable=False,
            )
        content: list[dict[str, Any]] = []
        for item in (self._reasoning.content(), self._text.content()):
            if item is not None:
                content.append(item)
        tool_uses: list[PendingToolUse] = []
        for index in sorted(self._tools):
            block = self._tools[index].block
            if block.pending is not None:
                tool_uses.append(block.pending)
                content.append(block.content())
        return TurnResult(
            message={"role": "assistant", "content": content},
            stop_reason=self.stop_reason,
            usage=self.usage,
            latency_ms=self.latency_ms,
            tool_uses=tool_uses,
            text=self.text_so_far(),
            response_id=self.response_id,
            response_model=self.response_model,
        )

    def _identify(self, chunk: dict[str, Any]) -> None:
        ident, model = chunk.get("id"), chunk.get("model")
        if isinstance(ident, str):
            self.response_id = ident
        if isinstance(model, str) and not self.response_model:
            self.response_model = model

    # -- chunk parts ------------------------------------------------------------------------

    def _on_delta(self, delta: dict[str, Any]) -> list[Event]:
        emitted: list[Event] = []
        # "reasoning_content" is what the Bedrock Access Gateway and DeepSeek send; vLLM says "reasoning".
        for key in ("reasoning_content", "reasoning"):
            reasoning = delta.get(key)
            if isinstance(reasoning, str) and reasoning:
                self._reasoning.parts.append(reasoning)
                emitted.append(ReasoningDelta(text=reasoning, turn=self.turn))
                break
        text = delta.get("content")
        if isinstance(text, str) and text:
            self._text.parts.append(text)
            emitted.append(text_delta(text, self.turn))
        tool_calls = delta.get("tool_calls")
        if isinstance(tool_calls, list):
            for piece in tool_calls:
                if isinstance(piece, dict):
                    emitted.extend(self._on_tool_call_piece(piece))
        function_call = delta.get("function_call")
        if isinstance(function_call, dict):
            # The deprecated single-function form: one call, always at index 0.
            emitted.extend(self._on_tool_call_piece({"index": 0, "function": function_call}))
        return emitted

    def _on_tool_call_piece(self, piece: dict[str, Any]) -> list[Event]:
        index = self._tool_index(piece)
        call = self._tools.get(index)
        if call is None:
            call = self._tools[index] = _StreamedToolCall(ToolBlock(tool="", tool_use_id=""))
        block = call.block
        ident = piece.get("id")
        if isinstance(ident, str) and ident and not block.tool_use_id:
            block.tool_use_id = ident
        function = piece.get("function")
        function = function if isinstance(function, dict) else {}
        name = function.get("name")
        if isinstance(name, str) and name and not block.tool:
            block.tool = name
        emitted: list[Event] = []
        if not call.started and block.tool:
            emitted.extend(self._start(index, call))
        fragment = function.get("arguments")
        if isinstance(fragment, dict):
            # A few servers send the arguments as an object rather than JSON text. Written as
            # json writes it (an overflowed float as Infinity), so the strict parse when the
            # block closes gives the model the error rather than this parser raising.
            fragment = json.dumps(fragment)
        if isinstance(fragment, str) and fragment:
            block.parts.append(fragment)
            if call.started:
                emitted.append(ToolInputDelta(tool_use_id=block.tool_use_id, delta=fragment, turn=self.turn))
        return emitted

    def _tool_index(self, piece: dict[str, Any]) -> int:
        index = as_int(piece.get("index"))
        if index is not None:
            return index
        # Some servers leave the index out: a new id opens a new call, anything else continues the last.
        ident = piece.get("id")
        known = any(call.block.tool_use_id == ident for call in self._tools.values())
        if isinstance(ident, str) and ident and not known:
            return max(self._tools, default=-1) + 1
        return max(self._tools, default=0)

    def _start(self, index: int, call: _StreamedToolCall) -> list[Event]:
        """Announce a tool call; arguments that came before its name are passed on in one piece."""
        call.started = True
        block = call.block
        if not block.tool_use_id:
            # The tool result must name the call; a turn-scoped id keeps it unique in the conversation.
            block.tool_use_id = f"call_t{self.turn}_{index}"
        emitted: list[Event] = [ToolUseStart(tool=block.tool, tool_use_id=block.tool_use_id, turn=self.turn)]
        held = "".join(block.parts)
        if held:
            emitted.append(ToolInputDelta(tool_use_id=block.tool_use_id, delta=held, turn=self.turn))
        return emitted

    def _onusage_from(self, usage: dict[str, Any]) -> None:
        self.usage = usage_from(usage, "prompt_tokens", "completion_tokens", "total_tokens")

    def _on_done(self) -> list[Event]:
        self.done = True
        if self.stop_reason is None:
            # [DONE] without a finish_reason: infer the reason from what the answer holds.
            self.stop_reason = "tool_use" if self._tools else "end_turn"
        return self._close()

    def _close(self) -> list[Event]:
        """Parse every tool call's input, once; the ToolUse events follow in index order."""
        if self._closed:
            return []
        self._closed = True
        self._text.closed = True
        self._reasoning.closed = True
        emitted: list[Event] = []
        for index in sorted(self._tools):
            call = self._tools[index]
            if not call.started:
                emitted.extend(self._start(index, call))
            pending = call.block.close()
            emitted.append(
                ToolUse(
                    tool=pending.tool, tool_use_id=pending.tool_use_id, input=pending.input, turn=self.turn
                )
            )
        return emitted


def _first_choice(choices: Any) -> dict[str, Any] | None:
    """The choice with index 0 (the only one asked for), or the first one when none is numbered."""
    if not isinstance(choices, list):
        return None
    dicts = [choice for choice in choices if isinstance(choice, dict)]
    for choice in dicts:
        if as_int(choice.get("index")) == 0:
            return choice
    return dicts[0] if dicts else None


def _openai_stream_error(error: Any) -> ModelStreamError:
    """The error for an ``{"error": ...}`` chunk inside an OpenAI-compatible stream."""
    message = ""
    code = ""
    status: int | None = None
    if isinstance(error, dict):
        raw_message = error.get("message")
        message = raw_message if isinstance(raw_message, str) else ""
        for key in ("code", "type"):
            value = error.get(key)
            if isinstance(value, str) and value:
                code = value
                break
            if isinstance(value, int) and not isinstance(value, bool):
                status = value
                code = f"http_{value}"
                break
    else:
        message = str(error)
    if not code:
        match = _BOTO_CODE_RE.search(message)
        code = match.group(1) if match else "stream_error"
    retryable = code.lower() in _RETRYABLE_OPENAI_CODES or status == 429 or (status or 0) >= 500
    text = f"The model endpoint reported an error mid-stream ({code})"
    return ModelStreamError(f"{text}: {message}" if message else text, code=code, retryable=retryable)
