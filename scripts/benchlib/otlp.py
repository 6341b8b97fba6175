"""An OTLP/HTTP trace receiver for the benchmarks, run as a process of its own so that decoding
what the service exports costs the service nothing: ``POST /v1/traces`` takes an
``ExportTraceServiceRequest`` in protobuf (opentelemetry-proto) and counts its spans by name;
``GET /spans`` answers the counts so far as JSON (``{"total": N, "by_name": {...}}``).

    python scripts/benchlib/otlp.py --port 4318
"""

from __future__ import annotations

import argparse
from collections import Counter

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

RECEIVED = web.AppKey("received", Counter)
ANSWER = ExportTraceServiceResponse().SerializeToString()


async def export(request: web.Request) -> web.Response:
    """One export: every span of every resource and scope counted under its name."""
    message = ExportTraceServiceRequest()
    message.ParseFromString(await request.read())
    received = request.app[RECEIVED]
    for resource_spans in message.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            received.update(span.name for span in scope_spans.spans)
    return web.Response(body=ANSWER, content_type="application/x-protobuf")


async def spans(request: web.Request) -> web.Response:
    received = request.app[RECEIVED]
    return web.json_response({"total": received.total(), "by_name": dict(received)})


def app() -> web.Application:
    application = web.Application(client_max_size=64 * 1024 * 1024)
    application[RECEIVED] = Counter()
    application.router.add_post("/v1/traces", export)
    application.router.add_get("/spans", spans)
    return application


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    web.run_app(app(), host="127.0.0.1", port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
