"""GET /metrics: Prometheus's text format, its figures checked against a known run."""

from __future__ import annotations

from typing import Any

from aiohttp.test_utils import TestClient
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import sse_events


async def scrape(client: TestClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with client.get("/metrics") as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = await response.text()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_metrics_add_up_to_a_known_run(client: TestClient) -> None:
    async with client.post("/sessions") as response:
        session_id = (await response.json())["id"]
    async with client.post(
        f"/sessions/{session_id}/messages", json={"content": "What is the square root of 144?"}
    ) as response:
        assert response.status == 202
    async with client.get(f"/sessions/{session_id}/events", headers={"Last-Event-ID": "0"}) as response:
        events = []
        async for event in sse_events(response):
            if not events:
                during = await scrape(client)  # scraped while the stream is open
            events.append(event)
    assert events[-1]["data"]["type"] == "done"
    async with client.get(f"/sessions/{session_id}/events/poll?since_index=0") as response:
        polled = (await response.json())["events"]
    mid = await scrape(client)
    # Every event the session logged is counted once, and every one sent is counted as delivered.
    session_events = int(events[-1]["id"])
    assert value(mid, "agentstream_events_appended_total") == session_events
    assert value(mid, "agentstream_events_delivered_total", transport="sse") == session_events
    assert value(mid, "agentstream_events_delivered_total", transport="poll") == len(polled) == session_events
    async with client.post("/agent/stream", json={"message": "hello there"}) as response:
        agent_events = [event async for event in sse_events(response)]
    after = await scrape(client)

    assert value(during, "agentstream_connections", transport="sse") == 1
    assert value(after, "agentstream_connections", transport="sse") == 0
    assert value(after, "agentstream_runs_started_total", agent="default") == 2
    assert value(after, "agentstream_runs_finished_total", outcome="done", code="", agent="default") == 2
    assert value(after, "agentstream_runs_active") == 0
    assert value(after, "agentstream_events_appended_total") > session_events
    assert value(after, "agentstream_events_delivered_total", transport="sse") == session_events + len(
        agent_events
    )
    # One calculator call, two model turns in the session's run, one in the short-lived one.
    assert value(after, "agentstream_tool_latency_seconds_count", tool="calculator", outcome="ok") == 1
    assert value(after, "agentstream_time_to_first_token_seconds_count", agent="default") == 2
    # Every model turn's tokens, by the agent that ran it: the two queries' usage, as their done says.
    usage = [events[-1]["data"]["usage"], agent_events[-1]["data"]["usage"]]
    for kind in ("input", "output"):
        counted = value(after, "agentstream_tokens_total", agent="default", kind=kind)
        assert counted == sum(each[f"{kind}_tokens"] for each in usage) > 0
    assert value(after, "agentstream_provider_latency_seconds_count") == 3
    assert value(after, "agentstream_event_loop_lag_seconds_count") > 0


async def test_errors_and_cancels_are_counted_by_outcome(client: TestClient) -> None:
    async with client.post(
        "/agent/stream", json={"message": "fail please [emu:fail=model_error]"}
    ) as response:
        [event async for event in sse_events(response)]
    async with client.post("/sessions") as response:
        session_id = (await response.json())["id"]
    await client.post(f"/sessions/{session_id}/messages", json={"content": "slow [emu:ttft=60000]"})
    async with client.post(f"/sessions/{session_id}/cancel") as response:
        assert (await response.json())["cancelled"] is True
    samples = await scrape(client)
    assert (
        value(samples, "agentstream_runs_finished_total", outcome="cancelled", code="", agent="default") == 1
    )
    errors = {
        labels: count
        for (name, labels), count in samples.items()
        if name == "agentstream_runs_finished_total" and ("outcome", "error") in labels
    }
    assert sum(errors.values()) == 1, errors


def test_delivered_events_are_counted_without_the_counter_until_a_scrape() -> None:
    """Per-token counting is a plain tally: one per transport, added to the counter when scraped."""
    from service.metrics import Metrics

    metrics = Metrics()
    sse = metrics.delivered("sse")
    assert metrics.delivered("sse") is sse
    for _ in range(5):
        sse.inc()
    metrics.delivered("ws").inc(3)
    assert metrics.events_delivered.labels("sse")._value.get() == 0  # nothing through the lock yet
    text = metrics.render().decode()
    assert 'agentstream_events_delivered_total{transport="sse"} 5.0' in text
    assert 'agentstream_events_delivered_total{transport="ws"} 3.0' in text
    sse.inc(2)
    assert 'agentstream_events_delivered_total{transport="sse"} 7.0' in metrics.render().decode()
