"""Traces of a query's waits on someone else: a person's approval and a browser-side tool's
result, each a span under the query's with its outcome, and the answer's own span in the
query's trace (linked to the request that brought it). A real OTLP/HTTP receiver gets the spans
(tests/support/traces.py); expiries are driven by a clock the test moves."""

from __future__ import annotations

import secrets

from aiohttp.test_utils import TestClient

from tests.conftest import ClientFactory, services_of
from tests.support.clock import ManualClock
from tests.support.traces import ERROR, INTERNAL, SERVER, Receiver, children, trace_of
from tests.transports.test_actions import LOCATION, entries_until, logged, new_session, of_type


def traceparent() -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


async def start(client: TestClient, body: dict[str, object], header: str) -> tuple[str, int]:
    session_id = await new_session(client)
    async with client.post(
        f"/sessions/{session_id}/messages", json=body, headers={"traceparent": header}
    ) as response:
        assert response.status == 202, await response.text()
        return session_id, (await response.json())["after_id"]


async def test_an_approval_is_a_span_with_its_outcome_and_the_answer_joins_the_querys_trace(
    receiver: Receiver, make_client: ClientFactory
) -> None:
    client = await make_client(tools_require_approval="calculator", approval_timeout_s=60)
    trace_id, _, header = traceparent()
    session_id, after = await start(client, {"content": "What is 6*7?"}, header)
    request = (await logged(client, session_id, "tool_approval_request", after)).event
    # The person answers from another page: a trace of its own.
    answer_trace, _, answer_header = traceparent()
    async with client.post(
        f"/sessions/{session_id}/approvals/{request.approval_id}",
        json={"approved": True},
        headers={"traceparent": answer_header},
    ) as response:
        assert response.status == 200
    entries = await entries_until(client, session_id, 1, after)
    assert of_type(entries, "done")

    spans = await receiver.wait_for(
        lambda spans: (ours := trace_of(spans, trace_id)) and len(ours) == 7 and ours
    )
    (agent,) = [span for span in spans if span.name == "invoke_agent default"]
    names = [span.name for span in children(spans, agent)]
    assert names[1:4] == ["tool_approval calculator", "execute_tool calculator", names[0]], names
    (wait,) = [span for span in spans if span.name == "tool_approval calculator"]
    assert wait.kind == INTERNAL and wait.status != ERROR
    assert wait.attributes["gen_ai.tool.call.id"] == request.tool_use_id
    assert wait.attributes["agentstream.approval.approved"] is True
    # The answer's span is in the query's trace, under the wait, and links to the answering
    # request's server span, in the trace its page started.
    (answered,) = children(spans, wait)
    assert answered.name == "tool_approval_response calculator"
    (answer_server,) = await receiver.wait_for(
        lambda spans: [s for s in trace_of(spans, answer_trace) if s.kind == SERVER]
    )
    assert answered.links == [(answer_trace, answer_server.span_id)]


async def test_an_expired_approval_ends_its_span_in_error(
    receiver: Receiver, make_client: ClientFactory
) -> None:
    client = await make_client(tools_require_approval="calculator", approval_timeout_s=60)
    clock = services_of(client).runs.approvals.clock = ManualClock()
    trace_id, _, header = traceparent()
    session_id, after = await start(client, {"content": "What is 6*7?"}, header)
    await logged(client, session_id, "tool_approval_request", after)
    await clock.wait_sleepers(1)
    clock.advance(61)
    assert of_type(await entries_until(client, session_id, 1, after), "done")
    (wait,) = await receiver.wait_for(
        lambda spans: [s for s in trace_of(spans, trace_id) if s.name == "tool_approval calculator"]
    )
    assert wait.status == ERROR and wait.attributes["error.type"] == "expired"
    assert wait.attributes["agentstream.approval.approved"] is False


async def test_a_browser_tool_is_an_execute_tool_span_that_waits_for_the_client(
    receiver: Receiver, make_client: ClientFactory
) -> None:
    client = await make_client(client_tool_timeout_s=30)
    clock = services_of(client).runs.approvals.clock = ManualClock()
    trace_id, _, header = traceparent()
    body = {"content": "Where am I? [emu:tool=get_location]", "tools": [LOCATION]}
    session_id, after = await start(client, body, header)
    request = (await logged(client, session_id, "client_tool_request", after)).event
    url = f"/sessions/{session_id}/tool-results/{request.tool_use_id}"
    async with client.post(url, json={"output": {"city": "Lyon"}}) as response:
        assert response.status == 200
    assert of_type(await entries_until(client, session_id, 1, after), "done")
    (call,) = await receiver.wait_for(
        lambda spans: [s for s in trace_of(spans, trace_id) if s.name == "execute_tool get_location"]
    )
    assert call.status != ERROR and call.attributes["agentstream.tool.executor"] == "client"
    assert call.attributes["gen_ai.tool.call.id"] == request.tool_use_id
    (answered,) = await receiver.wait_for(lambda spans: children(spans, call))
    assert answered.name == "client_tool_result get_location"

    # Unanswered, the call times out: its span ends in error.
    trace_id, _, header = traceparent()
    session_id, after = await start(client, body, header)
    await logged(client, session_id, "client_tool_request", after)
    await clock.wait_sleepers(1)
    clock.advance(31)
    assert of_type(await entries_until(client, session_id, 1, after), "done")
    (call,) = await receiver.wait_for(
        lambda spans: [s for s in trace_of(spans, trace_id) if s.name == "execute_tool get_location"]
    )
    assert call.status == ERROR and call.attributes["error.type"] == "timeout"


async def test_a_query_cancelled_while_it_waits_ends_the_wait_as_cancelled(
    receiver: Receiver, make_client: ClientFactory
) -> None:
    client = await make_client(tools_require_approval="calculator", approval_timeout_s=60)
    trace_id, _, header = traceparent()
    session_id, after = await start(client, {"content": "What is 6*7?"}, header)
    await logged(client, session_id, "tool_approval_request", after)
    async with client.post(f"/sessions/{session_id}/cancel") as response:
        assert (await response.json())["cancelled"] is True
    (wait,) = await receiver.wait_for(
        lambda spans: [s for s in trace_of(spans, trace_id) if s.name == "tool_approval calculator"]
    )
    assert wait.status == ERROR and wait.attributes["error.type"] == "cancelled"
