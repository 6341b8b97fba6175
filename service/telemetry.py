"""OpenTelemetry's SDK, set up from the standard environment variables when traces have
somewhere to go, and nothing at all otherwise.

Traces are on when ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT`` is
set and ``OTEL_SDK_DISABLED`` is not true. The SDK itself reads the rest: the endpoint and
``OTEL_EXPORTER_OTLP_HEADERS`` (the exporter), ``OTEL_SERVICE_NAME`` and
``OTEL_RESOURCE_ATTRIBUTES`` (the resource), ``OTEL_TRACES_SAMPLER`` and its argument (the
sampler), ``OTEL_BSP_*`` (the batch processor). Spans go out over OTLP/HTTP in protobuf.

The provider is the app's own, handed to what starts spans, and not installed as the process's
global one: OpenTelemetry lets the global be set once per process, and several apps (a test
suite's) each export to their own collector.

This is the only module that imports the SDK (tests/test_structure.py); the rest of the
service uses the API through :mod:`service.core.traces`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from dataclasses import dataclass

from opentelemetry.trace import Tracer

from service.core.traces import NO_TRACER

log = logging.getLogger(__name__)

SCOPE = "agentstream"
DEFAULT_SERVICE_NAME = "agentstream"
ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


@dataclass
class Telemetry:
    """The tracer the app hands out, and the provider behind it (None when traces are off)."""

    tracer: Tracer = NO_TRACER
    provider: object | None = None

    @property
    def enabled(self) -> bool:
        return self.provider is not None

    async def flush(self, timeout_s: float = 10.0) -> bool:
        """Export every ended span now. The exporter's HTTP call blocks, so it runs in a thread:
        the collector may be served by this very event loop (a test's)."""
        if self.provider is None:
            return True
        return await asyncio.to_thread(self.provider.force_flush, int(timeout_s * 1000))  # type: ignore[attr-defined]

    async def shutdown(self) -> None:
        """Flush what is left and stop the exporter (at the app's stop)."""
        if self.provider is not None:
            provider, self.provider = self.provider, None
            await asyncio.to_thread(provider.shutdown)  # type: ignore[attr-defined]


def _true(value: str | None) -> bool:
    return (value or "").strip().lower() == "true"


def configure_telemetry() -> Telemetry:
    """The telemetry the environment asks for: off (the API's no-op tracer, no SDK object made)
    unless an OTLP endpoint is set."""
    env = os.environ
    if _true(env.get("OTEL_SDK_DISABLED")) or not any(env.get(name) for name in ENDPOINT_VARIABLES):
        return Telemetry()
    # Imported here: with traces off the SDK is never loaded.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_INSTANCE_ID, SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    # Resource.create reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; a service named by
    # neither is called ours rather than the SDK's "unknown_service".
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    # Which instance (process) a span came from, when a query's trace crosses several of them.
    if SERVICE_INSTANCE_ID not in resource.attributes:
        resource = resource.merge(Resource({SERVICE_INSTANCE_ID: uuid.uuid4().hex}))
    provider = TracerProvider(resource=resource)  # its sampler: OTEL_TRACES_SAMPLER
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    endpoint = env.get(ENDPOINT_VARIABLES[0]) or env.get(ENDPOINT_VARIABLES[1])
    log.info("traces go to %s (OTLP/HTTP)", endpoint)
    return Telemetry(tracer=provider.get_tracer(SCOPE), provider=provider)
