"""``GET /openapi.json``: an OpenAPI 3.1 description of the HTTP routes.

This module is the route table: each operation's parameters, bodies and responses, next to the
contracts in ``../shared/DESIGN.md`` they follow. The schemas they name are generated from the
types the handlers and dialects use (see :mod:`service.transports.openapi.components`). The
WebSocket (``/ws``) and MCP (``/mcp``) faces are not plain HTTP operations and are only
described in the text.

The document is public (like ``/healthz``): it holds nothing secret, only what docs/api.md says.
It is built once per application, from that application's settings.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from aiohttp import web

from service.config import Settings
from service.transports.edge.context import CONTEXT
from service.transports.edge.openapi import JSON, Fragment, Parts
from service.transports.openapi.components import components

SPEC_KEY = web.AppKey("openapi_spec", bytes)

DESCRIPTION = """\
Streams an LLM agent's work (model, then tools, then model again) as it happens.

**Errors.** Every error body is JSON `{"error": "<message>"}`, sometimes with more fields: 400 bad
input (malformed or empty JSON, a bad parameter), 401 no or bad key, 403 origin refused,
404 unknown route or session (or one that is not the caller's), 405 wrong method, 409 a query
already running, 410 events purged, 413 body too large, 422 a JSON body of the wrong shape (with
`details` naming each field), 429 over a key's quota (when quotas are set; with `Retry-After`),
503 a dependency down or the service at a limit (with `Retry-After`). A failure after a stream
has started is an `error` event, never a broken connection. Limits shown in this document
(lengths, sizes) are this instance's settings. The `/v1` routes (OpenAI Chat Completions) answer
every error in OpenAI's shape instead, `{"error": {"message", "type", "code", "param"}}`, a wrong
shape as a 400.

**Access.** With `AGENT_API_KEYS` set, every route but `/healthz`, `/openapi.json` and the page
needs a key: `Authorization: Bearer <key>`, or a token from `POST /auth/token` (as a Bearer value,
`?token=` or the `agentstream_token` cookie). With `AGENT_JWT_SECRET` or `AGENT_JWKS_URL` set, a
signed-in user's JWT is accepted the same ways, and its `sub` (scoped by `iss`) owns sessions as a
key does; a refused token is a 401 whose `WWW-Authenticate` says why (RFC 6750 `invalid_token`).
A stream opened with a token ends at its expiry (`token_expired`). Without either no credentials
are needed.

**Event ids.** Per session, integers from 1, strictly increasing, never reused: the same number is
the SSE `id:`, the WebSocket `id` and the polling index.

**Not described as operations:**
- `GET /ws`: a WebSocket with JSON text frames. Client messages `subscribe` (`session_id`,
  `last_event_id`?), `unsubscribe`, `message` (`session_id`, `content`), `cancel`, `approve`
  (`session_id`, `approval_id`, `approved`, `reason`?, `input`?), `run` (`message`,
  `max_turns`?), `ping`; the server sends each session event as
  `{"session_id", "id", "type", ...}`, acknowledgements, `pong`, and
  `{"type": "error", "error", "code", "request_type"}` for a bad message (the socket stays open).
  A binary frame closes it with 1003, an oversized one with 1009.
- `POST|GET|DELETE /mcp`: the MCP Streamable HTTP face (JSON-RPC), sessions as MCP tools and
  events as log notifications.
"""


def build_spec(settings: Settings, fragments: Sequence[Fragment]) -> dict[str, Any]:
    """The OpenAPI 3.1 document for an application with these settings: each face's fragment of
    ``paths``, and the schemas, responses and parameters they name."""
    parts = Parts()
    paths: dict[str, Any] = {}
    for fragment in fragments:
        paths.update(fragment.paths(settings, parts))
    return {
        "openapi": "3.1.0",
        "info": {"title": "agentstream", "version": "0.1.0", "description": DESCRIPTION},
        "security": [{}, {"bearer": []}, {"token": []}, {"cookie": []}],
        "paths": paths,
        "components": components(settings, fragments),
    }


async def openapi_json(request: web.Request) -> web.Response:
    """``GET /openapi.json``: the document (public, like ``/healthz``)."""
    return web.Response(body=request.app[SPEC_KEY], content_type=JSON)


def add_routes(app: web.Application, fragments: Sequence[Fragment]) -> None:
    """Register ``GET /openapi.json``, its document built now from the application's settings
    and the faces' fragments."""
    app[SPEC_KEY] = json.dumps(build_spec(app[CONTEXT].settings, fragments), indent=1).encode()
    app.router.add_get("/openapi.json", openapi_json)
