"""What the dialects and handlers emit against the schemas ``GET /openapi.json`` publishes.

The document leaves its objects open (a client must accept fields added later), so these tests
first close every object schema that lists its properties: a dialect or handler that emits a
field its type in ``payloads.py`` / ``replies.py`` does not declare fails here, as does one that
leaves out a required field or gives a field another type.
"""

from __future__ import annotations

import copy
import json
import typing
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, best_match

from service.app import build_spec
from service.config import Settings
from service.core.events import (
    ClientToolRequest,
    ClientToolResult,
    ContextTrimmed,
    ConversationRewound,
    Event,
    PlanCreated,
    ReasoningDelta,
    RunDone,
    RunError,
    RunStarted,
    StatusChange,
    StepCompleted,
    TextDelta,
    ToolApprovalRequest,
    ToolApprovalResponse,
    ToolCall,
    ToolExecuting,
    ToolInputDelta,
    ToolResult,
    ToolUse,
    ToolUseStart,
    TurnCompleted,
    Usage,
)
from service.core.log import LogEntry
from service.transports.native import dialects
from service.transports.stream import session as session_dialect
from tests.conftest import TEST_SETTINGS, ClientFactory, services_of, sse_events

USAGE = Usage(input_tokens=3, output_tokens=4, total_tokens=7)
CALLS = [
    ToolCall(tool="calculator", input={"expression": "2+3"}, tool_use_id="t1", result="5"),
    ToolCall(tool="explode", input={}, tool_use_id="t2", is_error=True, result="the tool blew up"),
    ToolCall(tool="sleepy", input=None, tool_use_id="t3"),
]
# Every kind of canonical event, each optional part both present and absent somewhere.
EVENTS: list[Event] = [
    RunStarted(run_id="r1", message="What is 2+3?", max_turns=5),
    RunStarted(run_id="r2", message="Again", max_turns=5, message_id="u1", reply_id="msg_a"),
    StatusChange(status="running"),
    PlanCreated(plan="1. add", usage=USAGE),
    TextDelta(text="Five"),
    ReasoningDelta(text="Let me think"),
    ToolUseStart(tool="calculator", tool_use_id="t1"),
    ToolInputDelta(tool_use_id="t1", delta='{"expression":'),
    ToolUse(tool="calculator", tool_use_id="t1", input={"expression": "2+3"}),
    ToolExecuting(tool="calculator", tool_use_id="t1"),
    ToolResult(tool="calculator", tool_use_id="t1", result="5"),
    ToolResult(tool="explode", tool_use_id="t2", result="the tool blew up", is_error=True),
    TurnCompleted(turn=1, stop_reason="tool_use", usage=USAGE, total_usage=USAGE, latency_ms=12),
    TurnCompleted(turn=2, stop_reason="end_turn", usage=USAGE, total_usage=USAGE),
    StepCompleted(turn=1, step_number=2, text="Adding", tool_calls=CALLS, observations=["5"], usage=USAGE),
    StepCompleted(turn=2, step_number=3, error="the tool blew up"),
    RunDone(turns=2, output="Five", final_step=3, tool_calls=CALLS, usage=USAGE),
    RunDone(turns=5, truncated=True, max_turns_reached=True, stop_reason="max_tokens"),
    RunDone(turns=1, cancelled=True),
    RunError(error="throttled", code="throttlingException", turns=1, recoverable=True, usage=USAGE),
    ToolApprovalRequest(
        approval_id="ap_1", tool="calculator", tool_use_id="t1", input={"expression": "2+3"}, expires_at=1.5
    ),
    ToolApprovalResponse(
        approval_id="ap_1", approved=True, reason="", by="http", input={"expression": "2+4"}
    ),
    ToolApprovalResponse(approval_id="ap_2", approved=False, reason="expired", by="timeout"),
    StatusChange(status="waiting"),
    StatusChange(status="idle"),
    ClientToolRequest(tool="get_location", tool_use_id="t3", input={}, expires_at=2.5),
    ClientToolResult(tool_use_id="t3", output={"city": "Lyon"}, by="http"),
    ClientToolResult(tool_use_id="t4", error="denied by the browser", by="ai-sdk"),
    ConversationRewound(message_id="u1", kept=2, removed=4, usage=USAGE),
    ContextTrimmed(turn=1, dropped_messages=4, kept_messages=3, estimated_tokens=900, max_tokens=1000),
]


def closed(schema: Any) -> Any:
    """``schema`` with every object that lists its properties refusing any other property."""
    if isinstance(schema, list):
        return [closed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    result = {key: closed(value) for key, value in schema.items()}
    if isinstance(schema.get("properties"), dict) and "additionalProperties" not in schema:
        result["additionalProperties"] = False
    return result


def validator(spec: dict[str, Any], schema: dict[str, Any]) -> Draft202012Validator:
    """Validates against ``schema`` (which may ``$ref`` the document's components), closed."""
    root = {"components": closed(spec["components"]), **closed(schema)}
    Draft202012Validator.check_schema(root)
    return Draft202012Validator(root)


def named(spec: dict[str, Any], name: str) -> Draft202012Validator:
    """A validator for the component schema ``name``."""
    return validator(spec, {"$ref": f"#/components/schemas/{name}"})


def reply(spec: dict[str, Any], method: str, path: str, status: int) -> Draft202012Validator:
    """A validator for the body the document promises for ``status`` from ``method path``: JSON,
    or the ``data`` of each event of a stream."""
    response = spec["paths"][path][method.lower()]["responses"][str(status)]
    if "$ref" in response:
        response = spec["components"]["responses"][response["$ref"].rsplit("/", 1)[-1]]
    content = response["content"]
    if "text/event-stream" in content:
        return validator(spec, content["text/event-stream"]["schema"]["properties"]["data"]["contentSchema"])
    return validator(spec, content["application/json"]["schema"])


def conforms(check: Draft202012Validator, instance: Any) -> None:
    """Fail with every way ``instance`` breaks the schema."""
    error = best_match(check.iter_errors(instance))
    if error is not None:
        pytest.fail(f"{json.dumps(instance)}\n" + "\n".join(explain(error)))


def explain(error: ValidationError) -> list[str]:
    """What is wrong; under a union, only what the branches with the right ``type`` say."""
    branches: dict[Any, list[ValidationError]] = {}
    for sub in error.context or []:
        branches.setdefault(sub.relative_schema_path[0], []).append(sub)
    # A branch that failed a ``const`` is one for another ``type``: not the one meant.
    fitting = [subs for subs in branches.values() if not any(sub.validator == "const" for sub in subs)]
    why = [line for subs in fitting for sub in subs for line in explain(sub)]
    return why or [f"{list(error.absolute_path)}: {error.message}"]


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    """The document of an application with the test settings."""
    return build_spec(Settings(**TEST_SETTINGS))


def test_every_canonical_event_is_listed() -> None:
    members = set(typing.get_args(typing.get_args(Event)[0]))
    assert {type(event) for event in EVENTS} == members


def test_each_dialect_emits_only_what_its_schema_declares(spec: dict[str, Any]) -> None:
    agent, session, logged, steps = (
        named(spec, name) for name in ("AgentEvent", "SessionPayload", "SessionEvent", "StepsEvent")
    )
    entries = [LogEntry(id=n, event=event, size=1) for n, event in enumerate(EVENTS, start=1)]
    seen: dict[str, set[str]] = {"agent": set(), "session": set(), "steps": set()}
    for entry in entries:
        payload = dialects.agent(entry.event)
        if payload is not None:
            conforms(agent, payload)
            seen["agent"].add(payload["type"])
        conforms(session, session_dialect.session(entry.event))
        conforms(logged, session_dialect.session_payload(entry))
        seen["session"].add(session_dialect.session(entry.event)["type"])
        for frame in dialects.steps(entry.event):
            conforms(steps, frame)
            seen["steps"].add(frame["type"])
    # A lagging reader's merged text carries ``first_id`` as well.
    deltas = [LogEntry(id=n, event=TextDelta(text=str(n)), size=1) for n in (7, 8, 9)]
    for _, _, data in session_dialect.merge_text_runs(deltas):
        conforms(logged, json.loads(data))
    assert seen == {
        "agent": {
            "text_delta",
            "reasoning_delta",
            "tool_use_start",
            "tool_input_delta",
            "tool_executing",
            "tool_result",
            "done",
            "error",
        },
        "session": {
            "processing",
            "status_change",
            "plan",
            "assistant_text",
            "reasoning_text",
            "tool_use_start",
            "tool_input_delta",
            "tool_use",
            "tool_executing",
            "tool_result",
            "usage",
            "context_trimmed",
            "step",
            "done",
            "error",
            "tool_approval_request",
            "tool_approval_response",
            "client_tool_request",
            "client_tool_result",
            "conversation_rewound",
        },
        "steps": {"message", "step", "final", "done", "error"},
    }


def test_a_field_no_schema_declares_fails(spec: dict[str, Any]) -> None:
    """The check above can fail: an extra field, a missing one, or a logged event without its id."""
    session = named(spec, "SessionEvent")
    payload = session_dialect.session_payload(LogEntry(id=1, event=TextDelta(text="hi"), size=1))
    conforms(session, payload)
    assert not session.is_valid({**payload, "surprise": 1})
    assert not session.is_valid({key: value for key, value in payload.items() if key != "text"})
    assert not session.is_valid({key: value for key, value in payload.items() if key != "id"})
    done = dialects.agent(RunDone(turns=1, tool_calls=CALLS))
    assert done is not None
    nested: Any = copy.deepcopy(done)
    nested["tool_calls"][0]["surprise"] = 1
    assert named(spec, "AgentEvent").is_valid(done) and not named(spec, "AgentEvent").is_valid(nested)


async def stream(client: TestClient, method: str, url: str, **kwargs: Any) -> list[Any]:
    """Every event's data of an SSE reply."""
    async with client.request(method, url, **kwargs) as response:
        assert response.status == 200, await response.text()
        return [event["data"] async for event in sse_events(response)]


async def answer(client: TestClient, method: str, url: str, status: int, **kwargs: Any) -> Any:
    """The JSON body of a reply that must have ``status``."""
    async with client.request(method, url, **kwargs) as response:
        assert response.status == status, await response.text()
        return await response.json()


@pytest.mark.slow
async def test_a_scripted_conversation_conforms_on_every_route(make_client: ClientFactory) -> None:
    client = await make_client(steps_planning=True)
    spec = await answer(client, "GET", "/openapi.json", 200)
    replies: list[tuple[str, str, int, Any]] = []  # (method, documented path, status, body)

    for message in ("What is 2+3? [emu:reasoning]", "Use a tool [emu:tool=explode]", "Talk [emu:max_tokens]"):
        body = {"message": message, "max_turns": 2}
        events = await stream(client, "POST", "/agent/stream", json=body)
        replies += [("POST", "/agent/stream", 200, event) for event in events]
        replies.append(
            ("POST", "/agent/run", 200, await answer(client, "POST", "/agent/run", 200, json=body))
        )
    failed = {"message": "x [emu:fail=internalServerException] [emu:fail_after=1]"}
    replies.append(("POST", "/agent/run", 503, await answer(client, "POST", "/agent/run", 503, json=failed)))
    replies.append(("POST", "/agent/run", 422, await answer(client, "POST", "/agent/run", 422, json={})))

    events_path = "/sessions/{session_id}/events"

    async def converse(content: str, *, cancel: bool = False) -> str:
        """A new session (its events as a fresh client sees them) with one query; its path."""
        nonlocal replies
        created = await answer(client, "POST", "/sessions", 201)
        replies.append(("POST", "/sessions", 201, created))
        base = f"/sessions/{created['id']}"
        replies += [
            ("GET", events_path, 200, event) for event in await stream(client, "GET", f"{base}/events")
        ]
        accepted = await answer(client, "POST", f"{base}/messages", 202, json={"content": content})
        replies.append(("POST", "/sessions/{session_id}/messages", 202, accepted))
        if cancel:
            cancelled = await answer(client, "POST", f"{base}/cancel", 202)
            replies.append(("POST", "/sessions/{session_id}/cancel", 202, cancelled))
        followed = await stream(client, "GET", f"{base}/events?last_event_id={accepted['after_id']}")
        replies += [("GET", events_path, 200, event) for event in followed]
        replies.append(("GET", "/sessions/{session_id}", 200, await answer(client, "GET", base, 200)))
        return base

    await converse("wait for it [emu:ttft=60000]", cancel=True)
    base = await converse("What is the square root of 144?")
    steps = await stream(client, "GET", f"{base}/stream", params={"query": "What is 6*7?"})
    replies += [("GET", "/sessions/{session_id}/stream", 200, event) for event in steps]
    polled = await answer(client, "GET", f"{base}/events/poll", 200)
    replies.append(("GET", "/sessions/{session_id}/events/poll", 200, polled))
    replies.append(("GET", "/sessions/{session_id}", 404, await answer(client, "GET", "/sessions/nope", 404)))
    replies.append(("GET", "/healthz", 200, await answer(client, "GET", "/healthz", 200)))
    ticks = await stream(client, "GET", "/selftest/stream?ticks=2&interval_ms=0")
    replies += [("GET", "/selftest/stream", 200, event) for event in ticks]

    for method, path, status, body in replies:
        conforms(reply(spec, method, path, status), body)
    kinds = {(path, body.get("type")) for _, path, _, body in replies}
    # The run went where this test means it to: tools, reasoning, a plan, a cancel, a failure.
    assert {
        ("/agent/stream", "reasoning_delta"),
        ("/agent/stream", "tool_result"),
        (events_path, "tool_use"),
        (events_path, "usage"),
        ("/sessions/{session_id}/stream", "step"),
        ("/sessions/{session_id}/stream", "final"),
    } <= kinds
    assert any(body.get("step_type") == "planning" for _, _, _, body in replies)
    assert any(body.get("cancelled") is True for _, path, _, body in replies if path == events_path)


async def test_purged_and_token_replies_conform(make_client: ClientFactory) -> None:
    client = await make_client(session_events_max_bytes=8192, api_keys=["key"])
    spec = await answer(client, "GET", "/openapi.json", 200)
    auth = {"Authorization": "Bearer key"}
    token = await answer(client, "POST", "/auth/token", 200, headers=auth)
    conforms(reply(spec, "POST", "/auth/token", 200), token)
    session_id = (await answer(client, "POST", "/sessions", 201, headers=auth))["id"]
    base = f"/sessions/{session_id}"
    for content in ("What is the square root of 144?", "A long answer [emu:tokens=60]"):
        await answer(client, "POST", f"{base}/messages", 202, json={"content": content}, headers=auth)
        run = services_of(client).runs.get(session_id)
        if run is not None:
            await run.wait()
    gone = await answer(client, "GET", f"{base}/events", 410, headers={**auth, "Last-Event-ID": "1"})
    conforms(reply(spec, "GET", "/sessions/{session_id}/events", 410), gone)
    polled = await answer(client, "GET", f"{base}/events/poll", 200, headers=auth)
    assert polled["purged"] is True
    conforms(reply(spec, "GET", "/sessions/{session_id}/events/poll", 200), polled)
