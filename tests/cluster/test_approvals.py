"""Tool approvals across two service processes on one real Redis.

An answer sent to the instance that does not run the query resumes it (the waiting run reads the
answer from the shared log); answering once holds across instances; and when the instance that
ran a waiting query dies, the query ends as interrupted instead of waiting for ever.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from tests.cluster.test_scaleout import (
    LOCK_TTL_S,
    create_session,
    instance_env,
    payloads,
    post_message,
    read_events,
)
from tests.support.instances import ServiceProcess

APPROVAL = {"AGENT_TOOLS_REQUIRE_APPROVAL": "calculator"}


def has(kind: str, count: int = 1) -> Any:
    return lambda events: sum(event["data"]["type"] == kind for event in events if "data" in event) >= count


async def pending_request(
    http: aiohttp.ClientSession, instance: ServiceProcess, session_id: str
) -> dict[str, Any]:
    events = await read_events(http, instance, session_id, stop=has("tool_approval_request"))
    return next(event for event in payloads(events) if event["type"] == "tool_approval_request")


async def approve(
    http: aiohttp.ClientSession, instance: ServiceProcess, session_id: str, approval_id: str, approved: bool
) -> tuple[int, dict[str, Any]]:
    url = f"{instance.base_url}/sessions/{session_id}/approvals/{approval_id}"
    async with http.post(url, json={"approved": approved}) as response:
        return response.status, await response.json()


async def test_an_answer_sent_to_the_other_instance_resumes_the_query(
    redis_url: str, redis_prefix: str
) -> None:
    env = instance_env(redis_url, redis_prefix, **APPROVAL)
    async with ServiceProcess(env) as a, ServiceProcess(env) as b, aiohttp.ClientSession() as http:
        session_id = await create_session(http, a)
        assert await post_message(http, a, session_id, "What is 6*7?") == 202
        request = await pending_request(http, b, session_id)
        async with http.get(f"{b.base_url}/sessions/{session_id}") as response:
            body = await response.json()
        assert body["status"] == "waiting"
        assert [pending["approval_id"] for pending in body["pending_approvals"]] == [request["approval_id"]]
        # Both instances answered at once, in opposite ways: exactly one answer wins.
        answers = await asyncio.gather(
            approve(http, b, session_id, request["approval_id"], True),
            approve(http, a, session_id, request["approval_id"], False),
        )
        statuses = sorted(status for status, _ in answers)
        assert statuses == [200, 409], answers
        won = next(reply for status, reply in answers if status == 200)
        events = payloads(await read_events(http, a, session_id))
        responses = [event for event in events if event["type"] == "tool_approval_response"]
        assert len(responses) == 1 and responses[0]["approved"] is won["approved"]
        result = next(event for event in events if event["type"] == "tool_result")
        assert (result["result"] == "42") is won["approved"]
        assert events[-1]["type"] == "done"
        # The same answer again, on either instance, is accepted; the other is a conflict.
        for instance in (a, b):
            assert (await approve(http, instance, session_id, request["approval_id"], won["approved"]))[
                0
            ] == 200
            assert (await approve(http, instance, session_id, request["approval_id"], not won["approved"]))[
                0
            ] == 409


async def test_a_waiting_query_whose_instance_dies_ends_as_interrupted(
    redis_url: str, redis_prefix: str
) -> None:
    env = instance_env(redis_url, redis_prefix, **APPROVAL)
    async with ServiceProcess(env) as a, ServiceProcess(env) as b, aiohttp.ClientSession() as http:
        session_id = await create_session(http, a)
        assert await post_message(http, a, session_id, "What is 6*7?") == 202
        request = await pending_request(http, b, session_id)
        watched = asyncio.ensure_future(read_events(http, b, session_id, stop=has("error")))
        await a.akill()
        events = payloads(await asyncio.wait_for(watched, LOCK_TTL_S * 10))
        assert events[-1]["type"] == "error" and events[-1]["code"] == "interrupted"
        async with http.get(f"{b.base_url}/sessions/{session_id}") as response:
            body = await response.json()
        assert body["status"] == "idle" and body["pending_approvals"] == []
        status, reply = await approve(http, b, session_id, request["approval_id"], True)
        assert status == 409 and "no longer pending" in reply["error"]
        # The session goes on: a new query runs on the surviving instance.
        assert await post_message(http, b, session_id, "still there? [emu:tokens=3]") == 202
