"""Property-based fuzzing of every client input: the JSON bodies, the query parameters, the
``Last-Event-ID`` header and the WebSocket messages.

Every example checks that the service never answers 500; that a bad input gets the status the
contract names (../shared/DESIGN.md) with a JSON ``{"error": str}`` body; that nothing is logged at
ERROR (an unhandled exception) and asyncio reports no "Task exception was never retrieved" or
"Task was destroyed but it is pending"; and that a WebSocket answers a ping after any bad message
unless it was closed with a proper close code (1003 binary, 1009 too big).

The expected statuses come from a small oracle per input: an integer parameter is ASCII digits
(not ``" 5"``, ``"+5"``, ``"1_0"`` or other scripts' digits), ``max_turns`` a JSON integer (``3.0``
is one, as JSON Schema has it; ``true`` and ``"3"`` are not). Queries run on the emulator with the test settings (no pacing), so
each one is over in milliseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import math
import re
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
from aiohttp import WSMsgType
from aiohttp.test_utils import TestClient
from hypothesis import HealthCheck, assume, event, example, given, settings
from hypothesis import strategies as st

from service.transports.edge.inputs import holds_nul
from tests.conftest import SESSION_ROUTES, ClientFactory, services_of, sse_events

pytestmark = pytest.mark.slow  # Hypothesis against the whole service

MAX_CHARS = 200  # AGENT_MAX_MESSAGE_CHARS for these tests: long texts stay cheap
MAX_BYTES = 4096  # AGENT_MAX_REQUEST_BYTES
WS_MAX_BYTES = 8192  # AGENT_WS_MAX_MESSAGE_BYTES
FUZZ_SETTINGS: dict[str, Any] = {
    "max_message_chars": MAX_CHARS,
    "max_request_bytes": MAX_BYTES,
    "ws_max_message_bytes": WS_MAX_BYTES,
    # Quotas off: hundreds of requests a minute from one (anonymous) owner is the point here.
    "quota_streams": 0,
    "quota_runs": 0,
    "quota_requests_per_minute": 0,
    "quota_tokens_per_day": 0,
}
WAIT_S = 10.0
WS_WAIT_S = 3.0  # a pong takes milliseconds; a failing example should not take long

fuzz = settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# -- strategies --------------------------------------------------------------------------------

# Text as JSON can carry it: any code point, lone surrogates too (escaped by json.dumps).
# (st.text would drop the surrogates, whatever alphabet it is given.)
any_text = st.lists(st.characters() | st.characters(categories=["Cs"]), max_size=24).map("".join)
# Text a URL or a query can carry (no surrogates).
url_text = st.text(st.characters(codec="utf-8"), max_size=24)
good_text = st.text(st.characters(codec="utf-8"), min_size=1, max_size=40).filter(str.strip)
long_text = st.integers(MAX_CHARS + 1, MAX_CHARS + 50).map(lambda n: "x" * n)
blank_text = st.text(st.sampled_from(" \t\n\r\x0b\x0c\u00a0\u2003"), max_size=5)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | any_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(any_text, inner, max_size=4),
    max_leaves=10,
)
max_turns_values = (
    st.integers(1, 3)
    | st.none()
    | st.integers(-3, 200)
    | st.sampled_from([2.0, 2.5, True, "2"])
    | json_values
)

MALFORMED = object()  # the oracle's "strict_json fails" (or nests too deeply)


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (math.inf, -math.inf):
        raise ValueError(f"{text} is too large for a float")
    return value


def strict_json(text: str | bytes) -> Any:
    """``text`` read as strict JSON (RFC 8259, as a browser reads it): no NaN, no Infinity, no
    number too large for a float. The oracle reads client input so, and the checks read every
    answer so: the service must never write what a strict parser refuses."""
    return json.loads(text, parse_constant=_not_json, parse_float=_finite_float)


def parsed(raw: bytes) -> Any:
    try:
        return strict_json(raw)
    except (ValueError, RecursionError):
        return MALFORMED


def encoded(value: Any) -> tuple[bytes, Any]:
    raw = json.dumps(value).encode()
    return raw, parsed(raw)  # as the service reads it: an escaped surrogate pair is one character


def raw_body(raw: bytes) -> tuple[bytes, Any]:
    return raw, parsed(raw)


DEEP = raw_body(b'{"a":' + b"[" * 5000)  # json.loads: RecursionError
raw_bodies = st.one_of(
    st.binary(max_size=40),
    st.sampled_from(
        [b"", b"   ", b"\n", b"{", b'{"a":', b"nul", b"\xff\xfe", b"[" * 5000, b'{"a":' + b"[" * 3000]
    ),
    st.just(b'{"x": "' + b"y" * MAX_BYTES + b'"}'),  # over AGENT_MAX_REQUEST_BYTES
).map(raw_body)


def query_bodies(field: str) -> st.SearchStrategy[tuple[bytes, Any]]:
    """Bodies of ``POST /agent/*`` (``message``) and ``/sessions/{id}/messages`` (``content``)."""
    valid = st.fixed_dictionaries({field: good_text}, optional={"max_turns": st.integers(1, 3) | st.none()})
    wrong = st.fixed_dictionaries(
        {field: any_text | blank_text | long_text | json_values},
        optional={"max_turns": max_turns_values, "extra": json_values},
    )
    shapes = st.dictionaries(any_text, json_values, max_size=3) | json_values
    return st.one_of(valid.map(encoded), wrong.map(encoded), shapes.map(encoded), raw_bodies)


def has_surrogate(text: str) -> bool:
    return any(0xD800 <= ord(char) <= 0xDFFF for char in text)


def contains_surrogate(value: Any) -> bool:
    if isinstance(value, str):
        return has_surrogate(value)
    if isinstance(value, dict):
        return any(contains_surrogate(key) or contains_surrogate(item) for key, item in value.items())
    if isinstance(value, list):
        return any(contains_surrogate(item) for item in value)
    return False


def expect_query_body(raw: bytes, value: Any, field: str, ok: int) -> set[int]:
    """The statuses a query body may get."""
    if len(raw) > MAX_BYTES:
        return {413}
    if not raw.strip():
        return {400}
    if value is MALFORMED:
        return {400}
    if not isinstance(value, dict) or holds_nul(value):
        return {422}  # not an object, or U+0000 anywhere in it
    text, turns = value.get(field), value.get("max_turns")
    if not isinstance(text, str) or not text.strip() or has_surrogate(text) or len(text) > MAX_CHARS:
        return {422}
    integral = type(turns) is int or (type(turns) is float and turns.is_integer())
    if turns is None or (integral and 1 <= turns <= 100):
        return {ok}
    return {422}  # a JSON integer only (3.0 is one, as JSON Schema has it): not true or "3"


ASCII_INT = re.compile(r"-?[0-9]+")
int_params = st.one_of(
    st.integers(-5, 40).map(str),
    st.integers().map(str),
    st.sampled_from(["", " ", "1.5", "1e3", "0x10", "+3", " 7 ", "1_0", "٣", "NaN", "9" * 5000, "-0"]),
    url_text,
)


def value_of(raw: str) -> int | None:
    """An integer parameter's value: ASCII digits only (not " 5", "+5", "1_0" or "٣")."""
    if not ASCII_INT.fullmatch(raw):
        return None
    try:
        return int(raw)
    except ValueError:  # past Python's 4300 digits
        return None


def int_outcome(raw: str | None, minimum: int = 0) -> str:
    """``absent``, ``valid`` (an integer at least ``minimum``) or ``invalid``."""
    if raw is None:
        return "absent"
    value = value_of(raw)
    return "valid" if value is not None and value >= minimum else "invalid"


# -- checks ------------------------------------------------------------------------------------

BAD_LOG_TEXT = ("Task exception was never retrieved", "Task was destroyed but it is pending")


def assert_clean_log(caplog: pytest.LogCaptureFixture) -> None:
    """Nothing logged at ERROR, and no task lost or failed unseen."""
    bad = [
        record
        for record in caplog.records
        if record.levelno >= logging.ERROR or any(text in record.getMessage() for text in BAD_LOG_TEXT)
    ]
    assert not bad, "\n".join(f"{r.name}: {r.getMessage()}" for r in bad)


async def assert_error(response: aiohttp.ClientResponse, allowed: set[int]) -> None:
    """A 4xx from ``allowed`` (never a 5xx) with a JSON ``{"error": str}`` body."""
    text = await response.text()
    assert response.status in allowed, (response.status, text)
    assert response.status < 500, text
    assert response.content_type == "application/json", text
    if response.status == 405:
        assert response.headers.get("Allow"), "a 405 names the methods the path takes"
    body = strict_json(text)
    assert isinstance(body, dict) and isinstance(body.get("error"), str) and body["error"], body


async def read_sse(response: aiohttp.ClientResponse) -> list[dict[str, Any]]:
    assert response.content_type == "text/event-stream"
    async with asyncio.timeout(WAIT_S):
        return [event async for event in sse_events(response)]


async def new_session(client: TestClient, query: str | None = None) -> str:
    async with client.post("/sessions") as response:
        assert response.status == 201
        session_id = (await response.json())["id"]
    if query is not None:
        async with client.get(f"/sessions/{session_id}/stream", params={"query": query}) as response:
            assert response.status == 200
            await read_sse(response)
    return session_id


async def finish(client: TestClient, caplog: pytest.LogCaptureFixture) -> None:
    """After an example that started queries: every run over, nothing logged at ERROR."""
    async with asyncio.timeout(WAIT_S):
        await services_of(client).runs.wait_idle()
    assert_clean_log(caplog)


@pytest.fixture
async def fuzzed(make_client: ClientFactory, caplog: pytest.LogCaptureFixture) -> AsyncIterator[TestClient]:
    """The service with small limits and no quotas; afterwards, with every run over, no task
    that failed or was dropped unseen (asyncio says so when they are collected)."""
    caplog.set_level(logging.WARNING)
    client = await make_client(**FUZZ_SETTINGS)
    yield client
    async with asyncio.timeout(WAIT_S):
        await services_of(client).runs.wait_idle()
    gc.collect()
    await asyncio.sleep(0)
    assert_clean_log(caplog)


# -- JSON bodies -------------------------------------------------------------------------------


@fuzz
@example(body=DEEP)
@given(body=query_bodies("message"))
async def test_agent_run_bodies(fuzzed: TestClient, caplog: pytest.LogCaptureFixture, body: Any) -> None:
    caplog.clear()
    raw, value = body
    expected = expect_query_body(raw, value, "message", 200)
    async with fuzzed.post("/agent/run", data=raw, headers={"Content-Type": "application/json"}) as response:
        event(f"status {response.status}")
        if response.status == 200 and 200 in expected:
            reply = await response.json()
            assert isinstance(reply["response"], str) and reply["turns"] >= 1, reply
            assert set(reply["usage"]) == {"input_tokens", "output_tokens", "total_tokens"}
        else:
            await assert_error(response, expected)
    assert_clean_log(caplog)


@fuzz
@example(body=DEEP)
@given(body=query_bodies("message"))
async def test_agent_stream_bodies(fuzzed: TestClient, caplog: pytest.LogCaptureFixture, body: Any) -> None:
    caplog.clear()
    raw, value = body
    expected = expect_query_body(raw, value, "message", 200)
    async with fuzzed.post(
        "/agent/stream", data=raw, headers={"Content-Type": "application/json"}
    ) as response:
        if response.status == 200 and 200 in expected:
            events = [event["data"] for event in await read_sse(response)]
            assert events and events[-1]["type"] == "done", events[-3:]
        else:
            await assert_error(response, expected)
    await finish(fuzzed, caplog)


@fuzz
@example(body=DEEP)
@given(
    body=st.one_of(json_values.map(encoded), st.dictionaries(any_text, json_values).map(encoded), raw_bodies)
)
async def test_create_session_bodies(fuzzed: TestClient, caplog: pytest.LogCaptureFixture, body: Any) -> None:
    caplog.clear()
    raw, value = body
    if len(raw) > MAX_BYTES:
        expected = {413}
    elif isinstance(value, dict) and holds_nul(value):
        expected = {422}  # U+0000 is refused in any body, even one whose content is not used
    elif not raw or isinstance(value, dict):
        expected = {201}  # no body at all stands for the defaults; a blank one is not JSON
    elif not raw.strip():
        expected = {400}
    else:
        expected = {400} if value is MALFORMED else {422}
    async with fuzzed.post("/sessions", data=raw) as response:
        event(f"status {response.status}")
        if response.status == 201 and 201 in expected:
            reply = await response.json()
            assert reply["status"] == "idle" and isinstance(reply["id"], str)
            async with fuzzed.delete(f"/sessions/{reply['id']}") as deleted:
                assert deleted.status == 204
        else:
            await assert_error(response, expected)
    assert_clean_log(caplog)


@fuzz
@example(body=DEEP)
@given(body=query_bodies("content"))
async def test_message_bodies(fuzzed: TestClient, caplog: pytest.LogCaptureFixture, body: Any) -> None:
    caplog.clear()
    raw, value = body
    expected = expect_query_body(raw, value, "content", 202)
    session_id = await new_session(fuzzed)
    async with fuzzed.post(f"/sessions/{session_id}/messages", data=raw) as response:
        event(f"status {response.status}")
        if response.status == 202 and 202 in expected:
            reply = await response.json()
            assert reply["id"] == session_id and reply["after_id"] == 0
            async with fuzzed.get(f"/sessions/{session_id}/events", headers={"Last-Event-ID": "0"}) as events:
                assert (await read_sse(events))[-1]["event"] == "done"
        else:
            await assert_error(response, expected)
    async with fuzzed.delete(f"/sessions/{session_id}") as deleted:
        assert deleted.status == 204
    await finish(fuzzed, caplog)


@fuzz
@given(session_id=url_text, route=st.sampled_from(SESSION_ROUTES), body=json_values)
async def test_unknown_session_ids(
    fuzzed: TestClient, caplog: pytest.LogCaptureFixture, session_id: str, route: tuple[str, str], body: Any
) -> None:
    caplog.clear()
    method, rest = route
    path = f"/sessions/{quote(session_id, safe='')}{rest}"
    async with fuzzed.request(method, path, json=body) as response:
        event(f"status {response.status}")
        # No such session, or (an id such as "." or "..") a path the router resolves elsewhere.
        await assert_error(response, {404, 405})
    assert_clean_log(caplog)


# -- query parameters and Last-Event-ID ------------------------------------------------------------


@pytest.fixture
async def answered(fuzzed: TestClient) -> tuple[str, int]:
    """A session with one finished query: its id and last event id."""
    session_id = await new_session(fuzzed, "What is 6 * 7?")
    async with fuzzed.get(f"/sessions/{session_id}") as response:
        return session_id, (await response.json())["last_event_id"]


@fuzz
@given(since=st.none() | int_params, limit=st.none() | int_params)
async def test_poll_parameters(
    fuzzed: TestClient,
    caplog: pytest.LogCaptureFixture,
    answered: tuple[str, int],
    since: str | None,
    limit: str | None,
) -> None:
    # Within aiohttp's request-line limit (8190 bytes; past it aiohttp's own parser answers).
    assume(len(since or "") + len(limit or "") < 6000)
    caplog.clear()
    session_id, last = answered
    params = {name: value for name, value in (("since_index", since), ("limit", limit)) if value is not None}
    outcomes = {int_outcome(since), int_outcome(limit, minimum=1)}
    if "invalid" in outcomes:
        expected = {400}
    else:
        expected = {400} if since is not None and int(since) > last else {200}
    async with fuzzed.get(f"/sessions/{session_id}/events/poll", params=params) as response:
        event(f"status {response.status}")
        if response.status == 200 and 200 in expected:
            body = await response.json()
            start = (value_of(since) or 0) if since is not None else 0
            ids = [event["id"] for event in body["events"]]
            assert ids == list(range(start + 1, start + 1 + len(ids))), ids
            assert body["next_index"] == (ids[-1] if ids else start) and body["last_id"] == last
            if limit is None:
                assert len(ids) == last - start
        else:
            await assert_error(response, expected)
    assert_clean_log(caplog)


header_values = st.one_of(
    st.integers(-3, 60).map(str),
    st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=12),
    st.sampled_from(["", "   ", " 3 ", "18446744073709551616", "-1", "1.0"]),
)


@fuzz
@given(header=st.none() | header_values, query=st.none() | int_params)
async def test_last_event_id(
    fuzzed: TestClient,
    caplog: pytest.LogCaptureFixture,
    answered: tuple[str, int],
    header: str | None,
    query: str | None,
) -> None:
    caplog.clear()
    session_id, last = answered
    headers = {"Last-Event-ID": header} if header is not None else {}
    params = {"last_event_id": query} if query is not None else {}
    # The header wins when it says something; a blank one counts as absent.
    effective = header.strip() if header is not None and header.strip() else query
    outcome = int_outcome(effective)
    after = value_of(effective) if effective is not None else None
    if outcome == "absent":
        expected = {200}
    elif outcome == "invalid":
        expected = {400}
    else:
        assert after is not None
        expected = {400} if after > last else {204} if after == last else {200}
    async with fuzzed.get(f"/sessions/{session_id}/events", headers=headers, params=params) as response:
        event(f"status {response.status}")
        if response.status == 200 and 200 in expected:
            events = await read_sse(response)
            if after is None:
                assert [event["event"] for event in events] == ["status_change"]
            else:
                assert [int(event["id"]) for event in events] == list(range(after + 1, last + 1))
                assert events[-1]["event"] == "done"
        elif response.status == 204 and 204 in expected:
            assert after == last
        else:
            await assert_error(response, expected)
    assert_clean_log(caplog)


@fuzz
@given(query=st.none() | good_text | blank_text | long_text | url_text)
async def test_steps_query(fuzzed: TestClient, caplog: pytest.LogCaptureFixture, query: str | None) -> None:
    caplog.clear()
    session_id = await new_session(fuzzed)
    params = {"query": query} if query is not None else {}
    async with fuzzed.get(f"/sessions/{session_id}/stream", params=params) as response:
        event(f"status {response.status}")
        if query is None or not query.strip():
            await assert_error(response, {400})
            assert await response.json() == {"error": "Query parameter is required"}
        elif "\x00" in query:
            await assert_error(response, {400})  # U+0000 is refused wherever a client sends it
        elif len(query) > MAX_CHARS:
            await assert_error(response, {422})
        else:
            assert response.status == 200, await response.text()
            events = [event["data"] for event in await read_sse(response)]
            assert events[0] == {**events[0], "type": "message", "content": query}
            assert events[-1]["type"] == "done"
    await finish(fuzzed, caplog)


# Every valid schedule is short: at most 20 ticks 3 ms apart, plus 15 ms idle.
short_ms = st.integers(0, 3).map(str)
no_digits = url_text.filter(lambda raw: not any(char.isdigit() for char in raw))
selftest_params = st.fixed_dictionaries(
    {"interval_ms": short_ms | st.sampled_from(["-1", "1.5", "60001", "9" * 5000]) | no_digits},
    optional={
        "ticks": st.integers(1, 4).map(str) | st.sampled_from(["0", "-1", "1001", "2.0"]) | no_digits,
        "idle_ms": st.integers(0, 15).map(str) | st.sampled_from(["-1", "300001"]) | no_digits,
    },
)


@fuzz
@given(params=selftest_params)
async def test_selftest_parameters(
    fuzzed: TestClient, caplog: pytest.LogCaptureFixture, params: dict[str, str]
) -> None:
    caplog.clear()
    ticks, interval, idle = params.get("ticks"), params["interval_ms"], params.get("idle_ms")
    outcomes = [int_outcome(ticks, minimum=1), int_outcome(interval), int_outcome(idle)]
    values = [value_of(raw) if raw is not None else None for raw in (ticks, interval, idle)]
    too_big = (values[0] or 0) > 1000 or (values[1] or 0) > 60_000 or (values[2] or 0) > 300_000
    expected = {400} if "invalid" in outcomes or too_big else {200}
    async with fuzzed.get("/selftest/stream", params=params) as response:
        event(f"status {response.status}")
        if response.status == 200 and 200 in expected:
            events = await read_sse(response)
            count = values[0] if ticks is not None else 20
            assert [event["event"] for event in events] == ["tick"] * count + ["end"]
        else:
            await assert_error(response, expected)
    assert_clean_log(caplog)


@fuzz
@given(lag_since=url_text | st.floats().map(str))
async def test_healthz_parameter(
    fuzzed: TestClient, caplog: pytest.LogCaptureFixture, lag_since: str
) -> None:
    caplog.clear()
    try:
        float(lag_since)
        expected = {200}
    except ValueError:
        expected = {400}
    async with fuzzed.get("/healthz", params={"lag_since": lag_since}) as response:
        event(f"status {response.status}")
        if response.status == 200 and 200 in expected:
            assert (await response.json())["status"] == "ok"
        else:
            await assert_error(response, expected)
    assert_clean_log(caplog)


# -- raw header bytes --------------------------------------------------------------------------

KEY = "fuzz-key"


async def raw_get(client: TestClient, path: str, headers: list[bytes]) -> tuple[int, str, bytes]:
    """A GET with header bytes no HTTP client library sends (not UTF-8): status, type, body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", client.port)
    try:
        head = [f"GET {path} HTTP/1.1".encode(), b"Host: 127.0.0.1", b"Connection: close", *headers]
        writer.write(b"\r\n".join(head) + b"\r\n\r\n")
        async with asyncio.timeout(WAIT_S):
            data = await reader.read(-1)
    finally:
        writer.close()
    top, _, body = data.partition(b"\r\n\r\n")
    lines = top.split(b"\r\n")
    fields = dict(line.decode("latin-1").partition(":")[::2] for line in lines[1:])
    content_type = fields.get("Content-Type", "").strip().partition(";")[0]
    if fields.get("Transfer-Encoding", "").strip() == "chunked":
        body = b"".join(body.split(b"\r\n")[1::2])
    return int(lines[0].split()[1]), content_type, body


@pytest.fixture
async def keyed(make_client: ClientFactory, caplog: pytest.LogCaptureFixture) -> TestClient:
    """The service with an API key."""
    caplog.set_level(logging.WARNING)
    return await make_client(**FUZZ_SETTINGS, api_keys=[KEY])


# What aiohttp's parser lets through to the service (no control characters; bytes past 0x7f are
# obs-text): the rest gets aiohttp's own plain-text 400 before any handler runs.
header_bytes = st.binary(max_size=24).filter(lambda raw: all(b == 9 or 0x20 <= b != 0x7F for b in raw))


@fuzz
@given(
    name=st.sampled_from(
        [
            b"Authorization: Bearer ",
            b"Authorization: ",
            b"Cookie: agentstream_token=",
            b"Last-Event-ID: ",
            b"Origin: ",
        ]
    ),
    value=header_bytes | st.sampled_from([b"\xff", b"\xed\xa0\x80", b"k\xc3", b"\x80fuzz-key"]),
)
async def test_raw_header_bytes(
    keyed: TestClient, caplog: pytest.LogCaptureFixture, name: bytes, value: bytes
) -> None:
    """Header bytes that are not UTF-8 (aiohttp hands them on surrogate-escaped) in the headers
    the service reads, with keys on: 401, 403 or 400 as JSON, never a 500."""
    caplog.clear()
    bearer = f"Authorization: Bearer {KEY}".encode()
    async with keyed.post("/sessions", headers={"Authorization": f"Bearer {KEY}"}) as response:
        session_id = (await response.json())["id"]
    if name.startswith((b"Authorization", b"Cookie")):
        headers, expected = [name + value], {401}
    elif name.startswith(b"Origin"):
        headers, expected = [bearer, name + value], {403}
    else:
        headers, expected = [bearer, name + value], {200, 204, 400}
    status, content_type, body = await raw_get(keyed, f"/sessions/{session_id}/events", headers)
    event(f"status {status}")
    assert status in expected, (status, body)
    if status >= 400:
        assert content_type == "application/json", body
        reply = strict_json(body)
        assert isinstance(reply["error"], str), reply
    assert_clean_log(caplog)


# -- WebSocket ---------------------------------------------------------------------------------

SID = "<session>"  # stands for the test's real session in a generated message
WS_CODES = {
    "bad_json",
    "invalid",
    "unknown_type",
    "not_found",
    "conflict",
    "overloaded",
    "events_purged",
    "not_subscribed",
    "quota_exceeded",
}
session_refs = st.just(SID) | any_text | json_values
ws_messages = st.one_of(
    st.fixed_dictionaries({"type": st.just("ping")}, optional={"extra": json_values}),
    st.fixed_dictionaries(
        {"type": st.just("subscribe"), "session_id": session_refs},
        optional={"last_event_id": st.integers(-2, 40) | json_values},
    ),
    st.fixed_dictionaries({"type": st.just("unsubscribe"), "session_id": session_refs}),
    st.fixed_dictionaries(
        {
            "type": st.just("message"),
            "session_id": session_refs,
            "content": good_text | any_text | json_values,
        },
        optional={"max_turns": max_turns_values},
    ),
    st.fixed_dictionaries({"type": st.just("cancel"), "session_id": session_refs}),
    st.fixed_dictionaries(
        {"type": st.just("run"), "message": good_text | any_text | long_text | json_values},
        optional={"max_turns": max_turns_values},
    ),
    st.dictionaries(any_text, json_values, max_size=3),
    st.fixed_dictionaries({"type": any_text | json_values}),
    json_values,
)
ws_frames = st.one_of(
    ws_messages.map(lambda message: ("text", json.dumps(message))),
    st.text(max_size=30).map(lambda text: ("text", text)),
    st.sampled_from(["", "{", "[" * 5000, '{"type": "ping"', "null", "🙂"]).map(lambda text: ("text", text)),
    st.binary(max_size=16).map(lambda data: ("binary", data)),
    st.just(("text", json.dumps({"type": "ping", "pad": "x" * WS_MAX_BYTES}))),
)


def expected_ws_error(text: str) -> str | None:
    """The error code a text frame must get, where that does not depend on the session's state."""
    try:
        message = strict_json(text)
    except (ValueError, RecursionError):
        return "bad_json"
    if not isinstance(message, dict):
        return "invalid"
    if contains_surrogate(message):
        return "invalid"  # anywhere in the message: it could not be stored or echoed
    kind = message.get("type")
    if not isinstance(kind, str) or kind not in {
        "ping",
        "subscribe",
        "unsubscribe",
        "message",
        "cancel",
        "run",
    }:
        return "unknown_type"
    return None


class Socket:
    """The test's WebSocket, reopened after a close the protocol asks for."""

    def __init__(self, client: TestClient) -> None:
        self.client = client
        self.ws: aiohttp.ClientWebSocketResponse | None = None

    async def get(self) -> aiohttp.ClientWebSocketResponse:
        if self.ws is None or self.ws.closed:
            self.ws = await self.client.ws_connect("/ws")
        return self.ws

    async def until_pong(self, pongs: int = 1) -> list[dict[str, Any]]:
        """Ping; every frame up to the ``pongs``-th pong (the message sent may have been a ping
        too); each a JSON object, errors well formed."""
        ws = await self.get()
        await ws.send_str('{"type": "ping"}')
        frames = []
        async with asyncio.timeout(WS_WAIT_S):
            while True:
                message = await ws.receive()
                assert message.type == WSMsgType.TEXT, (message.type, message.data, message.extra)
                frame = strict_json(message.data)
                assert isinstance(frame, dict) and isinstance(frame.get("type"), str), frame
                if frame["type"] == "pong":
                    pongs -= 1
                    if not pongs:
                        return frames
                    continue
                if frame["type"] == "error":
                    assert isinstance(frame["error"], str) and frame["error"], frame
                    assert frame.get("code") in WS_CODES, frame
                frames.append(frame)

    async def reset(self) -> None:
        """After a failed example: a fresh socket for the next one (as when shrinking)."""
        ws, self.ws = self.ws, None
        if ws is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1):
                    await ws.close()

    async def closed_with(self) -> int | None:
        """Read to the close; its code."""
        ws = await self.get()
        async with asyncio.timeout(WS_WAIT_S):
            while True:
                message = await ws.receive()
                if message.type in {WSMsgType.CLOSE, WSMsgType.CLOSED, WSMsgType.CLOSING}:
                    return ws.close_code
                assert message.type == WSMsgType.TEXT, message


@pytest.fixture
async def socket(fuzzed: TestClient) -> Any:
    holder = Socket(fuzzed)
    yield holder
    if holder.ws is not None:
        await holder.ws.close()


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(frames=st.lists(ws_frames, min_size=1, max_size=3))
async def test_websocket_messages(
    fuzzed: TestClient,
    caplog: pytest.LogCaptureFixture,
    answered: tuple[str, int],
    socket: Socket,
    frames: list[tuple[str, Any]],
) -> None:
    caplog.clear()
    try:
        await exchange(socket, answered[0], frames)
    except BaseException:
        await socket.reset()
        raise
    assert_clean_log(caplog)


async def exchange(socket: Socket, session_id: str, frames: list[tuple[str, Any]]) -> None:
    """Send each frame; check the close it asks for or the replies up to a pong."""
    for kind, data in frames:
        ws = await socket.get()
        if kind == "binary":
            await ws.send_bytes(data)
            assert await socket.closed_with() == 1003
            continue
        text = data.replace(json.dumps(SID), json.dumps(session_id))
        await ws.send_str(text)
        if len(text.encode()) > WS_MAX_BYTES:
            assert await socket.closed_with() == 1009
            continue
        code = expected_ws_error(text)
        event(f"expected {code}")
        ping = code is None and json.loads(text).get("type") == "ping"
        replies = await socket.until_pong(2 if ping else 1)  # the socket is still usable
        errors = [frame for frame in replies if frame["type"] == "error" and "request_type" in frame]
        if code is not None:
            assert [error["code"] for error in errors] == [code], (text[:200], replies)
