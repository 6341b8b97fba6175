"""Property-based fuzzing of ``POST /v1/chat/completions`` bodies (Hypothesis).

As in test_fuzz.py: never a 500, the status the oracle names with OpenAI's error shape
(``{"error": {"message", "type", "code", "param"}}``), nothing logged at ERROR, no task lost.
The oracle is exact where the rule is simple (a body that is no JSON object, no messages, an
unknown role, a last message that is not the user's, too large, too long, a lone surrogate, an
unknown model) and allows 200 or 400 where only the details of a message's content decide.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from hypothesis import event, example, given
from hypothesis import strategies as st

from tests.conftest import sse_blocks
from tests.transports.test_fuzz import (  # noqa: F401 - the fixture is used by name
    DEEP,
    MALFORMED,
    MAX_BYTES,
    MAX_CHARS,
    WAIT_S,
    any_text,
    assert_clean_log,
    blank_text,
    contains_surrogate,
    encoded,
    finish,
    fuzz,
    fuzzed,
    good_text,
    json_values,
    long_text,
    raw_bodies,
)

pytestmark = pytest.mark.slow  # Hypothesis against the whole service

MODEL = "us.anthropic.claude-3-5-haiku-20241022-v1:0"  # the test settings' model (the default)
ROLES = ("system", "developer", "user", "assistant", "tool")

user_message = st.fixed_dictionaries({"role": st.just("user"), "content": good_text})
system_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "developer"]), "content": good_text}
)
assistant_message = st.fixed_dictionaries({"role": st.just("assistant"), "content": good_text})
valid_messages = st.tuples(
    st.lists(st.one_of(system_message, user_message, assistant_message), max_size=3), user_message
).map(lambda parts: [*parts[0], parts[1]])
tool = st.fixed_dictionaries(
    {
        "type": st.just("function"),
        "function": st.fixed_dictionaries(
            {"name": st.from_regex(r"[a-z_]{1,12}", fullmatch=True)},
            optional={"description": good_text, "parameters": st.just({"type": "object"})},
        ),
    }
)
valid_bodies = st.fixed_dictionaries(
    {"model": st.just(MODEL), "messages": valid_messages},
    optional={
        "stream": st.booleans(),
        "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans()}),
        "tools": st.lists(tool, max_size=2, unique_by=lambda t: t["function"]["name"]),
        "temperature": st.floats(0, 2),
        "max_tokens": st.integers(1, 50),
    },
)
any_message = st.one_of(
    st.fixed_dictionaries(
        {"role": st.sampled_from(ROLES) | any_text},
        optional={
            "content": any_text | blank_text | long_text | json_values,
            "tool_call_id": any_text,
            "tool_calls": json_values,
        },
    ),
    json_values,
)
wrong_bodies = st.fixed_dictionaries(
    {},
    optional={
        "model": st.just(MODEL) | any_text | json_values,
        "messages": st.lists(any_message, max_size=3) | json_values,
        "stream": st.booleans() | json_values,
        "n": st.integers(0, 3) | json_values,
        "tools": json_values,
    },
)
chat_bodies = st.one_of(
    valid_bodies.map(encoded),
    wrong_bodies.map(encoded),
    st.dictionaries(any_text, json_values, max_size=3).map(encoded),
    raw_bodies,
)


def text_of(content: Any) -> str | None:
    return content if isinstance(content, str) else None


def expect(raw: bytes, value: Any) -> set[int]:
    """The statuses a body may get."""
    if len(raw) > MAX_BYTES:
        return {413}
    if value is MALFORMED or not raw.strip() or not isinstance(value, dict):
        return {400}
    if contains_surrogate(value):
        return {400}
    messages, model = value.get("messages"), value.get("model")
    if not isinstance(model, str) or not model or not isinstance(messages, list) or not messages:
        return {400}
    if any(not isinstance(m, dict) or m.get("role") not in ROLES for m in messages):
        return {400}
    last = messages[-1]
    if last["role"] not in {"user", "tool"}:
        return {400}
    # What is left depends on each message's content; and a well-formed body for another model is a 404.
    allowed = {200, 400} if model == MODEL else {400, 404}
    text = text_of(last.get("content"))
    if last["role"] == "user" and text is not None and text.strip() and len(text) > MAX_CHARS:
        allowed.discard(200)
    return allowed


async def assert_openai_error(response: Any, allowed: set[int]) -> None:
    text = await response.text()
    assert response.status in allowed, (response.status, text)
    assert response.content_type == "application/json", text
    error = json.loads(text)["error"]
    assert isinstance(error["message"], str) and error["message"], error
    assert error["type"] == "invalid_request_error", error
    assert set(error) >= {"message", "type", "code", "param"}, error


@fuzz
@example(body=DEEP)
@example(body=encoded({"model": MODEL, "messages": [{"role": "user", "content": "x" * (MAX_CHARS + 1)}]}))
@example(body=encoded({"model": MODEL, "messages": [{"role": "user", "content": "hi\ud800"}]}))
@example(body=encoded({"model": "other", "messages": [{"role": "user", "content": "hi"}]}))
@given(body=chat_bodies)
async def test_chat_completion_bodies(
    fuzzed: TestClient,  # noqa: F811 - the fixture
    caplog: pytest.LogCaptureFixture,
    body: Any,
) -> None:
    caplog.clear()
    raw, value = body
    expected = expect(raw, value)
    async with fuzzed.post(
        "/v1/chat/completions", data=raw, headers={"Content-Type": "application/json"}
    ) as response:
        event(f"status {response.status}")
        if response.status == 200 and 200 in expected:
            if value.get("stream") is True:
                async with asyncio.timeout(WAIT_S):
                    blocks = [block async for block in sse_blocks(response)]
                assert blocks[-1]["data"] == "[DONE]", blocks[-2:]
                assert all(json.loads(b["data"])["object"] == "chat.completion.chunk" for b in blocks[:-1])
            else:
                reply = await response.json()
                assert reply["object"] == "chat.completion" and reply["choices"][0]["finish_reason"], reply
        else:
            await assert_openai_error(response, expected - {200})
    await finish(fuzzed, caplog)
    assert_clean_log(caplog)
