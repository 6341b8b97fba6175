"""``/v1/responses`` driven by the AI SDK's OpenAI provider, unmodified: npm ``@ai-sdk/openai`` 3
on ``ai`` 6 and 4 on ``ai`` 7 (under Node 22), ``streamText`` on its Responses model, run by ``node``
from tests/node/ against the service on a real port with the embedded emulator. Without Node or
the npm packages these tests skip, or fail with ``CI=true`` (see :mod:`tests.support.node`).

The emulator echoes a tool's result into its answer, so a result only the AI SDK's tool could know
(a fresh token) found in the final answer went through the model.
"""

from __future__ import annotations

import uuid

import pytest
from aiohttp.test_utils import TestClient

from tests.support.node import AI_MAJORS, require_node, run_node
from tests.transports.test_responses_sdks import ASK_WEATHER, conversation, logged, tool_results


@pytest.fixture(params=AI_MAJORS, ids=[f"ai{major}" for major in AI_MAJORS])
def ai(request: pytest.FixtureRequest) -> int:
    """The major version of npm ``ai`` (with its ``@ai-sdk/openai``) the script runs on."""
    return int(request.param)


def base_url(client: TestClient) -> str:
    return str(client.make_url("")).rstrip("/")


async def test_ai_sdk_streams_the_answer_the_service_logged(client: TestClient, ai: int) -> None:
    require_node()
    result = await run_node(
        "responses_text.mjs",
        base_url(client),
        "-",
        "Tell me something [emu:tokens=6]",
        "And then? [emu:say=That is all]",
        ai=ai,
    )
    first, second = result["turns"]
    assert first["errors"] == [] and second["errors"] == []
    assert first["parts"][:3] == ["start", "start-step", "text-start"]
    assert first["parts"][-3:] == ["text-end", "finish-step", "finish"]
    assert first["parts"].count("text-delta") == 6
    assert first["finishReason"] == "stop" and first["streamed"] == first["text"]
    response = await (await client.get(f"/v1/responses/{first['responseId']}")).json()
    log = await logged(client, response["session_id"])
    [done] = [event for event in log if event["type"] == "done"]
    assert first["text"] == done["output"]
    assert first["text"] == "".join(event["text"] for event in log if event["type"] == "assistant_text")
    assert first["usage"]["totalTokens"] == done["usage"]["total_tokens"]
    # The next turn sends the first answer back by its item's id; the service reads its text.
    [answer] = response["output"]
    assert {"type": "item_reference", "id": answer["id"]} in second["input"]
    assert second["text"] == "That is all"
    later = await (await client.get(f"/v1/responses/{second['responseId']}")).json()
    messages = await conversation(client, later["session_id"])
    assert [(m["role"], m["content"][0]["text"]) for m in messages][1:] == [
        ("assistant", first["text"]),
        ("user", "And then? [emu:say=That is all]"),
        ("assistant", "That is all"),
    ]


@pytest.mark.parametrize("reasoning", [False, True], ids=["plain", "reasoning"])
async def test_ai_sdk_runs_its_tool_and_the_next_step_sends_the_output(
    client: TestClient, ai: int, reasoning: bool
) -> None:
    require_node()
    forecast = f"hail-{uuid.uuid4().hex[:10]}"
    prompt = ASK_WEATHER + (" [emu:reasoning]" if reasoning else "")
    result = await run_node("responses_tools.mjs", base_url(client), "-", prompt, forecast, ai=ai)
    assert result["errors"] == []
    assert result["ran"] == ["Paris"]  # the AI SDK ran its own tool
    first, second = result["steps"]
    assert first["finishReason"] == "tool-calls"
    [call] = first["toolCalls"]
    assert (call["toolName"], call["input"]) == ("get_weather", {"city": "Paris"})
    assert first["toolResults"] == [{"toolCallId": call["toolCallId"], "output": f"{forecast} in Paris"}]
    assert second["input"][-1] == {
        "type": "function_call_output",
        "call_id": call["toolCallId"],
        "output": f"{forecast} in Paris",
    }
    # A reasoning step's item goes back by reference; the service leaves it out, as OpenAI's
    # reasoning items sent in full are.
    references = [item for item in second["input"] if item.get("type") == "item_reference"]
    assert [item["id"][:3] for item in references] == (["rs_"] if reasoning else [])
    assert second["finishReason"] == "stop"
    assert f"{forecast} in Paris" in second["text"] and result["text"] == second["text"]
    response = await (await client.get(f"/v1/responses/{second['responseId']}")).json()
    assert tool_results(await conversation(client, response["session_id"])) == [f"{forecast} in Paris"]
