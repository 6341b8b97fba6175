"""jsonsafe.parse: pydantic's JSON parser where it reads the input, ``json.loads``'s answer everywhere."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.jsonsafe import parse
from service.providers.bedrock_events import _json as frame_json

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text()
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)


def outcome(read: Any, data: str | bytes) -> tuple[str, str]:
    """What ``read(data)`` gives, compared by repr (NaN equals itself), or the error's family."""
    try:
        return "ok", repr(read(data))
    except (ValueError, RecursionError):
        return "error", ""


@settings(max_examples=500, deadline=None)
@given(values, st.booleans(), st.booleans())
def test_what_json_writes_is_read_as_json_reads_it(value: Any, ascii_only: bool, as_bytes: bool) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only)
    data = text.encode() if as_bytes else text
    assert outcome(parse, data) == outcome(json.loads, data)


@settings(max_examples=1000, deadline=None)
@given(st.text(alphabet='{}[]",:0123456789.eE+-tfalsenuNIiy \\/u\t\nabc\x00\ud800é', max_size=30))
def test_anything_else_is_read_or_refused_as_json_reads_or_refuses_it(text: str) -> None:
    assert outcome(parse, text) == outcome(json.loads, text)
    try:
        data = text.encode()
    except UnicodeEncodeError:
        return
    assert outcome(parse, data) == outcome(json.loads, data)


@pytest.mark.parametrize(
    "data",
    [
        '{"a": "\\ud800"}',  # a lone surrogate: pydantic's parser refuses, json reads it
        b"\xef\xbb\xbf{}",  # a BOM on bytes: json reads it
        '{"a": 1, "a": 2}',
        "[" * 300 + "]" * 300,  # past pydantic's nesting limit, within json's
        '{"x": NaN, "y": -Infinity}',
        "1" * 5000,  # past Python's digit limit: both refuse
        '"\\u0000"',
        "{} x",
    ],
)
def test_the_edges_of_the_two_parsers(data: str | bytes) -> None:
    assert outcome(parse, data) == outcome(json.loads, data)


@settings(max_examples=300, deadline=None)
@given(values)
def test_a_frame_body_is_read_as_botocore_reads_it(value: Any) -> None:
    for payload in (json.dumps(value).encode(), json.dumps(value, ensure_ascii=False).encode()):
        assert outcome(frame_json, payload) == outcome(lambda p: json.loads(p.decode("utf-8")), payload)
    bom = b"\xef\xbb\xbf" + json.dumps(value).encode()
    assert outcome(frame_json, bom) == ("error", "")  # botocore decodes as UTF-8 and keeps the BOM


def test_nan_compares_by_repr() -> None:
    assert math.isnan(parse("NaN"))
