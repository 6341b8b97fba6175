"""OpenTelemetry's GenAI client metrics in GET /metrics: one observation per model turn, its
tokens as the query's ``done`` tells them, and how a failed or cancelled turn ended."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient

from tests.conftest import ClientFactory, services_of, stream_agent
from tests.support.sessions import cancel_mid_answer
from tests.transports.test_agents import agents_file
from tests.transports.test_metrics import scrape, value

TOKENS = "gen_ai_client_token_usage"
DURATION = "gen_ai_client_operation_duration_seconds"


def call_labels(
    client: TestClient, agent: str = "default", provider: str = "aws.bedrock", *, answered: bool = True
) -> dict[str, str]:
    """The labels of a model call; a call that failed before the model answered names no
    response model."""
    loop, _ = services_of(client).catalog.resolve(agent)
    model = loop.model or loop.provider.model_id
    assert model
    return {
        "gen_ai_operation_name": "chat",
        "gen_ai_provider_name": provider,
        "gen_ai_request_model": model,
        "gen_ai_response_model": model if answered else "",
    }


def series(samples: dict[Any, float], name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: count for (sample, labels), count in samples.items() if sample == name}


async def test_each_model_turn_is_observed_with_the_tokens_the_query_reports(client: TestClient) -> None:
    events = await stream_agent(client, "What is 17 * 3?")  # a calculator call: two model turns
    assert events[-1]["type"] == "done"
    usage = events[-1]["usage"]
    samples = await scrape(client)
    labels = call_labels(client)

    assert value(samples, f"{DURATION}_count", **labels, error_type="") == 2
    assert value(samples, f"{DURATION}_sum", **labels, error_type="") > 0
    assert value(samples, f"{DURATION}_bucket", **labels, error_type="", le="+Inf") == 2
    for kind in ("input", "output"):
        kind_labels = {**labels, "gen_ai_token_type": kind}
        assert value(samples, f"{TOKENS}_count", **kind_labels) == 2
        assert value(samples, f"{TOKENS}_sum", **kind_labels) == usage[f"{kind}_tokens"] > 0
    # The conventions' bucket boundaries, in the exporter's names.
    token_bounds = {dict(key)["le"] for key in series(samples, f"{TOKENS}_bucket")}
    assert {"1.0", "1024.0", "6.7108864e+07", "+Inf"} <= token_bounds and len(token_bounds) == 15
    duration_bounds = {dict(key)["le"] for key in series(samples, f"{DURATION}_bucket")}
    assert {"0.01", "0.64", "81.92", "+Inf"} <= duration_bounds and len(duration_bounds) == 15


async def test_a_throttled_then_failed_turn_counts_with_its_error_type(client: TestClient) -> None:
    events = await stream_agent(client, "Say something [emu:throttle] [emu:fail_after=0]")
    assert events[-1]["type"] == "error" and events[-1]["code"] == "throttlingException"
    samples = await scrape(client)
    labels = call_labels(client, answered=False)
    # One model call, its retries within it; no tokens, the model reported none.
    assert series(samples, f"{DURATION}_count") == {
        tuple(sorted({**labels, "error_type": "throttlingException"}.items())): 1
    }
    assert series(samples, f"{TOKENS}_count") == {}


async def test_a_cancelled_turn_counts_as_cancelled(client: TestClient) -> None:
    await cancel_mid_answer(client)
    samples = await scrape(client)
    assert (
        value(samples, f"{DURATION}_count", **call_labels(client, answered=False), error_type="cancelled")
        == 1
    )
    assert series(samples, f"{TOKENS}_count") == {}


async def test_an_agent_on_the_openai_wire_is_labelled_openai(
    make_client: ClientFactory, tmp_path: Path
) -> None:
    client = await make_client(agents_file=str(agents_file(tmp_path)))
    events = await stream_agent(client, "Hello [emu:tokens=3]", agent="research")
    assert events[-1]["type"] == "done"
    samples = await scrape(client)
    labels = call_labels(client, "research", provider="openai")
    assert labels["gen_ai_request_model"] == "research-model"
    assert value(samples, f"{DURATION}_count", **labels, error_type="") == 1
    output = {**labels, "gen_ai_token_type": "output"}
    assert value(samples, f"{TOKENS}_sum", **output) == events[-1]["usage"]["output_tokens"] > 0
