"""The upstream JSON reader: nesting beyond the limit is a ValueError, like any malformed JSON."""

from __future__ import annotations

import pytest

from service.providers.upstream_json import MAX_DEPTH, loads


def nested(depth: int, open_: str = "[", close: str = "]") -> str:
    return open_ * depth + close * depth


def test_up_to_the_limit_parses() -> None:
    assert loads(nested(MAX_DEPTH)) == loads(nested(MAX_DEPTH).encode())
    assert loads('{"a":' * MAX_DEPTH + "1" + "}" * MAX_DEPTH) is not None


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 500, 5000, 100_000])
def test_deeper_is_a_value_error(depth: int) -> None:
    for text in (nested(depth), '{"a":' * depth + "1" + "}" * depth):
        with pytest.raises(ValueError, match=f"nested more than {MAX_DEPTH} levels deep"):
            loads(text)
        with pytest.raises(ValueError, match="nested"):
            loads(text.encode())


def test_unclosed_nesting_is_a_value_error_at_any_depth() -> None:
    for depth in (MAX_DEPTH + 1, 5000):
        with pytest.raises(ValueError):
            loads('{"a":' * depth)


def test_brackets_inside_strings_and_wide_arrays_are_not_depth() -> None:
    assert loads('["' + "[{" * 500 + '"]') == ["[{" * 500]
    assert loads("[" + ",".join(["[]"] * 1000) + "]") == [[]] * 1000


def test_other_bad_json_is_the_usual_value_error() -> None:
    with pytest.raises(ValueError, match="Expecting value"):
        loads('{"a": ')
