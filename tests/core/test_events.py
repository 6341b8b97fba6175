"""The per-token event maker: the same event as pydantic's constructor makes, with one shared set
of field names that nothing can change."""

from __future__ import annotations

import gc

import pytest
from pydantic import ValidationError

from service.core.events import EVENT_ADAPTER, TextDelta, text_delta


def test_a_text_delta_is_the_event_the_constructor_makes() -> None:
    made, validated = text_delta("héllo", 2), TextDelta(text="héllo", turn=2)
    assert made == validated
    assert made.model_fields_set == validated.model_fields_set == {"text", "turn"}
    assert made.model_dump_json() == validated.model_dump_json()
    assert EVENT_ADAPTER.validate_json(made.model_dump_json()) == made


def test_text_deltas_share_their_field_names_and_nothing_changes_them() -> None:
    first, second = text_delta("a", 1), text_delta("b", 1)
    assert first.model_fields_set is second.model_fields_set
    copied = first.model_copy(update={"text": "c"})
    assert copied.text == "c" and first.text == "a"
    with pytest.raises(ValidationError):
        first.text = "d"  # type: ignore[misc]  # frozen
    assert second.model_fields_set == {"text", "turn"}


def test_a_text_delta_leaves_the_collector_one_object() -> None:
    made = text_delta("a", 1)
    assert gc.is_tracked(made)
    assert not gc.is_tracked(made.__dict__)  # strings and an int: the collector skips it
    assert made.model_fields_set is text_delta("b", 3).model_fields_set  # one set for every event
