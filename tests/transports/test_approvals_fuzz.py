"""Property-based fuzzing of ``POST /sessions/{id}/approvals/{approval_id}`` (see test_fuzz.py).

Every example answers the pending approval of one waiting query with a fuzzed body (or names a
fuzzed approval id): the reply is 200 or the 4xx the oracle names, never a 5xx, and the log
loses nothing: its ids stay contiguous from 1, and at most one answer is ever logged, the one
the first 200 reported.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import pytest
from aiohttp.test_utils import TestClient
from hypothesis import event, example, given
from hypothesis import strategies as st

from tests.conftest import ClientFactory, services_of
from tests.support.sessions import new_session
from tests.transports.test_approvals import requests_of
from tests.transports.test_fuzz import (
    DEEP,
    FUZZ_SETTINGS,
    MALFORMED,
    MAX_BYTES,
    any_text,
    assert_clean_log,
    assert_error,
    contains_surrogate,
    encoded,
    fuzz,
    json_values,
    raw_bodies,
    url_text,
)
from tests.transports.test_sessions import send

pytestmark = pytest.mark.slow  # Hypothesis against the whole service

answers = st.fixed_dictionaries(
    {"approved": st.booleans() | json_values},
    optional={
        "reason": any_text | st.none() | json_values | st.just("r" * 2001),
        "input": st.dictionaries(any_text, json_values, max_size=3)
        | st.fixed_dictionaries({"expression": st.sampled_from(["1+1", "2*3"]) | json_values})
        | json_values,
        "extra": json_values,
    },
)
bodies = st.one_of(answers.map(encoded), json_values.map(encoded), raw_bodies)


class Waiting:
    """One query waiting on one approval, and what has been answered so far."""

    def __init__(self, client: TestClient, session_id: str, approval_id: str) -> None:
        self.client = client
        self.session_id = session_id
        self.approval_id = approval_id
        self.answered: bool | None = None


@pytest.fixture
async def waiting(make_client: ClientFactory, caplog: pytest.LogCaptureFixture) -> AsyncIterator[Waiting]:
    caplog.set_level(logging.WARNING)
    client = await make_client(**FUZZ_SETTINGS, tools_require_approval="calculator")
    session_id = await new_session(client)
    await send(client, session_id, "What is 6*7?")
    [request] = await requests_of(client, session_id)
    yield Waiting(client, session_id, request.approval_id)
    await services_of(client).runs.cancel(session_id)


def expected(raw: bytes, value: Any, state: Waiting, known: bool) -> set[int]:
    """The statuses an answer may get (``known``: to the approval that waits)."""
    shape = shape_error(raw, value)
    if not known:
        # A path the router does not take (an id with ``{``, say) is a 404 before the body is read.
        return (shape or set()) | {404}
    if shape is not None:
        return shape
    approved, edited = value["approved"], value.get("input")
    if state.answered is not None:
        return {200} if approved == state.answered else {409}
    if approved and edited is not None and not isinstance(edited.get("expression"), str):
        return {422}  # the calculator's input schema wants a string expression
    return {200}


def shape_error(raw: bytes, value: Any) -> set[int] | None:
    """The status of a body of the wrong shape; None for a well-formed answer."""
    if len(raw) > MAX_BYTES:
        return {413}
    if not raw.strip() or value is MALFORMED:
        return {400}
    if not isinstance(value, dict) or type(value.get("approved")) is not bool:
        return {422}
    reason, edited = value.get("reason"), value.get("input")
    if reason is not None and (
        not isinstance(reason, str) or len(reason) > 2000 or contains_surrogate(reason)
    ):
        return {422}
    if edited is not None and (not isinstance(edited, dict) or contains_surrogate(edited)):
        return {422}
    return None


@fuzz
@example(body=DEEP, other_id=None)
@example(body=encoded({"approved": True, "input": {"expression": 5}}), other_id=None)
@given(body=bodies, other_id=st.none() | url_text.filter(str.strip))
async def test_approval_bodies(
    waiting: Waiting, caplog: pytest.LogCaptureFixture, body: Any, other_id: str | None
) -> None:
    caplog.clear()
    client, raw, value = waiting.client, *body
    approval_id = waiting.approval_id if other_id is None else other_id
    allowed = expected(raw, value, waiting, known=other_id is None)
    path = f"/sessions/{waiting.session_id}/approvals/{quote(approval_id, safe='')}"
    async with client.post(path, data=raw, headers={"Content-Type": "application/json"}) as response:
        event(f"status {response.status}")
        if response.status == 200 and 200 in allowed:
            reply = await response.json()
            assert reply == {"approval_id": waiting.approval_id, "approved": value["approved"]}
            waiting.answered = value["approved"]
        else:
            await assert_error(response, allowed)
    session = await services_of(client).sessions.get(waiting.session_id)
    entries = await session.log.read(0)
    assert [entry.id for entry in entries] == list(range(1, len(entries) + 1))
    logged = [entry.event for entry in entries if entry.event.type == "tool_approval_response"]
    assert len(logged) == (waiting.answered is not None)
    if logged:
        assert logged[0].approved is waiting.answered  # type: ignore[union-attr]
    assert_clean_log(caplog)
