"""The dialects' straight paths for text deltas write the very bytes the general ones do."""

from __future__ import annotations

import json

import pytest

from service.core.events import TextDelta
from service.core.log import LogEntry
from service.jsonsafe import dumps
from service.transports.native import dialects
from service.transports.stream import session
from service.transports.stream.frames import sse_block

TEXTS = [
    "plain",
    "",
    'a "quote", a \\ backslash and a /slash',
    "line\nbreak, tab\t, NUL \x00 and \x1f",
    "héllo ✓ 😀 日本",
    "\u2028\u2029 and a lone surrogate \ud800",
    "</script>",
]


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("ts", [1732467890.1234567, 1732467890.0, 1700000000, 0.5])
def test_a_text_delta_is_written_as_the_general_path_writes_it(text: str, ts: float) -> None:
    entry = LogEntry(42, TextDelta(text=text), 100, ts)
    name, data = session.session_frame(entry)
    assert (name, data) == ("assistant_text", dumps(session.session_payload(entry)))
    assert json.loads(data) == {"type": "assistant_text", "text": text, "id": 42, "ts": round(ts, 6)}
    block = dialects.agent_block(entry.event)
    assert block == sse_block(dumps(dialects.agent(entry.event)))


def test_an_event_the_agent_dialect_does_not_show_has_no_block() -> None:
    from service.core.events import StatusChange

    assert dialects.agent_block(StatusChange(status="running")) is None
