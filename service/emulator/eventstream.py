"""Encoder for AWS event-stream binary frames (``application/vnd.amazon.eventstream``).

A frame is::

    prelude:  total length (uint32 BE) | headers length (uint32 BE) | CRC32 of those 8 bytes
    headers:  repeated  name length (uint8) | name | value type (uint8) | value
    payload:  raw bytes (JSON for Bedrock)
    trailer:  CRC32 of everything before it (uint32 BE)

Only string header values (type 7: uint16 BE length, then UTF-8 bytes) are produced, which
is all that Bedrock's ConverseStream uses. Only encoding lives here: the tests decode with
botocore's own parser so that the two sides are written independently.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Mapping
from typing import Any

CONTENT_TYPE = "application/vnd.amazon.eventstream"

_STRING_TYPE = 7
_PRELUDE = struct.Struct(">II")
_CRC = struct.Struct(">I")
# The frame overhead: prelude (8) + prelude CRC (4) + message CRC (4).
_OVERHEAD = _PRELUDE.size + 2 * _CRC.size
# Limits of the format (and of botocore's decoder): 128 KiB of headers, 16 MiB per frame.
_MAX_HEADERS_LENGTH = 128 * 1024
_MAX_MESSAGE_LENGTH = 16 * 1024 * 1024


def encode_headers(headers: Mapping[str, str]) -> bytes:
    """Encode string-valued headers in event-stream header format."""
    parts: list[bytes] = []
    for name, value in headers.items():
        raw_name = name.encode("utf-8")
        raw_value = value.encode("utf-8")
        if len(raw_name) > 255:
            raise ValueError(f"header name too long: {name!r}")
        if len(raw_value) > 0xFFFF:
            raise ValueError(f"header value too long for {name!r}")
        parts.append(bytes((len(raw_name),)))
        parts.append(raw_name)
        parts.append(struct.pack(">BH", _STRING_TYPE, len(raw_value)))
        parts.append(raw_value)
    return b"".join(parts)


def encode_message(headers: Mapping[str, str], payload: bytes) -> bytes:
    """Encode one complete frame from its headers and payload bytes."""
    raw_headers = encode_headers(headers)
    if len(raw_headers) > _MAX_HEADERS_LENGTH:
        raise ValueError("headers exceed the event-stream limit")
    total = _OVERHEAD + len(raw_headers) + len(payload)
    if total > _MAX_MESSAGE_LENGTH:
        raise ValueError("message exceeds the event-stream limit")
    prelude = _PRELUDE.pack(total, len(raw_headers))
    prelude_crc = _CRC.pack(zlib.crc32(prelude))
    # The message CRC covers the prelude CRC too; crc32 is chained to avoid a join before it.
    crc = zlib.crc32(prelude)
    crc = zlib.crc32(prelude_crc, crc)
    crc = zlib.crc32(raw_headers, crc)
    crc = zlib.crc32(payload, crc)
    return b"".join((prelude, prelude_crc, raw_headers, payload, _CRC.pack(crc)))


def _json_bytes(payload: Any) -> bytes:
    # Compact separators: frames are many and small, so every byte is a noticeable share.
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def encode_event(event_type: str, payload: Mapping[str, Any]) -> bytes:
    """Encode an ``event`` frame whose payload is ``payload`` as JSON."""
    headers = {
        ":event-type": event_type,
        ":content-type": "application/json",
        ":message-type": "event",
    }
    return encode_message(headers, _json_bytes(payload))


def encode_exception(exception_type: str, message: str) -> bytes:
    """Encode an ``exception`` frame (botocore raises ``EventStreamError`` on it)."""
    headers = {
        ":exception-type": exception_type,
        ":content-type": "application/json",
        ":message-type": "exception",
    }
    return encode_message(headers, _json_bytes({"message": message}))
