"""New requests admitted a few per turn of the event loop.

Setting up a stream (reading the request, making its session, starting its run, writing the
response's head) is all one step of the request's task. Two hundred requests that arrive
together (a page of users, a reconnecting load balancer, a benchmark's batch) would make one long
turn, during which no token of a stream already running goes out: under paced load that turn
sets the loop lag's p99 (measured: docs/benchmarks.md, section Bursts, request admission and the
middle GC generation (16612c5)). Through :class:`~service.core.admission.Admission` at most
:data:`PER_TURN` requests start per turn; the rest wait, in arrival order, for the following
turns, between which the loop writes the tokens that came meanwhile. A request alone is not
delayed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from service.core.admission import Admission

PER_TURN = 8
REQUEST_ADMISSION = web.AppKey("request_admission", Admission)
# Answered at once whatever is queued: health checks and scrapes measure the service, not the line.
EXEMPT_PATHS = frozenset({"/healthz", "/metrics"})


@web.middleware
async def admission_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Wait for this request's turn (see the module), then handle it."""
    if request.path not in EXEMPT_PATHS:
        await request.app[REQUEST_ADMISSION].enter()
    return await handler(request)
