"""The quotas at the edge: every request counted against its owner's per-minute quota, and every
refusal (streams, runs, requests, tokens; see :mod:`service.quotas`) answered the same way."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from service.errors import QuotaExceeded
from service.quotas.local import Quotas
from service.transports.edge.auth import PUBLIC_PATHS, PUBLIC_PREFIXES, owner_of

QUOTAS = web.AppKey("quotas", Quotas)


def quota_fields(exc: QuotaExceeded) -> dict[str, Any]:
    """What a refusal says besides its message, on every wire."""
    return {"code": "quota_exceeded", "quota": exc.quota, "limit": exc.limit, "retry_after": exc.retry_after}


def quota_response(exc: QuotaExceeded) -> web.Response:
    """The 429 reply to a refusal."""
    return web.json_response(
        {"error": exc.message, **quota_fields(exc)},
        status=429,
        headers={"Retry-After": str(exc.retry_after)},
    )


@web.middleware
async def quota_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Count the request against its owner's per-minute quota (what needs no key is exempt:
    ``/healthz``, the page), and answer any refusal raised while handling it (streams, runs,
    tokens) with the 429.

    Installed inside the access middleware: it needs the owner, unauthenticated requests never
    reach it, and the 429 gets the CORS headers that let a browser read ``Retry-After``.
    """
    try:
        path = request.path
        if path not in PUBLIC_PATHS and not path.startswith(PUBLIC_PREFIXES):
            await request.app[QUOTAS].count_request(owner_of(request))
        return await handler(request)
    except QuotaExceeded as exc:
        return quota_response(exc)
