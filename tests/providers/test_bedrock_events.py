"""The batched event-stream decoder and the per-token fast path, checked against botocore's own
decoder and parser: the same frames, the same events, the same errors."""

from __future__ import annotations

import base64
import json
import random
import struct
import zlib
from typing import Any

import botocore.session
import pytest
from botocore.eventstream import (
    ChecksumMismatch,
    DuplicateHeader,
    EventStreamBuffer,
    InvalidHeadersLength,
)
from botocore.parsers import EventStreamJSONParser
from hypothesis import given, settings
from hypothesis import strategies as st

from service.emulator.eventstream import encode_event, encode_exception, encode_message
from service.providers.bedrock_events import Frame, FrameDecoder, event_plans, fast_event, plain_event

STREAM_SHAPE = (
    botocore.session.get_session()
    .get_service_model("bedrock-runtime")
    .operation_model("ConverseStream")
    .output_shape.members["stream"]
)
PLANS = event_plans(STREAM_SHAPE)
DELTA_HEADERS = {
    ":event-type": "contentBlockDelta",
    ":content-type": "application/json",
    ":message-type": "event",
}


def botocore_frames(data: bytes, cuts: list[int]) -> list[tuple[dict[str, Any], bytes]]:
    """Headers and payload of every frame, by botocore's decoder, fed in the pieces ``cuts`` make."""
    buffer = EventStreamBuffer()
    out = []
    for piece in pieces(data, cuts):
        buffer.add_data(piece)
        out.extend((message.headers, message.payload) for message in buffer)
    return out


def our_frames(data: bytes, cuts: list[int]) -> list[tuple[dict[str, Any], bytes]]:
    """The same, by :class:`FrameDecoder`."""
    decoder = FrameDecoder()
    return [(f.headers, f.payload) for piece in pieces(data, cuts) for f in decoder.feed(piece)]


def pieces(data: bytes, cuts: list[int]) -> list[bytes]:
    """``data`` cut at the given offsets (as the network might deliver it)."""
    bounds = [0, *sorted({c % (len(data) + 1) for c in cuts}), len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:], strict=False) if b > a]


def typed_header(name: str, kind: int, value: bytes) -> bytes:
    """One header of any value kind, encoded by hand (the emulator writes strings only)."""
    raw = name.encode()
    return bytes((len(raw),)) + raw + bytes((kind,)) + value


def frame_with_raw_headers(raw_headers: bytes, payload: bytes) -> bytes:
    """A whole frame around already-encoded headers."""
    total = 16 + len(raw_headers) + len(payload)
    prelude = struct.pack(">II", total, len(raw_headers))
    prelude += struct.pack(">I", zlib.crc32(prelude))
    body = prelude + raw_headers + payload
    return body + struct.pack(">I", zlib.crc32(body))


def botocore_event(frame: Frame) -> Any:
    """What botocore's parser makes of one frame (aiobotocore's awaits the same code)."""
    return EventStreamJSONParser().parse(frame.message().to_response_dict(), STREAM_SHAPE)


def delta_frame(payload: bytes) -> Frame:
    """A contentBlockDelta frame carrying ``payload`` as it is."""
    (frame,) = FrameDecoder().feed(encode_message(DELTA_HEADERS, payload))
    return frame


# -- the frame decoder -----------------------------------------------------------------------------

events = st.one_of(
    st.tuples(
        st.sampled_from(["messageStart", "contentBlockDelta", "metadata", "messageStop"]),
        st.dictionaries(st.text(max_size=5), st.text(max_size=20), max_size=3),
    ).map(lambda e: encode_event(*e)),
    st.tuples(st.sampled_from(["throttlingException", "validationException"]), st.text(max_size=20)).map(
        lambda e: encode_exception(*e)
    ),
    st.binary(max_size=40).map(
        lambda payload: frame_with_raw_headers(
            typed_header(":message-type", 7, b"\x00\x05event")
            + typed_header("flag", 0, b"")
            + typed_header("n", 4, struct.pack(">i", -7))
            + typed_header("blob", 6, b"\x00\x03abc")
            + typed_header("at", 8, struct.pack(">q", 1_700_000_000_000))
            + typed_header("id", 9, bytes(range(16))),
            payload,
        )
    ),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(events, min_size=1, max_size=8), st.lists(st.integers(min_value=0), max_size=12))
def test_frames_decode_as_botocore_decodes_them_however_the_bytes_are_cut(
    frames: list[bytes], cuts: list[int]
) -> None:
    data = b"".join(frames)
    assert our_frames(data, cuts) == botocore_frames(data, [])
    assert len(our_frames(data, cuts)) == len(frames)


def test_all_frames_of_one_read_come_out_of_one_feed() -> None:
    data = b"".join(encode_event("contentBlockDelta", {"delta": {"text": str(n)}}) for n in range(5))
    decoder = FrameDecoder()
    assert len(decoder.feed(data[:-3])) == 4
    assert [json.loads(f.payload)["delta"]["text"] for f in decoder.feed(data[-3:])] == ["4"]


@pytest.mark.parametrize("where", ["prelude", "payload"])
def test_a_corrupt_frame_raises_botocores_checksum_error(where: str) -> None:
    data = bytearray(encode_event("contentBlockDelta", {"delta": {"text": "hi"}}))
    data[4 if where == "prelude" else len(data) - 6] ^= 0xFF
    with pytest.raises(ChecksumMismatch):
        botocore_frames(bytes(data), [])
    with pytest.raises(ChecksumMismatch):
        FrameDecoder().feed(bytes(data))


def test_headers_longer_than_the_limit_are_refused_as_botocore_refuses_them() -> None:
    prelude = struct.pack(">II", 16 + 200_000, 200_000)
    data = prelude + struct.pack(">I", zlib.crc32(prelude))
    with pytest.raises(InvalidHeadersLength):
        FrameDecoder().feed(data)


def test_a_duplicate_header_is_botocores_error() -> None:
    twice = typed_header("a", 7, b"\x00\x01x") + typed_header("a", 7, b"\x00\x01y")
    with pytest.raises(DuplicateHeader):
        FrameDecoder().feed(frame_with_raw_headers(twice, b"{}"))


# -- the per-token fast path -------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
deltas = st.one_of(
    st.fixed_dictionaries({"text": st.text(max_size=12) | json_values}),
    st.fixed_dictionaries(
        {"toolUse": st.fixed_dictionaries({"input": st.text(max_size=12) | json_values}) | json_values}
    ),
    st.fixed_dictionaries(
        {
            "reasoningContent": st.dictionaries(
                st.sampled_from(["text", "signature", "other"]), st.text(max_size=12), min_size=1, max_size=2
            )
            | st.just({"redactedContent": base64.b64encode(b"secret").decode()})
            | json_values
        }
    ),
    st.dictionaries(
        st.sampled_from(["text", "toolUse", "reasoningContent", "citation", "image", "__type"]),
        json_values,
        max_size=3,
    ),
    json_values,
)
bodies = st.fixed_dictionaries(
    {"delta": deltas},
    optional={
        "contentBlockIndex": st.integers(min_value=0, max_value=9) | json_values,
        "p": st.text(alphabet="abcdefghijklmnopqrstuvwxyz", max_size=20),
        "extra": json_values,
    },
)


@pytest.mark.slow
@settings(max_examples=1000, deadline=None)
@given(bodies)
def test_the_fast_path_gives_what_botocore_gives_or_leaves_it_to_botocore(body: dict[str, Any]) -> None:
    frame = delta_frame(json.dumps(body).encode())
    fast = fast_event(frame)
    if fast is not None:
        assert fast == botocore_event(frame)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"contentBlockIndex": 0, "delta": {"text": "Hello"}, "p": "abcdefgh"}, {"text": "Hello"}),
        ({"contentBlockIndex": 2, "delta": {"toolUse": {"input": '{"x":'}}}, {"toolUse": {"input": '{"x":'}}),
        (
            {"contentBlockIndex": 0, "delta": {"reasoningContent": {"text": "hmm"}}},
            {"reasoningContent": {"text": "hmm"}},
        ),
        (
            {"contentBlockIndex": 0, "delta": {"reasoningContent": {"signature": "c2ln"}}},
            {"reasoningContent": {"signature": "c2ln"}},
        ),
    ],
)
def test_every_per_token_delta_takes_the_fast_path(body: dict[str, Any], expected: dict[str, Any]) -> None:
    frame = delta_frame(json.dumps(body).encode())
    event = fast_event(frame)
    assert event == {"contentBlockDelta": {"delta": expected, "contentBlockIndex": body["contentBlockIndex"]}}
    assert event == botocore_event(frame)


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"not json",
        b"\xef\xbb\xbf" + json.dumps({"delta": {"text": "bom"}}).encode(),  # botocore keeps the BOM
        b'{"delta": {"text": "\xff"}}',  # not UTF-8: botocore raises
        json.dumps({"delta": {"reasoningContent": {"redactedContent": "c2VjcmV0"}}}).encode(),  # a blob
        json.dumps({"delta": {"citation": {"title": "t"}}}).encode(),
        b'{"delta": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    ],
)
def test_whatever_the_fast_path_does_not_know_is_left_to_botocore(payload: bytes) -> None:
    assert fast_event(delta_frame(payload)) is None


def test_other_events_and_exceptions_are_left_to_botocore() -> None:
    for data in (
        encode_event("messageStart", {"role": "assistant"}),
        encode_event("metadata", {"usage": {"inputTokens": 1}}),
        encode_exception("throttlingException", "slow down"),
    ):
        (frame,) = FrameDecoder().feed(data)
        assert fast_event(frame) is None


def test_a_long_stream_of_deltas_parses_as_botocore_parses_it() -> None:
    rng = random.Random(7)
    texts = [
        "".join(rng.choice('ab \u00e9\u4e2d\U0001f600\\"\n') for _ in range(rng.randint(0, 9)))
        for _ in range(300)
    ]
    data = b"".join(
        encode_event("contentBlockDelta", {"contentBlockIndex": 1, "delta": {"text": t}, "p": "x" * (n % 7)})
        for n, t in enumerate(texts)
    )
    frames = FrameDecoder().feed(data)
    assert [fast_event(f) for f in frames] == [botocore_event(f) for f in frames]
    assert [e["contentBlockDelta"]["delta"]["text"] for e in map(fast_event, frames) if e] == texts


# -- the other events of every answer -------------------------------------------------------------

usage_values = st.integers(min_value=0, max_value=10**9) | json_values
plain_bodies = st.one_of(
    st.tuples(
        st.just("messageStart"),
        st.fixed_dictionaries({}, optional={"role": st.sampled_from(["assistant", "user"]) | json_values}),
    ),
    st.tuples(
        st.just("contentBlockStop"),
        st.fixed_dictionaries({}, optional={"contentBlockIndex": st.integers(0, 9) | json_values}),
    ),
    st.tuples(
        st.just("contentBlockStart"),
        st.fixed_dictionaries(
            {},
            optional={
                "contentBlockIndex": st.integers(0, 9),
                "start": st.just({"toolUse": {"toolUseId": "t1", "name": "calc"}}) | json_values,
            },
        ),
    ),
    st.tuples(
        st.just("messageStop"),
        st.fixed_dictionaries(
            {},
            optional={
                "stopReason": st.sampled_from(["end_turn", "tool_use", "max_tokens"]) | json_values,
                "additionalModelResponseFields": json_values,
            },
        ),
    ),
    st.tuples(
        st.just("metadata"),
        st.fixed_dictionaries(
            {},
            optional={
                "usage": st.dictionaries(
                    st.sampled_from(
                        ["inputTokens", "outputTokens", "totalTokens", "cacheReadInputTokens", "cacheDetails"]
                    ),
                    usage_values,
                    max_size=4,
                )
                | json_values,
                "metrics": st.fixed_dictionaries({"latencyMs": usage_values}) | json_values,
                "trace": st.just({"promptRouter": {"invokedModelId": "m"}})
                | st.just({"guardrail": {"actionReason": "r", "modelOutput": ["x"]}})
                | json_values,
                "performanceConfig": st.just({"latency": "optimized"}),
            },
        ),
    ),
    st.tuples(st.sampled_from(["unknownEvent", "contentBlockDelta"]), st.just({})),
).map(lambda kb: (kb[0], {**kb[1], "p": "abcdef"} if len(kb[1]) % 2 else kb[1]))


@pytest.mark.slow
@settings(max_examples=1000, deadline=None)
@given(plain_bodies)
def test_the_other_events_give_what_botocore_gives_or_are_left_to_it(kind_body: tuple[str, Any]) -> None:
    kind, body = kind_body
    (frame,) = FrameDecoder().feed(encode_event(kind, body))
    fast = plain_event(frame, PLANS)
    if fast is not None:
        assert fast == botocore_event(frame)


@pytest.mark.parametrize(
    ("kind", "body"),
    [
        ("messageStart", {"role": "assistant", "p": "abc"}),
        ("contentBlockStop", {"contentBlockIndex": 0}),
        ("messageStop", {"stopReason": "end_turn", "additionalModelResponseFields": {"a": [1, None]}}),
        (
            "metadata",
            {
                "usage": {"inputTokens": 12, "outputTokens": 3, "totalTokens": 15},
                "metrics": {"latencyMs": 420},
                "p": "abcdefgh",
            },
        ),
    ],
)
def test_every_answers_own_events_take_the_fast_path(kind: str, body: dict[str, Any]) -> None:
    (frame,) = FrameDecoder().feed(encode_event(kind, body))
    event = plain_event(frame, PLANS)
    assert event is not None
    assert event == botocore_event(frame)


@pytest.mark.parametrize(
    "data",
    [
        encode_event(
            "contentBlockStart",
            {"contentBlockIndex": 1, "start": {"toolUse": {"toolUseId": "a", "name": "b"}}},
        ),
        encode_event("metadata", {"usage": {"inputTokens": 1, "cacheDetails": [{"ttl": "5m"}]}}),
        encode_event("messageStart", []),
        encode_message(
            {":event-type": "messageStart", ":content-type": "application/json", ":message-type": "event"},
            b"not json",
        ),
        encode_exception("throttlingException", "slow down"),
        encode_event("contentBlockDelta", {"delta": {"text": "hi"}}),
    ],
)
def test_what_botocore_converts_or_raises_is_left_to_it(data: bytes) -> None:
    (frame,) = FrameDecoder().feed(data)
    assert plain_event(frame, PLANS) is None
