"""Property-based fuzzing of the bodies of ``POST /api/chat`` (AI SDK) and ``POST /ag-ui`` (AG-UI),
in the style of :mod:`tests.transports.test_fuzz`: never a 5xx, the status the contract names
(413 too large, 400 malformed, 422 the wrong shape, 200 a stream that ends properly), a JSON
``{"error"}`` body for each refusal, and nothing logged at ERROR.

Each example uses a chat id of its own unless it means to reuse one, so no query is already
running (a 409 is tested in test_protocols.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from itertools import count
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from hypothesis import event, example, given
from hypothesis import strategies as st

from tests.transports.test_agui_actions import ag_ui_status
from tests.transports.test_fuzz import (
    DEEP,
    MALFORMED,
    MAX_BYTES,
    MAX_CHARS,
    any_text,
    assert_error,
    encoded,
    finish,
    fuzz,
    fuzzed,  # noqa: F401 (the fixture)
    good_text,
    has_surrogate,
    json_values,
    long_text,
    raw_bodies,
    read_sse,
)

pytestmark = pytest.mark.slow  # Hypothesis against the whole service

_ids = count()
CHAT_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
ROLES = st.sampled_from(["user", "assistant", "system", "robot", "tool", ""]) | json_values
TEXTS = good_text | any_text | long_text | json_values


def fresh_id() -> str:
    return f"fz{next(_ids)}"


# -- /api/chat ------------------------------------------------------------------------------------

parts = (
    st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "file", "reasoning"]) | json_values, "text": TEXTS}
    )
    | json_values
)
ui_messages = st.fixed_dictionaries(
    {"role": ROLES, "parts": st.lists(parts, max_size=3) | json_values},
    optional={"id": any_text | json_values, "metadata": json_values},
)
good_chat = st.fixed_dictionaries(
    {
        "messages": st.lists(
            st.fixed_dictionaries(
                {
                    "id": st.just("u"),
                    "role": st.just("user"),
                    "parts": st.just([{"type": "text", "text": "hi"}]),
                }
            ),
            min_size=1,
            max_size=2,
        )
    }
)
chat_bodies = st.one_of(
    good_chat.map(encoded),
    st.fixed_dictionaries(
        {"messages": st.lists(ui_messages, max_size=3) | json_values},
        optional={
            "id": st.sampled_from(["", "a/b", "x" * 129, "ok-id"]) | any_text | json_values,
            "trigger": st.sampled_from(["submit-message", "regenerate-message", "other"]) | json_values,
            "messageId": any_text | json_values,
        },
    ).map(encoded),
    json_values.map(encoded),
    raw_bodies,
)


def chat_status(value: Any) -> int:
    """The status the AI SDK route gives a parsed body (its ``id`` aside, chosen by the test)."""
    if not isinstance(value, dict):
        return 422
    chat_id = value.get("id")
    if not isinstance(chat_id, str) or not CHAT_ID.fullmatch(chat_id):
        return 422
    if value.get("trigger", "submit-message") not in ("submit-message", "regenerate-message"):
        return 422
    if not isinstance(value.get("messageId", ""), str | None):
        return 422
    messages = value.get("messages")
    if not isinstance(messages, list) or not messages:
        return 422
    for message in messages:
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant", "system"):
            return 422
        if not isinstance(message.get("id", ""), str) or has_surrogate(message.get("id", "")):
            return 422
        if not isinstance(message.get("parts"), list) or not all(
            isinstance(p, dict) for p in message["parts"]
        ):
            return 422
    last = messages[-1]
    if last["role"] != "user":
        return 422
    text = "".join(
        p["text"] for p in last["parts"] if p.get("type") == "text" and isinstance(p.get("text"), str)
    )
    if not text.strip() or has_surrogate(text) or len(text) > MAX_CHARS:
        return 422
    if value.get("trigger") == "regenerate-message" or isinstance(value.get("messageId"), str):
        # An answer to give again, or a message to edit: a fresh chat holds none.
        return 404
    return 200


def prepared(body: Any, keep_id: bool, id_key: str, status: Callable[[Any], int]) -> tuple[bytes, int]:
    """The body to send (with a fresh session id unless the example keeps its own) and the
    status it must get."""
    raw, value = body
    if isinstance(value, dict) and (not keep_id or id_key not in value):
        value = {**value, id_key: fresh_id()}
        raw = json.dumps(value).encode()
    if len(raw) > MAX_BYTES:
        return raw, 413
    if not raw.strip() or value is MALFORMED:
        return raw, 400
    return raw, status(value)


@fuzz
@example(body=DEEP, keep_id=False)
@given(body=chat_bodies, keep_id=st.booleans())
async def test_chat_bodies(
    fuzzed: TestClient,  # noqa: F811 (the fixture imported above)
    caplog: pytest.LogCaptureFixture,
    body: Any,
    keep_id: bool,  # noqa: F811
) -> None:
    caplog.clear()
    raw, expected = prepared(body, keep_id, "id", chat_status)
    async with fuzzed.post("/api/chat", data=raw, headers={"Content-Type": "application/json"}) as response:
        event(f"status {response.status}")
        if response.status == 200 and (expected == 200 or (expected == 404 and keep_id)):
            # (A chat id kept from an earlier example may hold the message a 404 was for.)
            text = await response.text()
            assert text.rstrip().endswith("data: [DONE]"), text[-200:]
            assert '"type":"finish"' in text
        else:
            await assert_error(response, {expected})
    await finish(fuzzed, caplog)


# -- /ag-ui ---------------------------------------------------------------------------------------

ag_messages = (
    st.fixed_dictionaries(
        {"role": ROLES, "content": TEXTS},
        optional={"id": any_text | json_values, "toolCallId": any_text, "name": any_text},
    )
    | json_values
)
ag_bodies = st.one_of(
    st.fixed_dictionaries(
        {"runId": any_text, "messages": st.lists(ag_messages, max_size=3) | json_values},
        optional={
            "threadId": st.sampled_from(["", "a b", "x" * 129, "ok"]) | any_text | json_values,
            "tools": st.just([]) | json_values,
            "context": st.just([]) | json_values,
            "state": json_values,
            "forwardedProps": json_values,
        },
    ).map(encoded),
    st.fixed_dictionaries(
        {"runId": st.just("r"), "messages": st.just([{"id": "u", "role": "user", "content": "hi"}])}
    ).map(encoded),
    json_values.map(encoded),
    raw_bodies,
)


@fuzz
@example(body=DEEP, keep_id=False)
@example(
    body=encoded({"runId": "\ud800", "messages": [{"id": "u", "role": "user", "content": "hi"}]}),
    keep_id=False,
)
@given(body=ag_bodies, keep_id=st.booleans())
async def test_ag_ui_bodies(
    fuzzed: TestClient,  # noqa: F811 (the fixture imported above)
    caplog: pytest.LogCaptureFixture,
    body: Any,
    keep_id: bool,  # noqa: F811
) -> None:
    caplog.clear()
    raw, expected = prepared(body, keep_id, "threadId", ag_ui_status)
    async with fuzzed.post("/ag-ui", data=raw, headers={"Content-Type": "application/json"}) as response:
        event(f"status {response.status}")
        if response.status == 200 and expected == 200:
            events = [item["data"]["type"] for item in await read_sse(response)]
            assert events[0] == "RUN_STARTED" and events[-1] == "RUN_FINISHED", events
        else:
            await assert_error(response, {expected})
    await finish(fuzzed, caplog)
