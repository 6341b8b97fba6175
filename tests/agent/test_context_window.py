"""A conversation longer than the model's window keeps answering: the oldest whole turns are left
out of what is sent (``context_trimmed``), never a tool call without its result; the session
keeps every message. The emulator refuses input past its window as Bedrock does."""

from __future__ import annotations

from typing import Any

from service.agent.context import ContextWindow, starts_turn
from tests.conftest import ClientFactory, services_of

QUESTIONS = [f"Tell me fact number {n} please" for n in range(14)]


async def converse(client: Any, questions: list[str]) -> tuple[str, list[dict[str, Any]]]:
    """Ask each question in one session; the session id and every event logged."""
    async with client.post("/sessions", json={}) as response:
        sid = (await response.json())["id"]
    for question in questions:
        async with client.post(f"/sessions/{sid}/messages", json={"content": question}) as response:
            assert response.status == 202
        run = services_of(client).runs.get(sid)
        if run is not None:
            await run.wait()
    async with client.get(
        f"/sessions/{sid}/events/poll", params={"since_index": 0, "limit": 100000}
    ) as response:
        events = (await response.json())["events"]
    return sid, events


async def test_the_model_refuses_a_conversation_past_its_window(make_client: ClientFactory) -> None:
    client = await make_client(emulator_context_tokens=400)  # and the service's own limit: the model's
    _, events = await converse(client, QUESTIONS)
    errors = [event for event in events if event["type"] == "error"]
    assert errors and "Input is too long" in errors[0]["message"]
    assert not any(event["type"] == "context_trimmed" for event in events)


async def test_a_small_context_budget_keeps_the_conversation_answering(make_client: ClientFactory) -> None:
    client = await make_client(emulator_context_tokens=400, context_max_tokens=320)
    sid, events = await converse(client, [*QUESTIONS[:6], "What is 12*12?", *QUESTIONS[6:]])
    assert [event for event in events if event["type"] == "error"] == []
    assert sum(event["type"] == "done" for event in events) == len(QUESTIONS) + 1
    trims = [event for event in events if event["type"] == "context_trimmed"]
    assert trims and all(t["max_tokens"] == 320 and t["estimated_tokens"] <= 320 for t in trims)
    assert trims[-1]["dropped_messages"] > trims[0]["dropped_messages"]
    async with client.get(f"/sessions/{sid}") as response:
        messages = (await response.json())["messages"]
    assert len(messages) == 2 * (len(QUESTIONS) + 1) + 2  # all kept; the calculator turn has two more
    for trim in trims:  # each window starts at a question a person asked
        assert starts_turn(messages[trim["dropped_messages"]])
    usages = [event for event in events if event["type"] == "usage"]
    assert max(u["usage"]["input_tokens"] for u in usages) <= 400


def test_the_window_never_parts_a_tool_call_from_its_result() -> None:
    def user(text: str) -> dict[str, Any]:
        return {"role": "user", "content": [{"text": text}]}

    call = {
        "role": "assistant",
        "content": [{"toolUse": {"toolUseId": "t", "name": "calculator", "input": {}}}],
    }
    result = {"role": "user", "content": [{"toolResult": {"toolUseId": "t", "content": [{"text": "4"}]}}]}
    answer = {"role": "assistant", "content": [{"text": "It is four. " * 20}]}
    messages = [user("2+2?"), call, result, answer, user("hi " * 30), answer, user("last")]
    window = ContextWindow(max_tokens=10**6).fit(messages, "", [])
    assert window.dropped == 0
    for budget in range(1, 400, 7):
        cut = ContextWindow(max_tokens=budget).fit(messages, "", []).dropped
        assert cut in (0, 4, 6)  # only at a person's question; at worst the turn in progress alone
    tight = ContextWindow(max_tokens=1)
    assert tight.fit(messages, "", []).dropped == 6
    tight.learn(tight.fit(messages, "", []), 1000)
    assert tight.tokens_per_char > 1
