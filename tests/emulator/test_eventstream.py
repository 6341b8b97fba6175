"""The event-stream encoder, checked against botocore's own decoder (CRCs included)."""

from __future__ import annotations

import json

import pytest
from botocore.eventstream import ChecksumMismatch, EventStreamBuffer, EventStreamMessage

from service.emulator.eventstream import (
    encode_event,
    encode_exception,
    encode_headers,
    encode_message,
)


def _decode(data: bytes, chunk: int | None = None) -> list[EventStreamMessage]:
    """Decode with botocore, optionally feeding the bytes in small chunks."""
    buffer = EventStreamBuffer()
    messages: list[EventStreamMessage] = []
    step = chunk or len(data) or 1
    for start in range(0, len(data), step):
        buffer.add_data(data[start : start + step])
        messages.extend(buffer)
    return messages


def test_event_frame_round_trips_through_botocore() -> None:
    """An event frame decodes with its headers and JSON payload intact."""
    payload = {"contentBlockIndex": 0, "delta": {"text": "Hello"}}
    (message,) = _decode(encode_event("contentBlockDelta", payload))
    assert message.headers == {
        ":event-type": "contentBlockDelta",
        ":content-type": "application/json",
        ":message-type": "event",
    }
    assert json.loads(message.payload) == payload
    assert message.to_response_dict()["status_code"] == 200


def test_exception_frame_round_trips_through_botocore() -> None:
    """An exception frame decodes with its exception type and message."""
    (message,) = _decode(encode_exception("throttlingException", "slow down"))
    assert message.headers == {
        ":exception-type": "throttlingException",
        ":content-type": "application/json",
        ":message-type": "exception",
    }
    assert json.loads(message.payload) == {"message": "slow down"}
    # botocore marks non-event frames with a non-200 status, which makes it raise.
    assert message.to_response_dict()["status_code"] != 200


def test_prelude_lengths_match_the_frame() -> None:
    """The prelude's lengths describe the frame exactly."""
    data = encode_event("messageStart", {"role": "assistant"})
    (message,) = _decode(data)
    assert message.prelude.total_length == len(data)
    assert message.prelude.headers_length == len(
        encode_headers(
            {
                ":event-type": "messageStart",
                ":content-type": "application/json",
                ":message-type": "event",
            }
        )
    )


def test_many_frames_split_across_odd_chunks() -> None:
    """Concatenated frames decode even when they arrive in odd-sized pieces."""
    payloads = [{"contentBlockIndex": 0, "delta": {"text": f" word{i}"}} for i in range(20)]
    data = b"".join(encode_event("contentBlockDelta", p) for p in payloads)
    messages = _decode(data, chunk=7)
    assert [json.loads(m.payload) for m in messages] == payloads


def test_non_ascii_text_survives() -> None:
    """UTF-8 text round-trips unchanged."""
    payload = {"delta": {"text": "héllo — 世界 🙂"}}
    (message,) = _decode(encode_event("contentBlockDelta", payload))
    assert json.loads(message.payload.decode("utf-8")) == payload


def test_empty_payload_and_no_headers() -> None:
    """The smallest possible frame is valid."""
    (message,) = _decode(encode_message({}, b""))
    assert message.headers == {}
    assert message.payload == b""


def test_corrupted_frame_fails_the_crc_check() -> None:
    """A flipped payload byte is caught by botocore's CRC check."""
    data = bytearray(encode_event("messageStop", {"stopReason": "end_turn"}))
    data[-6] ^= 0xFF  # a payload byte, so only the message CRC can notice
    with pytest.raises(ChecksumMismatch):
        _decode(bytes(data))


def test_oversized_header_value_is_refused() -> None:
    """A header value beyond 65535 bytes cannot be encoded."""
    with pytest.raises(ValueError):
        encode_headers({"x": "v" * 70_000})
