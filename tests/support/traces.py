"""A real OTLP/HTTP trace collector for tests: an aiohttp handler that decodes the exported
protobuf with opentelemetry-proto and flattens each span, and a condition to wait on what it got.
The ``receiver`` and ``traced`` fixtures (tests/transports/conftest.py) point a service at one."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan
from opentelemetry.proto.trace.v1.trace_pb2 import Status

SERVER, INTERNAL, CLIENT = (
    ProtoSpan.SPAN_KIND_SERVER,
    ProtoSpan.SPAN_KIND_INTERNAL,
    ProtoSpan.SPAN_KIND_CLIENT,
)
ERROR = Status.STATUS_CODE_ERROR


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(item) for item in value.array_value.values)
    return getattr(value, kind) if kind else None


@dataclass
class Received:
    """One exported span, flattened."""

    name: str
    kind: int
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]
    status: int
    events: list[tuple[str, dict[str, Any]]]
    resource: dict[str, Any]
    links: list[tuple[str, str]] = field(default_factory=list)  # (trace id, span id)


@dataclass
class Receiver:
    """An OTLP/HTTP trace collector: what it was sent, and a condition to wait on it."""

    spans: list[Received] = field(default_factory=list)
    content_types: set[str] = field(default_factory=set)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def handle(self, request: web.Request) -> web.Response:
        self.content_types.add(request.content_type)
        export = ExportTraceServiceRequest()
        export.ParseFromString(await request.read())
        for resource_spans in export.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    self.spans.append(
                        Received(
                            name=span.name,
                            kind=span.kind,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_id=span.parent_span_id.hex(),
                            attributes={a.key: _value(a.value) for a in span.attributes},
                            status=span.status.code,
                            events=[
                                (e.name, {a.key: _value(a.value) for a in e.attributes}) for e in span.events
                            ],
                            resource=resource,
                            links=[(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
                        )
                    )
        async with self.changed:
            self.changed.notify_all()
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(), content_type="application/x-protobuf"
        )

    async def wait_for(self, found: Callable[[list[Received]], Any]) -> Any:
        """Wait until ``found`` returns something truthy for the spans received; return that."""
        async with asyncio.timeout(10), self.changed:
            result = found(self.spans)
            while not result:
                await self.changed.wait()
                result = found(self.spans)
        return result

    def named(self, name: str) -> list[Received]:
        return [span for span in self.spans if span.name == name]


def trace_of(spans: list[Received], trace_id: str) -> list[Received]:
    return [span for span in spans if span.trace_id == trace_id]


def children(spans: list[Received], parent: Received) -> list[Received]:
    return [span for span in spans if span.parent_id == parent.span_id]
