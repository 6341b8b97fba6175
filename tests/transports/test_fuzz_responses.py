"""Property-based fuzzing of OpenAI's Responses face (Hypothesis): ``POST /v1/responses`` bodies,
and the ids, ``stream`` and ``starting_after`` of ``GET /v1/responses/{id}``.

As in test_fuzz.py: never a 5xx, nothing logged at ERROR, no task lost; every 4xx in OpenAI's
shape (``{"error": {"message", "type", "code", "param"}}``) with the ``type`` its status names.
Each generated body carries its own expectation: a valid body (200), or a valid body with one
known fault put in (a parameter OpenAI has and this service refuses, one it does not know, a value
of the wrong type, an input item no model could take, an unknown ``previous_response_id``, a call's
output with no call, ...), whose status, ``code`` and ``param`` are exact. The rules every body
meets first (too large, not JSON, NUL, a lone surrogate) take precedence, as they do in the
service; bodies of random shape are held to the error shape alone.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import pytest
from aiohttp.test_utils import TestClient
from hypothesis import assume, event, example, given
from hypothesis import strategies as st

from service.transports.edge.inputs import holds_nul
from service.transports.responses.models import UNSUPPORTED, ResponseRequest
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
    header_values,
    int_params,
    json_values,
    raw_bodies,
    strict_json,
    url_text,
)
from tests.transports.test_fuzz_openai import MODEL

pytestmark = pytest.mark.slow  # Hypothesis against the whole service

KNOWN = frozenset(ResponseRequest.model_fields)
ANY = object()  # an expectation's code or param that is not checked


@dataclass(frozen=True)
class Expect:
    """What a request must get: one of ``statuses``; for an error, its ``code`` and ``param``
    (``param`` exact, or with ``prefix`` set only its start)."""

    statuses: frozenset[int]
    code: Any = ANY
    param: Any = ANY
    prefix: bool = False


def bad(code: Any, param: Any, status: int = 400, *, prefix: bool = False) -> Expect:
    return Expect(frozenset({status}), code, param, prefix)


OK = Expect(frozenset({200}))


def precedence(raw: bytes, value: Any) -> Expect | None:
    """What every body meets before its parameters are read, in the service's order."""
    if len(raw) > MAX_BYTES:
        return bad(ANY, ANY, 413)
    if value is MALFORMED or not raw.strip() or not isinstance(value, dict):
        return bad(ANY, ANY)
    if holds_nul(value):
        return bad("nul_character", ANY)
    if contains_surrogate(value):
        return bad(None, None)
    for name in UNSUPPORTED:
        if value.get(name) is not None:
            return bad("unsupported_parameter", name)
    return None


# -- valid bodies --------------------------------------------------------------------------------

tool_names = st.from_regex(r"[a-z_]{1,12}", fullmatch=True)
text_parts = st.fixed_dictionaries({"type": st.sampled_from(["input_text", "text"]), "text": good_text})
user_items = st.fixed_dictionaries(
    {"role": st.just("user"), "content": good_text | st.lists(text_parts, min_size=1, max_size=2)},
    optional={"type": st.just("message")},
)
history_items = st.one_of(
    user_items,
    st.fixed_dictionaries({"role": st.sampled_from(["system", "developer"]), "content": good_text}),
    st.fixed_dictionaries(
        {
            "role": st.just("assistant"),
            "content": good_text
            | st.lists(
                st.fixed_dictionaries({"type": st.just("output_text"), "text": good_text}), max_size=1
            ),
        }
    ),
    st.fixed_dictionaries({"type": st.sampled_from(["reasoning", "mcp_call", "mcp_list_tools"])}),
)


@st.composite
def call_pairs(draw: st.DrawFn, call_id: str) -> list[dict[str, Any]]:
    """A call of the client's function and its output, one after the other."""
    call = {
        "type": "function_call",
        "call_id": call_id,
        "name": draw(tool_names),
        "arguments": draw(st.sampled_from(["{}", "", '{"city": "Paris"}'])),
    }
    return [call, {"type": "function_call_output", "call_id": call_id, "output": draw(good_text)}]


@st.composite
def valid_inputs(draw: st.DrawFn) -> str | list[dict[str, Any]]:
    if draw(st.booleans()):
        return draw(good_text)
    items: list[dict[str, Any]] = []
    for index in range(draw(st.integers(0, 3))):
        if draw(st.booleans()):
            items += draw(call_pairs(f"call_{index}"))
        else:
            items.append(draw(history_items))
    items += draw(st.one_of(user_items.map(lambda item: [item]), call_pairs("call_last")))
    return items


function_tools = st.fixed_dictionaries(
    {"type": st.just("function"), "name": tool_names},
    optional={"description": good_text, "parameters": st.just({"type": "object"}), "strict": st.booleans()},
)
small_text = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=8)


@st.composite
def valid_bodies(draw: st.DrawFn) -> dict[str, Any]:
    body = draw(
        st.fixed_dictionaries(
            {"model": st.just(MODEL), "input": valid_inputs()},
            optional={
                "instructions": good_text | st.none(),
                "stream": st.booleans() | st.none(),
                "background": st.booleans(),
                "store": st.booleans(),
                "tools": st.lists(function_tools, max_size=2, unique_by=lambda tool: tool["name"]),
                "tool_choice": st.sampled_from(["none", "auto", "required"])
                | tool_names.map(lambda name: {"type": "function", "name": name}),
                "max_output_tokens": st.integers(1, 50) | st.integers(1, 10**30),
                "metadata": st.dictionaries(small_text, small_text, max_size=3),
                "text": st.just({"format": {"type": "text"}, "verbosity": "low"}),
                "temperature": st.floats(0, 2),
                "top_p": st.floats(0, 1),
                "user": small_text,
                "parallel_tool_calls": st.booleans(),
                "truncation": st.sampled_from(["auto", "disabled"]),
                "include": st.lists(small_text, max_size=2),
                "reasoning": st.just({"effort": "low"}),
                "max_tool_calls": st.integers(1, 5),
                "top_logprobs": st.integers(0, 20),
                "stream_options": st.just({"include_obfuscation": False}),
            },
        )
    )
    if body.get("background") and body.get("store") is False:
        del body["store"]  # refused on its own (see the mutations)
    return body


# -- one fault put in ----------------------------------------------------------------------------


def _not(*allowed: type) -> Any:
    """A JSON value of none of ``allowed`` (a bool counts as neither an int nor a float)."""

    def wrong(value: Any) -> bool:
        if value is None:
            return False  # null stands for "not given" for every optional parameter
        if isinstance(value, bool):
            return bool not in allowed
        return not isinstance(value, allowed)

    return json_values.filter(wrong)


WRONG: dict[str, st.SearchStrategy[Any]] = {
    "model": _not(str) | st.just("") | st.none(),
    "input": _not(str, list) | st.sampled_from(["", []]) | st.none(),
    "instructions": _not(str),
    "user": _not(str),
    "service_tier": _not(str),
    "stream": _not(bool) | st.sampled_from(["true", 1]),
    "background": _not(bool) | st.just("yes"),
    "store": _not(bool) | st.just(0),
    "parallel_tool_calls": _not(bool),
    "max_output_tokens": _not(int) | st.sampled_from([0, -1, 2.0, True, "5"]),
    "max_tool_calls": st.sampled_from([0, -3, 1.5, "2", False]),
    "top_logprobs": st.sampled_from([-1, 21, 3.0, "3", True]),
    "temperature": _not(int, float) | st.sampled_from(["1", True]),
    "top_p": _not(int, float),
    "truncation": _not(str) | any_text.filter(lambda text: text not in {"auto", "disabled"}),
    "include": _not(list) | st.lists(_not(str), min_size=1, max_size=2),
    "reasoning": _not(dict),
    "stream_options": _not(dict),
    "prompt_cache_options": _not(dict),
    "metadata": _not(dict)
    | st.sampled_from([{"k" * 65: "v"}, {"k": "v" * 513}, {"k": 1}, {str(n): "v" for n in range(17)}]),
    "text": _not(dict)
    | st.sampled_from([{"format": {"type": "json_schema"}}, {"format": "text"}, {"verbosity": 3}]),
    "tool_choice": _not(str, dict)
    | any_text.filter(lambda text: text not in {"none", "auto", "required"})
    | st.sampled_from([{"type": "function"}, {"type": "function", "name": "a b"}, {"type": "file_search"}]),
    "tools": _not(list)
    | st.lists(_not(dict), min_size=1, max_size=2)
    | st.sampled_from(
        [
            [{"type": "web_search"}],
            [{"type": "mcp", "server_label": "x"}],
            [{"type": "function"}],
            [{"type": "function", "name": "no spaces allowed"}],
            [{"type": "function", "name": "f", "parameters": "{}"}],
        ]
    ),
    "previous_response_id": _not(str) | st.sampled_from(["", "r" * 257]),
}
unknown_names = (st.from_regex(r"[a-z][a-z_]{0,15}", fullmatch=True) | any_text).filter(
    lambda name: name not in KNOWN
)
bad_response_ids = st.one_of(
    st.from_regex(r"resp_[0-9a-f]{16}[A-Za-z0-9_-]{1,40}", fullmatch=True),
    st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=40),
    st.sampled_from(["resp_", "resp_0123456789abcdef", "r" * 256]),
)


def _as_items(value: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": value}] if isinstance(value, str) else list(value)


FAULTS = [
    "valid",
    "unsupported",
    "unknown",
    "wrong type",
    "other model",
    "background unstored",
    "unknown previous",
    "stray output",
    "unanswered call",
    "image part",
    "bad item",
    "blank user",
    "assistant last",
    "bad arguments",
    "too long",
    "duplicate tools",
]
_ITEM_TYPES = {"message", "function_call", "function_call_output", "reasoning", "mcp_call"}
_ITEM_TYPES |= {"mcp_list_tools", "mcp_approval_request"}
bad_items = st.one_of(
    st.fixed_dictionaries({"type": any_text.filter(lambda kind: kind not in _ITEM_TYPES)}),
    st.fixed_dictionaries({"role": st.sampled_from(["tool", "function", "model", ""]), "content": good_text}),
    st.just({"type": "function_call", "call_id": "c", "name": "bad name", "arguments": "{}"}),
    st.just({"type": "function_call_output", "call_id": "", "output": "x"}),
    st.just({"role": "user", "content": 5}),
    _not(dict),
)


@st.composite
def faulty_bodies(draw: st.DrawFn) -> tuple[str, dict[str, Any], Expect]:
    """A valid body with one fault put in: the fault's name, the body, what it must get."""
    body = draw(valid_bodies())
    kind = draw(st.sampled_from(FAULTS))
    items = _as_items(body["input"])
    last = len(items)
    if kind == "valid":
        return kind, body, OK
    if kind == "unsupported":
        name = draw(st.sampled_from(sorted(UNSUPPORTED)))
        body[name] = draw(st.just("conv_1") | json_values.filter(lambda value: value is not None))
        return kind, body, bad("unsupported_parameter", name)
    if kind == "unknown":
        name = draw(unknown_names)
        body[name] = draw(json_values)
        return kind, body, bad("unknown_parameter", name)
    if kind == "wrong type":
        name = draw(st.sampled_from(sorted(WRONG)))
        body[name] = draw(WRONG[name])
        if name == "tools":
            body.pop("tool_choice", None)  # ``none`` would not read the tools as the client's
        return kind, body, bad("invalid_value", name, prefix=True)
    if kind == "other model":
        body["model"] = draw(good_text.filter(lambda text: text != MODEL))
        return kind, body, bad("model_not_found", "model", 404)
    if kind == "background unstored":
        body.update(background=True, store=False)
        return kind, body, bad("invalid_value", "background")
    if kind == "unknown previous":
        body["previous_response_id"] = draw(bad_response_ids)
        return kind, body, bad("not_found", "previous_response_id", 404)
    if kind == "stray output":
        body["input"] = [*items, {"type": "function_call_output", "call_id": "nobody_called", "output": "x"}]
        return kind, body, bad("invalid_value", f"input[{last}].call_id")
    if kind == "unanswered call":
        call = {"type": "function_call", "call_id": "never_answered", "name": "f", "arguments": "{}"}
        body["input"] = [call, *items]
        return kind, body, bad("invalid_value", "input")
    if kind == "image part":
        part = {"type": draw(st.sampled_from(["input_image", "input_file", "input_audio"])), "detail": "auto"}
        body["input"] = [*items, {"role": "user", "content": [{"type": "input_text", "text": "see"}, part]}]
        return kind, body, bad("invalid_value", f"input[{last}].content[1].type")
    if kind == "bad item":
        body["input"] = [*items, draw(bad_items)]
        return kind, body, bad("invalid_value", f"input[{last}]", prefix=True)
    if kind == "blank user":
        body["input"] = [*items, {"role": "user", "content": draw(blank_text | st.just([]))}]
        return kind, body, bad("invalid_value", f"input[{last}].content")
    if kind == "assistant last":
        body["input"] = [*items, {"role": "assistant", "content": draw(good_text)}]
        return kind, body, bad("invalid_value", f"input[{last}]")
    if kind == "bad arguments":
        arguments = draw(st.sampled_from(["[1]", "{", "3", "NaN", '{"x": 1e999}', "null"]))
        call = {"type": "function_call", "call_id": "c_args", "name": "f", "arguments": arguments}
        answer = {"type": "function_call_output", "call_id": "c_args", "output": "x"}
        body["input"] = [*items, call, answer]
        return kind, body, bad("invalid_value", f"input[{last}].arguments")
    if kind == "too long":
        body["input"] = "y" * draw(st.integers(MAX_CHARS + 1, MAX_CHARS + 50))
        return kind, body, bad("string_above_max_length", "input")
    assert kind == "duplicate tools"
    body["tools"] = [{"type": "function", "name": "twice"}, {"type": "function", "name": "twice"}]
    body.pop("tool_choice", None)
    return kind, body, bad("invalid_value", "tools[1].name")


def expect_shapeless(value: Any) -> Expect:
    """A body of random shape: an error unless it happens to be a valid request."""
    if isinstance(value, dict) and set(value) - KNOWN:
        return Expect(frozenset({400}))
    return Expect(frozenset({200, 400, 404}))


shapeless = st.one_of(
    st.dictionaries(any_text, json_values, max_size=3),
    st.fixed_dictionaries(
        {},
        optional={
            "model": st.just(MODEL) | any_text | json_values,
            "input": good_text | any_text | json_values | st.lists(json_values, max_size=2),
            "stream": st.booleans() | json_values,
            "tools": json_values,
        },
    ),
    json_values,
)


def weighted(*choices: tuple[int, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """One of the strategies, each drawn ``weight`` times as often as one of weight 1."""
    return st.sampled_from([strategy for weight, strategy in choices for _ in range(weight)]).flatmap(
        lambda strategy: strategy
    )


response_bodies = weighted(
    # Most examples: each fault is a rule with an exact answer.
    (6, faulty_bodies().map(lambda case: (case[0], *encoded(case[1]), case[2]))),
    (2, shapeless.map(lambda value: ("shapeless", *encoded(value), expect_shapeless(value)))),
    (1, raw_bodies.map(lambda body: ("raw", *body, Expect(frozenset({400, 413}))))),
    (
        1,
        st.sampled_from(['{"model": "m", "input": "hi", "temperature": NaN}', '{"input": 1e999}']).map(
            lambda text: ("not finite", text.encode(), MALFORMED, Expect(frozenset({400})))
        ),
    ),
)


# -- checks --------------------------------------------------------------------------------------

ERROR_TYPES = {401: "authentication_error", 403: "permission_error", 429: "rate_limit_error"}


async def assert_openai_error(response: Any, expected: Expect) -> dict[str, Any]:
    """A 4xx from ``expected`` in OpenAI's shape, with its code and param where they are known."""
    text = await response.text()
    assert response.status in expected.statuses, (response.status, text)
    assert 400 <= response.status < 500, text
    assert response.content_type == "application/json", text
    body = strict_json(text)
    error = body["error"]
    assert set(error) >= {"message", "type", "code", "param"}, error
    assert isinstance(error["message"], str) and error["message"], error
    assert error["type"] == ERROR_TYPES.get(response.status, "invalid_request_error"), error
    if expected.code is not ANY:
        assert error["code"] == expected.code, error
    if expected.param is not ANY:
        param = error["param"]
        if expected.prefix:
            assert param == expected.param or re.match(rf"{re.escape(expected.param)}[.\[]", param), error
        else:
            assert param == expected.param, error
    return error


async def check_response(client: TestClient, response: Any, value: dict[str, Any]) -> None:
    """A 200: the response object, or its stream, as the request asked."""
    if value.get("stream") is True:
        assert response.content_type == "text/event-stream"
        async with asyncio.timeout(WAIT_S):
            blocks = [block async for block in sse_blocks(response)]
        events = [strict_json(block["data"]) for block in blocks]
        assert [block["event"] for block in blocks] == [event["type"] for event in events]
        assert [event["sequence_number"] for event in events] == list(range(len(events)))
        assert events[0]["type"] == "response.created", events[:2]
        assert events[-1]["type"] in {"response.completed", "response.incomplete"}, events[-2:]
        reply = events[-1]["response"]
    else:
        reply = strict_json(await response.text())
        background = value.get("background") is True
        statuses = {"queued", "in_progress", "completed"} if background else {"completed", "incomplete"}
        assert reply["status"] in statuses, reply
    assert reply["object"] == "response" and reply["id"].startswith("resp_"), reply
    assert reply["background"] is (value.get("background") is True)
    assert reply["store"] is (value.get("store") is not False)
    async with client.get(f"/v1/responses/{reply['id']}") as again:
        if value.get("store") is False:
            await assert_openai_error(again, bad("not_found", None, 404))  # never kept
        else:
            assert again.status == 200, await again.text()
            assert (await again.json())["id"] == reply["id"]


@fuzz
@example(case=("deep", *DEEP, Expect(frozenset({400}))))
@example(case=("huge", *encoded({"model": MODEL, "input": "x" * MAX_BYTES}), bad(ANY, ANY, 413)))
@example(case=("surrogate", *encoded({"model": MODEL, "input": "hi\ud800"}), bad(None, None)))
@example(case=("nul", *encoded({"model": MODEL, "input": "hi\x00"}), bad("nul_character", ANY)))
@example(
    case=(
        "not a field's name",
        *encoded({"model": MODEL, "input": "hi", "Odd-Name": 1}),
        bad("unknown_parameter", "Odd-Name"),
    )
)
@given(case=response_bodies)
async def test_create_bodies(
    fuzzed: TestClient,  # noqa: F811 - the fixture
    caplog: pytest.LogCaptureFixture,
    case: tuple[str, bytes, Any, Expect],
) -> None:
    caplog.clear()
    kind, raw, value, expected = case
    expected = precedence(raw, value) or expected
    event(kind)
    async with fuzzed.post(
        "/v1/responses", data=raw, headers={"Content-Type": "application/json"}
    ) as response:
        event(f"status {response.status}")
        if response.status == 200 and 200 in expected.statuses:
            await check_response(fuzzed, response, value)
        else:
            await assert_openai_error(response, expected)
    await finish(fuzzed, caplog)


# -- GET /v1/responses/{id} ----------------------------------------------------------------------

REAL = "<the response>"  # stands for the fixture's response id in a generated id


@dataclass(frozen=True)
class Answered:
    response_id: str
    body: dict[str, Any]
    count: int  # how many events its stream has


@pytest.fixture
async def answered(fuzzed: TestClient) -> Answered:  # noqa: F811 - the fixture
    """One finished response, as polled, and the number of its stream's events."""
    body = {"model": MODEL, "input": "What is 6 * 7?"}
    async with fuzzed.post("/v1/responses", json=body) as response:
        assert response.status == 200, await response.text()
        reply = await response.json()
    assert reply["status"] == "completed"
    async with fuzzed.get(f"/v1/responses/{reply['id']}", params={"stream": "true"}) as response:
        count = len([block async for block in sse_blocks(response)])
    async with fuzzed.get(f"/v1/responses/{reply['id']}") as response:
        return Answered(reply["id"], await response.json(), count)


ids = weighted(
    (3, st.just(REAL)),
    (1, st.sampled_from([f"{REAL}x", f"x{REAL}", f"{REAL}/", f"{REAL}-2"])),
    (1, st.from_regex(r"resp_[0-9a-f]{16}[A-Za-z0-9_-]{1,40}", fullmatch=True)),
    (1, st.sampled_from(["resp_", "..", ".", "resp_0123456789abcdef", "%", "a/b", "{x}", "x" * 300])),
    (1, url_text),
)
stream_values = weighted(
    (3, st.sampled_from([None, "true", "false"])),
    (1, st.sampled_from(["TRUE", "False", "", "1", "yes"]) | url_text),
)
after_values = weighted(
    (2, st.none()),
    (3, st.integers(-1, 25).map(str)),
    (1, int_params | st.sampled_from(["²", "٣", "１", "0" * 19, "9" * 18, "-0"])),
)


def starting_after(raw: str | None) -> int | None | str:
    """The number ``raw`` names (-1 for none), or ``"invalid"``: ASCII digits only, at most 18."""
    if raw is None or raw == "":
        return -1
    if re.fullmatch(r"[0-9]{1,18}", raw):
        return int(raw)
    return "invalid"


def is_routed(response_id: str) -> bool:
    """Whether the path names a response: the router's pattern takes anything but ``{``, ``}``
    and an unquoted ``/`` (a quoted one is part of the id), and the URL's ``.`` and ``..``
    segments are resolved before it sees them."""
    return response_id not in {"", ".", ".."} and not set(response_id) & set("{}")


@fuzz
@given(
    response_id=ids,
    stream=stream_values,
    after=after_values,
    header=weighted((3, st.none()), (1, header_values)),
)
async def test_retrieve_parameters(
    fuzzed: TestClient,  # noqa: F811 - the fixture
    caplog: pytest.LogCaptureFixture,
    answered: Answered,
    response_id: str,
    stream: str | None,
    after: str | None,
    header: str | None,
) -> None:
    assume(len(after or "") < 6000)  # within aiohttp's request-line limit
    caplog.clear()
    real = response_id.replace(REAL, answered.response_id)
    params = {name: raw for name, raw in (("stream", stream), ("starting_after", after)) if raw is not None}
    headers = {"Last-Event-ID": header} if header is not None else {}
    path = f"/v1/responses/{quote(real, safe='')}"
    routed = is_routed(real)
    mode = (stream if stream is not None else "false").lower()
    # ``starting_after`` wins over ``Last-Event-ID``; both are read only for a stream.
    # A header's value comes without the blanks around it (HTTP's optional whitespace).
    sent = after if after is not None else header.strip(" \t") if header is not None else None
    skip = starting_after(sent) if mode == "true" else -1
    if not routed:
        expected = bad(ANY, ANY, 404)
    elif mode not in {"true", "false"}:
        expected = bad("invalid_value", "stream")
    elif skip == "invalid":
        expected = bad("invalid_value", "starting_after")
    elif real != answered.response_id:
        expected = bad("not_found", None, 404)
    else:
        expected = OK
    event(f"expected {sorted(expected.statuses)}")
    async with fuzzed.get(path, params=params, headers=headers) as response:
        if response.status == 200 and expected is OK:
            if mode == "true":
                assert response.content_type == "text/event-stream"
                async with asyncio.timeout(WAIT_S):
                    events = [strict_json(block["data"]) async for block in sse_blocks(response)]
                assert isinstance(skip, int)
                numbers = [event["sequence_number"] for event in events]
                assert numbers == list(range(skip + 1, answered.count)), numbers
            else:
                assert await response.json() == answered.body
        else:
            await assert_openai_error(response, expected)
    assert_clean_log(caplog)


@fuzz
@given(response_id=ids.filter(lambda value: value != REAL))
async def test_cancel_and_delete_unknown_ids(
    fuzzed: TestClient,  # noqa: F811 - the fixture
    caplog: pytest.LogCaptureFixture,
    answered: Answered,
    response_id: str,
) -> None:
    caplog.clear()
    real = response_id.replace(REAL, answered.response_id)
    routed = is_routed(real)
    path = f"/v1/responses/{quote(real, safe='')}"
    for method, suffix in (("POST", "/cancel"), ("DELETE", "")):
        async with fuzzed.request(method, path + suffix) as response:
            # An id that is no route: the router's 404 (or 405 where it names another route).
            expected = bad("not_found", None, 404) if routed else Expect(frozenset({404, 405}))
            await assert_openai_error(response, expected)
    async with fuzzed.get(f"/v1/responses/{answered.response_id}") as response:
        assert await response.json() == answered.body  # untouched
    assert_clean_log(caplog)
