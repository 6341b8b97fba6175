"""ConverseStream's event-stream body, decoded a read at a time: aiobotocore's EventStream for less CPU.

aiobotocore reads an event stream as botocore does: one HTTP chunk at a time, frames cut out of
a buffer that is copied again for every frame taken (``data = data[n:]``), headers parsed with a
slice per field, then every event walked through the service model by botocore's shape parser,
all through three nested async generators, for every token; under load that reading is a large
share of the service's CPU (measured: docs/benchmarks.md, section Bedrock intake).

:class:`FrameDecoder` cuts every complete frame out of what one socket read brought, with
offsets into that read (no copy of the rest per frame), checks both CRCs as botocore does, and
reads the string headers Bedrock sends in one pass. :func:`fast_event` turns the one event that
comes per token, ``contentBlockDelta`` with a text, tool-input or reasoning-text delta, into the
dict botocore's parser would give (same members, unknown keys such as Bedrock's ``p`` padding
dropped). :func:`plain_event` does the same for the few other events of every answer (message
start and stop, block start and stop, metadata), whose members botocore's JSON parser only copies:
what to copy is read once from botocore's model of the stream (:func:`event_plans`). Everything else (exceptions,
deltas of other kinds, members botocore converts such as blobs, timestamps, lists and unions,
anything malformed) goes through botocore's own parser, so that errors, blobs and unknown union
members come out exactly as botocore makes them; tests/providers/test_bedrock_events.py checks
both against botocore.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from botocore.eventstream import (
    ChecksumMismatch,
    EventStreamHeaderParser,
    EventStreamMessage,
    InvalidHeadersLength,
    InvalidPayloadLength,
    MessagePrelude,
)

from service.jsonsafe import parse

__all__ = [
    "Frame",
    "FrameDecoder",
    "delta_body",
    "event_of",
    "event_plans",
    "fast_event",
    "plain_event",
    "text_of",
]

_PRELUDE = struct.Struct(">III")  # total length, headers length, CRC of the first 8 bytes
_UINT16 = struct.Struct(">H")
_UINT32 = struct.Struct(">I")
_PRELUDE_LENGTH = 12
_OVERHEAD = _PRELUDE_LENGTH + 4  # the prelude and the message CRC
# botocore's limits (botocore/eventstream.py).
_MAX_HEADERS_LENGTH = 128 * 1024
_MAX_PAYLOAD_LENGTH = 24 * 1024 * 1024
_STRING = 7


@dataclass(slots=True)
class Frame:
    """One event-stream message: its headers, its payload, and what botocore needs to parse it."""

    headers: dict[str, Any]
    payload: bytes
    total_length: int
    headers_length: int
    prelude_crc: int
    crc: int

    def message(self) -> EventStreamMessage:
        """The same message as botocore's own decoder gives, for botocore's parser."""
        prelude = MessagePrelude(self.total_length, self.headers_length, self.prelude_crc)
        return EventStreamMessage(prelude, self.headers, self.payload, self.crc)


class FrameDecoder:
    """Cuts complete event-stream frames out of the bytes as they arrive, a read at a time."""

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, data: bytes) -> list[Frame]:
        """Every frame completed by ``data``; an incomplete one waits for the next read."""
        if self._pending:
            data = self._pending + data  # only a frame split across reads costs a copy
        frames: list[Frame] = []
        view = memoryview(data)
        pos, size = 0, len(data)
        while size - pos >= _PRELUDE_LENGTH:
            total, headers_length, prelude_crc = _PRELUDE.unpack_from(data, pos)
            computed = zlib.crc32(view[pos : pos + 8])
            if computed != prelude_crc:
                raise ChecksumMismatch(prelude_crc, computed)
            if headers_length > _MAX_HEADERS_LENGTH:
                raise InvalidHeadersLength(headers_length)
            payload_length = total - headers_length - _OVERHEAD
            # A negative length is botocore's to misread; here it would never move on.
            if payload_length > _MAX_PAYLOAD_LENGTH or payload_length < 0:
                raise InvalidPayloadLength(payload_length)
            end = pos + total
            if end > size:
                break
            (crc,) = _UINT32.unpack_from(data, end - 4)
            computed = zlib.crc32(view[pos + 8 : end - 4], prelude_crc)
            if computed != crc:
                raise ChecksumMismatch(crc, computed)
            headers_start = pos + _PRELUDE_LENGTH
            payload_start = headers_start + headers_length
            frames.append(
                Frame(
                    _headers(data, headers_start, payload_start),
                    data[payload_start : end - 4],
                    total,
                    headers_length,
                    prelude_crc,
                    crc,
                )
            )
            pos = end
        view.release()
        self._pending = data[pos:] if pos < size else b""
        return frames


# Bedrock sends the same few header blocks over and over (one per event type), so each is decoded
# once. The dicts are shared: botocore's parser and ours only read them.
_KNOWN_HEADERS: dict[bytes, dict[str, Any]] = {}
_KNOWN_HEADERS_MAX = 64


def _headers(data: bytes, start: int, end: int) -> dict[str, Any]:
    """The headers in ``data[start:end]``, decoded once per distinct block."""
    raw = data[start:end]
    headers = _KNOWN_HEADERS.get(raw)
    if headers is None:
        headers = _decode_headers(raw)
        if len(_KNOWN_HEADERS) < _KNOWN_HEADERS_MAX:
            _KNOWN_HEADERS[raw] = headers
    return headers


def _decode_headers(data: bytes) -> dict[str, Any]:
    """The headers in ``data``: string ones read here, any other kind by botocore."""
    start, end = 0, len(data)
    headers: dict[str, Any] = {}
    pos = start
    try:
        while pos < end:
            name_end = pos + 1 + data[pos]
            name = data[pos + 1 : name_end].decode("utf-8")
            if data[name_end] != _STRING:
                break
            (length,) = _UINT16.unpack_from(data, name_end + 1)
            value_start = name_end + 3
            pos = value_start + length
            if pos > end or name in headers:
                break
            headers[name] = data[value_start:pos].decode("utf-8")
        else:
            return headers
    except (IndexError, struct.error, UnicodeDecodeError):
        pass
    # Other value kinds, a duplicate, or something malformed: botocore decides, and raises as it did.
    return EventStreamHeaderParser().parse(data)


def _text(value: Any) -> dict[str, Any] | None:
    return {"text": value} if type(value) is str else None


def _tool_input(value: Any) -> dict[str, Any] | None:
    if type(value) is not dict:
        return None
    text = value.get("input")
    if type(text) is not str:
        return None
    return {"toolUse": {"input": text}}


def _reasoning(value: Any) -> dict[str, Any] | None:
    # A union: one member. redactedContent is a base64 blob that botocore decodes: not here.
    if type(value) is not dict or len(value) != 1:
        return None
    ((kind, text),) = value.items()
    if kind not in ("text", "signature") or type(text) is not str:
        return None
    return {"reasoningContent": {kind: text}}


_DELTAS: dict[str, Callable[[Any], dict[str, Any] | None]] = {
    "text": _text,
    "toolUse": _tool_input,
    "reasoningContent": _reasoning,
}


def _json(payload: bytes) -> Any:
    """A frame's body as botocore reads it, ``json.loads(payload.decode("utf-8"))``, through
    :func:`service.jsonsafe.parse` (pydantic's parser where it reads it, ``json.loads`` for the
    rest): bad UTF-8 and a BOM are botocore's errors still. ``NaN`` and ``Infinity``, which
    botocore reads, are refused here, which leaves such a frame to botocore's parser."""
    return parse(payload.decode("utf-8"))


def delta_body(frame: Frame) -> dict[str, Any] | None:
    """The decoded body of a ``contentBlockDelta`` event whose delta has one member; None for any
    other frame (or anything odd in this one: botocore's parser judges those)."""
    headers = frame.headers
    if headers.get(":event-type") != "contentBlockDelta" or headers.get(":message-type") != "event":
        return None
    try:
        body = _json(frame.payload)
    except (ValueError, RecursionError):
        return None  # botocore's parser gives its own answer (or raises) for this one
    if type(body) is not dict:
        return None
    delta = body.get("delta")
    if type(delta) is not dict or len(delta) != 1:
        return None  # a union holds one member; anything else is botocore's to judge
    return body


def text_of(body: dict[str, Any]) -> tuple[int, str] | None:
    """(block index, text) when :func:`delta_body` gave a text delta: the one event per token,
    handed to the parser without the event dict built for it."""
    text = body["delta"].get("text")
    if type(text) is not str:
        return None
    index = body.get("contentBlockIndex", 0)
    if type(index) is not int:
        return None
    return index, text


def event_of(body: dict[str, Any]) -> dict[str, Any] | None:
    """The event botocore would parse out of a :func:`delta_body`; None if botocore should."""
    ((kind, value),) = body["delta"].items()
    handler = _DELTAS.get(kind)
    parsed_delta = handler(value) if handler is not None else None
    if parsed_delta is None:
        return None
    event: dict[str, Any] = {"delta": parsed_delta}
    index = body.get("contentBlockIndex")
    if index is not None:
        if type(index) is not int:
            return None
        event["contentBlockIndex"] = index
    return {"contentBlockDelta": event}


def fast_event(frame: Frame) -> dict[str, Any] | None:
    """The per-token event as botocore would parse it; None for anything botocore should parse."""
    body = delta_body(frame)
    return None if body is None else event_of(body)


# -- the other events of every answer ------------------------------------------------------------

# How botocore's JSON parser reads a value of one shape, where that is only copying: _AS_IS for a
# value it returns as it is (strings, integers, booleans, documents), a {wire name: (member name,
# plan)} dict for a structure, _REFUSE for anything it converts or checks (blobs, timestamps,
# lists, maps, unions), which then goes to botocore's parser whole.
_AS_IS = "as-is"
_REFUSE = "refuse"
_Plan = Any
_COPIED = frozenset({"string", "integer", "long", "boolean"})


def _plan(shape: Any) -> _Plan:
    if shape.type_name == "structure":
        if shape.is_document_type:
            return _AS_IS
        if shape.is_tagged_union:
            return _REFUSE
        return {
            member.serialization.get("name", name): (name, _plan(member))
            for name, member in shape.members.items()
        }
    return _AS_IS if shape.type_name in _COPIED else _REFUSE


def event_plans(stream: Any) -> dict[str, _Plan]:
    """A plan per event of ConverseStream's ``stream`` shape (botocore's model, as the client has
    it) whose members all come from its JSON body (none in the headers, no payload member);
    deltas have their own path."""
    plans = {}
    for name, shape in stream.members.items():
        if name == "contentBlockDelta" or not shape.serialization.get("event"):
            continue  # the deltas have their own path; exceptions are botocore's to raise
        members = shape.members.values()
        if any(m.serialization.get("eventheader") or m.serialization.get("eventpayload") for m in members):
            continue
        plans[name] = _plan(shape)
    return plans


class _Slow(Exception):
    """A value botocore's parser has to read itself."""


def _copy(plan: _Plan, value: Any) -> Any:
    if plan is _AS_IS:
        return value
    if plan is _REFUSE or type(value) is not dict:
        raise _Slow
    parsed = {}
    for wire_name, (name, member_plan) in plan.items():
        raw = value.get(wire_name)
        if raw is not None:  # botocore leaves out a member that is null or absent
            parsed[name] = _copy(member_plan, raw)
    return parsed


def plain_event(frame: Frame, plans: dict[str, _Plan]) -> dict[str, Any] | None:
    """A message or block start or stop, or the metadata, as botocore would parse it (by
    ``plans``, from :func:`event_plans`); None for any other frame, or for anything in this one
    that botocore's parser should judge."""
    headers = frame.headers
    if headers.get(":message-type") != "event":
        return None
    kind = headers.get(":event-type")
    plan = plans.get(kind)  # type: ignore[arg-type]
    if plan is None:
        return None
    try:
        body = _json(frame.payload)
        return {kind: _copy(plan, body)}  # type: ignore[dict-item]
    except (ValueError, RecursionError, _Slow):
        return None
