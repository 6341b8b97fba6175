"""One query's trace across two service processes on one real Redis: the query runs on one
instance and waits for an approval, the person's answer is taken by the other, and both export
to one real OTLP/HTTP receiver. The answer's span belongs to the query's trace, under the wait
span of the instance that runs the query."""

from __future__ import annotations

import os
import secrets

import aiohttp

from tests.cluster.test_approvals import APPROVAL, approve, pending_request
from tests.cluster.test_scaleout import create_session, instance_env, payloads, read_events
from tests.support.instances import ServiceProcess
from tests.support.traces import SERVER, Received, Receiver, children, trace_of
from tests.transports import conftest as transports

receiver = transports.receiver  # the fixture: a real OTLP/HTTP receiver both instances export to

OTEL = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_SERVICE_NAME", "OTEL_BSP_SCHEDULE_DELAY")


async def test_an_answer_taken_by_the_other_instance_stays_in_the_querys_trace(
    receiver: Receiver, redis_url: str, redis_prefix: str
) -> None:
    env = instance_env(redis_url, redis_prefix, **APPROVAL, **{name: os.environ[name] for name in OTEL})
    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    async with ServiceProcess(env) as a, ServiceProcess(env) as b, aiohttp.ClientSession() as http:
        session_id = await create_session(http, a)
        async with http.post(
            f"{a.base_url}/sessions/{session_id}/messages",
            json={"content": "What is 6*7?"},
            headers={"traceparent": f"00-{trace_id}-{parent_id}-01"},
        ) as response:
            assert response.status == 202
        request = await pending_request(http, b, session_id)
        assert (await approve(http, b, session_id, request["approval_id"], True))[0] == 200
        events = payloads(await read_events(http, a, session_id))
        assert events[-1]["type"] == "done"

        def whole(spans: list[Received]) -> list[Received] | None:
            ours = trace_of(spans, trace_id)
            return (
                ours
                if any(s.name == "tool_approval_response calculator" for s in ours) and len(ours) == 7
                else None
            )

        spans = await receiver.wait_for(whole)
    (wait,) = [s for s in spans if s.name == "tool_approval calculator"]
    (answered,) = children(spans, wait)
    assert answered.name == "tool_approval_response calculator"
    # Two processes, one trace: the answer's span came from the other instance.
    assert answered.resource["service.instance.id"] != wait.resource["service.instance.id"]
    (server,) = [s for s in spans if s.kind == SERVER]
    assert server.parent_id == parent_id
