"""Bedrock's ConverseStream, read into canonical events and one finished turn.

:class:`BedrockStreamParser` is fed the event dicts of a ConverseStream, one at a time, as
:meth:`~service.providers.bedrock.BedrockProvider.raw_stream` yields them (the shape botocore's
parser gives them). Each call to
:meth:`~BedrockStreamParser.feed` returns the canonical events to emit right away; once the
stream has ended, :meth:`~BedrockStreamParser.result` gives the assistant message to append to
the conversation, the stop reason, the usage and the tool uses to run.

The parser is a plain class: one small handler per event kind, all working on explicit state
(the content blocks by ``contentBlockIndex``, the stop reason, the usage). It does no I/O.

:func:`stream_error_from_exception` maps what the Bedrock client raises (botocore's exceptions
before the stream and for exception frames, aiohttp's while the stream is read) to the service's
own :class:`~service.errors.ProviderError` family, so nothing outside this package needs to know
botocore or aiohttp.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from typing import Any, ClassVar

import aiohttp
import urllib3.exceptions
from botocore import exceptions as botocore_exceptions

from service.core.events import (
    Event,
    ReasoningDelta,
    TextDelta,
    ToolInputDelta,
    ToolUse,
    ToolUseStart,
    Usage,
    text_delta,
)
from service.errors import ModelStreamError, ProviderError
from service.providers.base import PendingToolUse, TurnResult
from service.providers.blocks import Block, ReasoningBlock, TextBlock, ToolBlock, as_int, usage_from

__all__ = [
    "RETRYABLE_CODES",
    "RETRYABLE_STREAM_CODES",
    "RETRYABLE_STREAM_ERRORS",
    "BedrockStreamParser",
    "stream_error_from_exception",
]

# Exception events inside the stream that are worth retrying; the spelling is Bedrock's event key.
# botocore never retries these (they arrive after the HTTP 200), so the agent loop does.
RETRYABLE_STREAM_ERRORS = frozenset(
    {
        "throttlingException",
        "serviceUnavailableException",
        "internalServerException",
        "modelStreamErrorException",
    }
)

RETRYABLE_STREAM_CODES = frozenset(code.lower() for code in RETRYABLE_STREAM_ERRORS)

# Error codes of a ClientError raised before the stream that a retry may cure (compared lowercased,
# since the same error is spelled "ThrottlingException" there and "throttlingException" in-stream).
RETRYABLE_CODES = frozenset(
    {
        "throttlingexception",
        "serviceunavailableexception",
        "internalserverexception",
        "modelnotreadyexception",
    }
)

# What a user should read in front of Bedrock's own message, keyed by the lowercased error code.
_DESCRIPTIONS: dict[str, str] = {
    "throttlingexception": "Bedrock throttled the request",
    "servicequotaexceededexception": "The Bedrock service quota was exceeded",
    "serviceunavailableexception": "Bedrock is temporarily unavailable",
    "internalserverexception": "Bedrock hit an internal error",
    "modelstreamerrorexception": "The model failed while streaming its answer",
    "modeltimeoutexception": "The model took too long to answer",
    "modelerrorexception": "The model returned an error",
    "modelnotreadyexception": "The model is not ready yet",
    "validationexception": "Bedrock rejected the request as invalid",
    "accessdeniedexception": "Access to the Bedrock model was denied",
    "resourcenotfoundexception": "The Bedrock model or resource was not found",
    "unrecognizedclientexception": "AWS did not recognise the credentials",
    "expiredtokenexception": "The AWS credentials have expired",
}


class BedrockStreamParser:
    """Parse one ConverseStream response, event by event, into canonical events and a TurnResult."""

    def __init__(self, turn: int = 1) -> None:
        self.turn = turn
        self.role: str | None = None
        self.stop_reason: str | None = None
        self.usage = Usage()
        self.latency_ms: int | None = None
        # Bedrock's stream names neither: the request id is the response's (its header), and the
        # model is the one asked for (set by the provider).
        self.response_id = ""
        self.response_model = ""
        self._blocks: dict[int, Block] = {}

    # -- public API -------------------------------------------------------------------------

    def feed(self, event: dict[str, Any]) -> list[Event]:
        """Take one stream event; return the canonical events to emit now."""
        emitted: list[Event] = []
        # botocore gives one key per event; walking all keys just keeps an odd event from being lost.
        for key, payload in event.items():
            if key.endswith("Exception"):
                raise _stream_exception_event(key, payload)
            handler = self._handlers.get(key)
            if handler is None:
                continue  # a newer event kind than this parser knows: not worth failing a run
            emitted.extend(handler(self, payload if isinstance(payload, dict) else {}))
        return emitted

    def text(self, index: int, text: str) -> TextDelta | None:
        """Take one text delta of block ``index`` (what a ``contentBlockDelta`` with a text
        carries, the one event per token); return the event to emit, if any."""
        block = self._blocks.get(index)
        if block is None:
            block = self._blocks[index] = TextBlock()
        if not isinstance(block, TextBlock) or block.closed or not text:
            return None
        block.parts.append(text)
        return text_delta(text, self.turn)

    def text_so_far(self) -> str:
        """The answer's text received so far, for a turn that will not finish."""
        return "".join(
            "".join(block.parts) for _, block in sorted(self._blocks.items()) if isinstance(block, TextBlock)
        )

    def result(self) -> TurnResult:
        """The finished turn; raises ProviderError if the stream ended without messageStop."""
        if self.stop_reason is None:
            raise ProviderError(
                "model stream ended without messageStop", code="incomplete_stream", retryable=False
            )
        content: list[dict[str, Any]] = []
        tool_uses: list[PendingToolUse] = []
        texts: list[str] = []
        for index in sorted(self._blocks):
            block = self._blocks[index]
            if isinstance(block, TextBlock):
                texts.append("".join(block.parts))
            elif isinstance(block, ToolBlock) and block.pending is not None:
                tool_uses.append(block.pending)
            item = block.content()
            if item is not None:
                content.append(item)
        return TurnResult(
            message={"role": "assistant", "content": content},
            stop_reason=self.stop_reason,
            usage=self.usage,
            latency_ms=self.latency_ms,
            tool_uses=tool_uses,
            # Joined with "" so it equals what the client saw by concatenating the TextDeltas.
            text="".join(texts),
            response_id=self.response_id,
            response_model=self.response_model,
        )

    # -- event handlers ---------------------------------------------------------------------

    def _on_message_start(self, payload: dict[str, Any]) -> list[Event]:
        role = payload.get("role")
        self.role = role if isinstance(role, str) else "assistant"
        return []

    def _on_block_start(self, payload: dict[str, Any]) -> list[Event]:
        index = _block_index(payload)
        start = payload.get("start")
        start = start if isinstance(start, dict) else {}
        if "toolUse" in start:
            if index in self._blocks:
                return []
            spec = start["toolUse"] if isinstance(start["toolUse"], dict) else {}
            block = ToolBlock(tool=str(spec.get("name", "")), tool_use_id=str(spec.get("toolUseId", "")))
            self._blocks[index] = block
            return [ToolUseStart(tool=block.tool, tool_use_id=block.tool_use_id, turn=self.turn)]
        if "reasoningContent" in start:
            self._blocks.setdefault(index, ReasoningBlock())
            return []
        if "text" in start:
            # Older streams announced text blocks; any text carried by the start counts as a delta.
            self._blocks.setdefault(index, TextBlock())
            return self._on_text_delta(index, start["text"])
        return []  # an empty or unknown start: the first delta decides the block's kind

    def _on_block_delta(self, payload: dict[str, Any]) -> list[Event]:
        index = _block_index(payload)
        delta = payload.get("delta")
        if not isinstance(delta, dict):
            return []
        emitted: list[Event] = []
        for kind, value in delta.items():
            handler = self._delta_handlers.get(kind)
            if handler is not None:  # citations, images and later kinds are not ours to render
                emitted.extend(handler(self, index, value))
        return emitted

    def _on_block_stop(self, payload: dict[str, Any]) -> list[Event]:
        block = self._blocks.get(_block_index(payload))
        return self._close(block) if block is not None else []

    def _on_message_stop(self, payload: dict[str, Any]) -> list[Event]:
        reason = payload.get("stopReason")
        self.stop_reason = reason if isinstance(reason, str) and reason else "unknown"
        emitted: list[Event] = []
        # A block left open by the model still belongs to the message; close it here.
        for index in sorted(self._blocks):
            emitted.extend(self._close(self._blocks[index]))
        return emitted

    def _on_metadata(self, payload: dict[str, Any]) -> list[Event]:
        usage = payload.get("usage")
        if isinstance(usage, dict):
            self.usage = usage_from(usage, "inputTokens", "outputTokens", "totalTokens")
        metrics = payload.get("metrics")
        if isinstance(metrics, dict) and "latencyMs" in metrics:
            self.latency_ms = as_int(metrics["latencyMs"])
        return []

    # -- delta handlers ---------------------------------------------------------------------

    def _on_text_delta(self, index: int, text: Any) -> list[Event]:
        if not isinstance(text, str):
            return []
        event = self.text(index, text)
        return [] if event is None else [event]

    def _on_tool_input_delta(self, index: int, value: Any) -> list[Event]:
        block = self._blocks.get(index)
        # Without its start the tool's name and id are unknown, so the fragment cannot be used.
        if not isinstance(block, ToolBlock) or block.closed or not isinstance(value, dict):
            return []
        fragment = value.get("input")
        if not isinstance(fragment, str) or not fragment:
            return []
        block.parts.append(fragment)
        return [ToolInputDelta(tool_use_id=block.tool_use_id, delta=fragment, turn=self.turn)]

    def _on_reasoning_delta(self, index: int, value: Any) -> list[Event]:
        if not isinstance(value, dict):
            return []
        block = self._blocks.setdefault(index, ReasoningBlock())
        if not isinstance(block, ReasoningBlock) or block.closed:
            return []
        emitted: list[Event] = []
        text = value.get("text")
        if isinstance(text, str) and text:
            block.parts.append(text)
            emitted.append(ReasoningDelta(text=text, turn=self.turn))
        signature = value.get("signature")
        if isinstance(signature, str) and signature:
            # Kept verbatim: the model checks it when the message is sent back next turn.
            block.signature_parts.append(signature)
        redacted = value.get("redactedContent")
        if isinstance(redacted, (bytes, bytearray, str)):
            chunk = redacted.encode() if isinstance(redacted, str) else bytes(redacted)
            block.redacted = (block.redacted or bytearray()) + chunk
        return emitted

    # The handlers by event and by delta kind, as plain functions called with the parser: a dict
    # of bound methods made per parser would tie each one (and the answer's blocks it holds) into a
    # reference cycle that only the garbage collector frees, once per model turn.
    _handlers: ClassVar[dict[str, Callable[..., list[Event]]]] = {
        "messageStart": _on_message_start,
        "contentBlockStart": _on_block_start,
        "contentBlockDelta": _on_block_delta,
        "contentBlockStop": _on_block_stop,
        "messageStop": _on_message_stop,
        "metadata": _on_metadata,
    }
    _delta_handlers: ClassVar[dict[str, Callable[..., list[Event]]]] = {
        "text": _on_text_delta,
        "toolUse": _on_tool_input_delta,
        "reasoningContent": _on_reasoning_delta,
    }

    # -- helpers ----------------------------------------------------------------------------

    def _close(self, block: Block) -> list[Event]:
        if block.closed:
            return []
        if isinstance(block, ToolBlock):
            pending = block.close()
            return [
                ToolUse(
                    tool=pending.tool,
                    tool_use_id=pending.tool_use_id,
                    input=pending.input,
                    turn=self.turn,
                )
            ]
        block.closed = True
        return []


def _block_index(payload: dict[str, Any]) -> int:
    """The payload's contentBlockIndex, 0 when missing or unusable."""
    index = as_int(payload.get("contentBlockIndex"))
    return index if index is not None else 0


def _describe(code: str, message: str) -> str:
    """A user-facing sentence for an upstream error code and Bedrock's own message."""
    prefix = _DESCRIPTIONS.get(code.lower(), "Bedrock returned an error")
    return f"{prefix} ({code}): {message}" if message else f"{prefix} ({code})"


def _stream_exception_event(key: str, payload: Any) -> ModelStreamError:
    """The error for an exception event found inside the stream."""
    message = payload.get("message") if isinstance(payload, dict) else payload
    message = message if isinstance(message, str) else ""
    return ModelStreamError(_describe(key, message), code=key, retryable=key in RETRYABLE_STREAM_ERRORS)


def _client_error_parts(exc: botocore_exceptions.ClientError) -> tuple[str, str, int | None]:
    """Code, message and HTTP status out of a botocore ClientError's response dict."""
    response = exc.response if isinstance(exc.response, dict) else {}
    error = response.get("Error") if isinstance(response.get("Error"), dict) else {}
    code = str(error.get("Code") or "Unknown")
    message = str(error.get("Message") or "")
    metadata = response.get("ResponseMetadata")
    status = as_int(metadata.get("HTTPStatusCode")) if isinstance(metadata, dict) else None
    return code, message, status


def stream_error_from_exception(exc: BaseException) -> ProviderError:
    """Map an exception raised by the Bedrock client (before or during the stream) to a ProviderError."""
    if isinstance(exc, ProviderError):
        return exc
    if isinstance(exc, botocore_exceptions.EventStreamError):
        code, message, _ = _client_error_parts(exc)
        return ModelStreamError(
            _describe(code, message), code=code, retryable=code.lower() in RETRYABLE_STREAM_CODES
        )
    if isinstance(exc, botocore_exceptions.ClientError):
        code, message, status = _client_error_parts(exc)
        retryable = code.lower() in RETRYABLE_CODES or status == 429 or (status or 0) >= 500
        return ProviderError(_describe(code, message), code=code, retryable=retryable)
    if isinstance(exc, (botocore_exceptions.NoCredentialsError, botocore_exceptions.PartialCredentialsError)):
        return ProviderError(
            f"No usable AWS credentials were found for Bedrock: {exc}",
            code="no_credentials",
            retryable=False,
        )
    if isinstance(exc, botocore_exceptions.NoRegionError):
        return ProviderError(
            "No AWS region is configured for Bedrock; set AWS_REGION or AWS_DEFAULT_REGION",
            code="no_region",
            retryable=False,
        )
    # Timeouts are tested before the connection errors they subclass, to keep their own code.
    # aiobotocore wraps what fails before the stream in botocore's exceptions; what fails while
    # the stream is read comes straight from aiohttp.
    if isinstance(exc, (botocore_exceptions.ConnectTimeoutError, aiohttp.ConnectionTimeoutError)):
        return ProviderError(
            f"Could not reach Bedrock in time: {exc}", code="connect_timeout", retryable=True
        )
    if isinstance(
        exc,
        (
            botocore_exceptions.ReadTimeoutError,
            urllib3.exceptions.ReadTimeoutError,
            aiohttp.ServerTimeoutError,
        ),
    ):
        return ProviderError(
            f"Bedrock did not answer in time: {exc or 'timed out'}", code="read_timeout", retryable=True
        )
    if isinstance(
        exc,
        (
            botocore_exceptions.ConnectionError,
            botocore_exceptions.HTTPClientError,
            urllib3.exceptions.ProtocolError,
            aiohttp.ClientConnectionError,
            aiohttp.ClientPayloadError,
            builtins.ConnectionError,
        ),
    ):
        return ProviderError(
            f"The connection to Bedrock failed: {exc}", code="connection_error", retryable=True
        )
    if isinstance(exc, RecursionError):
        # botocore parses the stream's frames and error bodies with json.loads, which gives up
        # on JSON nested about a thousand levels deep.
        return ProviderError(
            f"Bedrock sent JSON nested too deeply to read: {exc}", code="malformed_chunk", retryable=False
        )
    if isinstance(exc, builtins.TimeoutError):
        return ProviderError(
            f"Bedrock did not answer in time: {exc or 'timed out'}",
            code="read_timeout",
            retryable=True,
        )
    detail = str(exc)
    return ProviderError(
        f"The Bedrock call failed ({type(exc).__name__}){': ' + detail if detail else ''}",
        code="provider_error",
        retryable=False,
    )
