"""Prometheus metrics (``GET /metrics``) and the run observer that feeds most of them.

Each application has its own registry, so two services in one process (the tests) never mix
their figures. Counting is done where the work already is: the run manager tells the
:class:`Metrics` about each logged event and each finished run; transports count connections and
the events they write. What comes per token (events logged, events written to a client) is a
plain count, added to its counter once per scrape rather than through the counter's lock per
event. Figures that are a state rather than a count (runs active, sessions, event-log bytes) are
read when Prometheus scrapes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from service.core.events import (
    Event,
    PlanCreated,
    RunDone,
    RunError,
    TextDelta,
    ToolExecuting,
    ToolResult,
    TurnCompleted,
)
from service.core.model_calls import ModelCall

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Seconds: first tokens and model turns take from tens of ms to a minute; tools likewise.
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)
# OpenTelemetry's GenAI client metrics, with the bucket boundaries their conventions advise.
_TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)
_CALL_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
_CALL_LABELS = [
    "gen_ai_operation_name",
    "gen_ai_provider_name",
    "gen_ai_request_model",
    "gen_ai_response_model",
]


class _StateCollector(Collector):
    """Gauges computed at scrape time from callables (runs active, sessions, log bytes)."""

    def __init__(self, readers: dict[str, tuple[str, Callable[[], float | None]]]) -> None:
        self._readers = readers

    def collect(self) -> Iterator[GaugeMetricFamily]:
        for name, (help_text, read) in self._readers.items():
            value = read()
            if value is not None:
                yield GaugeMetricFamily(name, help_text, value=value)


class Tally:
    """A count kept since the last scrape for a counter that moves per token (events logged,
    events written over one transport): a plain integer per ``inc``, added to the counter, and
    its lock, once per scrape."""

    __slots__ = ("_counter", "pending")

    def __init__(self, counter: Counter) -> None:
        self._counter = counter
        self.pending = 0

    def inc(self, amount: int = 1) -> None:
        self.pending += amount

    def flush(self) -> None:
        """Add what was counted since the last flush to the counter."""
        pending, self.pending = self.pending, 0
        if pending:
            self._counter.inc(pending)


class Metrics:
    """The service's metrics in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        registry = self.registry
        self.connections = Gauge(
            "agentstream_connections", "Open streaming connections.", ["transport"], registry=registry
        )
        self.runs_started = Counter(
            "agentstream_runs_started", "Queries started, by agent.", ["agent"], registry=registry
        )
        self.runs_finished = Counter(
            "agentstream_runs_finished",
            "Queries ended, by outcome (done, cancelled, error), error code and agent.",
            ["outcome", "code", "agent"],
            registry=registry,
        )
        self.tokens = Counter(
            "agentstream_tokens",
            "Model tokens of the queries, by agent and kind (input, output).",
            ["agent", "kind"],
            registry=registry,
        )
        self.events_appended = Counter(
            "agentstream_events_appended", "Events logged by this instance's runs.", registry=registry
        )
        self.events_delivered = Counter(
            "agentstream_events_delivered", "Events written to clients.", ["transport"], registry=registry
        )
        self.first_token = Histogram(
            "agentstream_time_to_first_token_seconds",
            "From a query's start to its first text token, by agent.",
            ["agent"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.model_turn = Histogram(
            "agentstream_provider_latency_seconds",
            "A model turn's latency as the provider reports it.",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.tool_latency = Histogram(
            "agentstream_tool_latency_seconds",
            "Tool calls, from executing to result.",
            ["tool", "outcome"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        # gen_ai.client.token.usage and gen_ai.client.operation.duration, named as OpenTelemetry's
        # Prometheus exporter names them (dots to underscores, the unit "s" as a suffix).
        self.genai_tokens = Histogram(
            "gen_ai_client_token_usage",
            "Tokens of each model call, by token type (input, output) (OpenTelemetry GenAI).",
            [*_CALL_LABELS, "gen_ai_token_type"],
            buckets=_TOKEN_BUCKETS,
            registry=registry,
        )
        self.genai_duration = Histogram(
            "gen_ai_client_operation_duration_seconds",
            "Each model call's duration; error_type is empty when it succeeded (OpenTelemetry GenAI).",
            [*_CALL_LABELS, "error_type"],
            buckets=_CALL_BUCKETS,
            registry=registry,
        )
        self.loop_lag = Histogram(
            "agentstream_event_loop_lag_seconds",
            "How late the event loop wakes a task (sampled every 20 ms).",
            buckets=_LAG_BUCKETS,
            registry=registry,
        )
        self._state: dict[str, tuple[str, Callable[[], float | None]]] = {}
        registry.register(_StateCollector(self._state))
        # run id -> its start (until its first token), its agent, and (run id, tool use id) -> when
        # the tool began
        self._run_started: dict[str, float] = {}
        self._run_agent: dict[str, str] = {}
        self._tools_started: dict[tuple[str, str], float] = {}
        self._appended = Tally(self.events_appended)  # per token
        self._delivered: dict[str, Tally] = {}

    def track(self, name: str, help_text: str, read: Callable[[], float | None]) -> None:
        """Report ``read()`` as the gauge ``name`` at every scrape (``None`` leaves it out)."""
        self._state[name] = (help_text, read)

    def delivered(self, transport: str) -> Tally:
        """What counts the events written to clients over ``transport`` (one per transport)."""
        tally = self._delivered.get(transport)
        if tally is None:
            tally = self._delivered[transport] = Tally(self.events_delivered.labels(transport))
        return tally

    def render(self) -> bytes:
        """The registry in Prometheus's text format."""
        self._appended.flush()
        for tally in self._delivered.values():
            tally.flush()
        return generate_latest(self.registry)

    def model_call(self, call: ModelCall) -> None:
        """The agent loops' turn observer: one model call ended (succeeded, failed or cancelled)."""
        labels = ("chat", call.provider, call.model, call.response_model)
        self.genai_duration.labels(*labels, call.error_type).observe(call.duration_s)
        if call.usage is not None:
            self.genai_tokens.labels(*labels, "input").observe(call.usage.input_tokens)
            self.genai_tokens.labels(*labels, "output").observe(call.usage.output_tokens)

    # -- the run observer ---------------------------------------------------------------------

    def run_started(self, run_id: str, appended: int, agent: str = "") -> None:
        self.runs_started.labels(agent).inc()
        self._appended.inc(appended)
        self._run_started[run_id] = time.monotonic()
        self._run_agent[run_id] = agent

    def event_logged(self, run_id: str, event: Event) -> None:
        self._appended.inc()
        if isinstance(event, TextDelta):
            started = self._run_started.pop(run_id, None)
            if started is not None:
                self.first_token.labels(self._run_agent.get(run_id, "")).observe(time.monotonic() - started)
        elif isinstance(event, TurnCompleted | PlanCreated):
            agent = self._run_agent.get(run_id, "")
            self.tokens.labels(agent, "input").inc(event.usage.input_tokens)
            self.tokens.labels(agent, "output").inc(event.usage.output_tokens)
            if isinstance(event, TurnCompleted) and event.latency_ms is not None:
                self.model_turn.observe(event.latency_ms / 1000)
        elif isinstance(event, ToolExecuting):
            self._tools_started[(run_id, event.tool_use_id)] = time.monotonic()
        elif isinstance(event, ToolResult):
            began = self._tools_started.pop((run_id, event.tool_use_id), None)
            if began is not None:
                outcome = "error" if event.is_error else "ok"
                self.tool_latency.labels(event.tool, outcome).observe(time.monotonic() - began)

    def run_finished(self, run_id: str, terminal: Event, appended: int) -> None:
        self._appended.inc(appended)
        self._run_started.pop(run_id, None)
        agent = self._run_agent.pop(run_id, "")
        for key in [key for key in self._tools_started if key[0] == run_id]:
            del self._tools_started[key]
        if isinstance(terminal, RunDone):
            outcome, code = ("cancelled" if terminal.cancelled else "done"), ""
        elif isinstance(terminal, RunError):
            outcome, code = "error", terminal.code
        else:
            outcome, code = "error", "unknown"
        self.runs_finished.labels(outcome, code, agent).inc()
