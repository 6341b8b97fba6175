"""jsonsafe.parse: pydantic's JSON parser where it reads the input, ``json.loads``'s answer
everywhere, with NaN and Infinity refused on both paths; jsonsafe.loads also refuses a number
too large for a float; jsonsafe.dumps writes strict JSON."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.jsonsafe import NonFiniteNumber, dumps, loads, parse, strict_loads
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


def refuse(name: str) -> Any:
    raise ValueError(name)


def reference(data: str | bytes) -> Any:
    """What parse must give, written independently of the service's: json.loads refusing the
    constants NaN, Infinity and -Infinity."""
    return json.loads(data, parse_constant=refuse)


def strict_reference(data: str | bytes) -> Any:
    """What loads must give (nesting apart): the same, refusing any float that is not finite."""
    value = reference(data)
    if not _finite(value):
        raise ValueError("not finite")
    return value


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(item) for item in value.values())
    if isinstance(value, list):
        return all(_finite(item) for item in value)
    return True


@pytest.mark.slow
@settings(max_examples=500, deadline=None)
@given(values, st.booleans(), st.booleans())
def test_what_json_writes_is_read_as_json_reads_it(value: Any, ascii_only: bool, as_bytes: bool) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only)
    data = text.encode() if as_bytes else text
    assert outcome(parse, data) == outcome(reference, data)
    assert outcome(loads, data) == outcome(strict_reference, data)
    if _finite(value):
        assert outcome(parse, data) == outcome(json.loads, data)  # strict JSON: read as ever


@pytest.mark.slow
@settings(max_examples=1000, deadline=None)
@given(st.text(alphabet='{}[]",:0123456789.eE+-tfalsenuNIiy \\/u\t\nabc\x00\ud800é', max_size=30))
def test_anything_else_is_read_or_refused_as_json_reads_or_refuses_it(text: str) -> None:
    assert outcome(parse, text) == outcome(reference, text)
    assert outcome(loads, text) == outcome(strict_reference, text)
    try:
        data = text.encode()
    except UnicodeEncodeError:
        return
    assert outcome(parse, data) == outcome(reference, data)
    assert outcome(loads, data) == outcome(strict_reference, data)


@pytest.mark.parametrize(
    "data",
    [
        '{"a": "\\ud800"}',  # a lone surrogate: pydantic's parser refuses, json reads it
        b"\xef\xbb\xbf{}",  # a BOM on bytes: json reads it
        '{"a": 1, "a": 2}',
        "[" * 300 + "]" * 300,  # past pydantic's nesting limit, within json's
        '{"x": NaN, "y": -Infinity}',
        "[Infinity]",
        '{"x": 1e400}',
        "-1E+400",
        "1" * 250 + ".5",
        "1" * 199 + "e99",  # finite: the largest that needs no look at its floats
        "1e308",
        "1e-400",  # underflows to 0.0: finite, read as json reads it
        '"1e400 and NaN in a string"',
        b'{"x": [1, {"y": 1e999}]}',
        "1" * 5000,  # past Python's digit limit: both refuse
        '"\\u0000"',
        "{} x",
    ],
)
def test_the_edges_of_the_two_parsers(data: str | bytes) -> None:
    assert outcome(parse, data) == outcome(reference, data) == outcome(strict_loads, data)
    if "[" * 300 not in str(data):  # past loads's nesting bound
        assert outcome(loads, data) == outcome(strict_reference, data)


@pytest.mark.parametrize("data", ["NaN", '{"x": Infinity}', "[-Infinity]", b"[-Infinity]"])
def test_nan_and_infinity_are_refused_with_a_clear_error(data: str | bytes) -> None:
    with pytest.raises(NonFiniteNumber, match="Infinity is not a JSON number|NaN is not a JSON number"):
        parse(data)
    with pytest.raises(NonFiniteNumber):
        loads(data)


@pytest.mark.parametrize("data", ['{"x": 1e400}', b"[1E999]", "-" + "9" * 400 + ".0"])
def test_a_number_too_large_is_refused_by_loads(data: str | bytes) -> None:
    assert not _finite(parse(data))  # as json.loads reads it: parse leaves the walk to loads
    with pytest.raises(NonFiniteNumber, match="too large for a float"):
        loads(data)
    assert loads(data, finite_only=False) == parse(data)


def test_what_is_written_is_strict() -> None:
    # The service's one codec writes compact JSON, as json.dumps does with these separators.
    assert dumps({"x": [1.5, 1e308]}) == json.dumps({"x": [1.5, 1e308]}, separators=(",", ":"))
    for value in (math.nan, math.inf, -math.inf):
        with pytest.raises(ValueError):
            dumps({"x": [value]})


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(values)
def test_a_frame_body_is_read_as_botocore_reads_it(value: Any) -> None:
    """Strict JSON as botocore reads it; what is not strict is refused, which leaves that frame
    to botocore's own parser (the stream parsers fall back to it)."""
    botocore = outcome(lambda p: json.loads(p.decode("utf-8")), json.dumps(value).encode())
    for payload in (json.dumps(value).encode(), json.dumps(value, ensure_ascii=False).encode()):
        if _finite(value):
            assert outcome(frame_json, payload) == botocore
        else:
            assert outcome(frame_json, payload) == ("error", "")
    bom = b"\xef\xbb\xbf" + json.dumps(value).encode()
    assert outcome(frame_json, bom) == ("error", "")  # botocore decodes as UTF-8 and keeps the BOM


def test_nan_compares_by_repr() -> None:
    assert math.isnan(json.loads("NaN"))
    assert outcome(json.loads, "NaN") == outcome(json.loads, "NaN")
