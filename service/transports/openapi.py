"""``GET /openapi.json``: an OpenAPI 3.1 description of the HTTP routes.

This module is the route table: each operation's parameters, bodies and responses, next to the
contracts in ``../shared/DESIGN.md`` they follow. The schemas they name are generated from the
types the handlers and dialects use (see :mod:`service.transports.openapi_components`). The
WebSocket (``/ws``) and MCP (``/mcp``) faces are not plain HTTP operations and are only
described in the text.

The document is public (like ``/healthz``): it holds nothing secret, only what docs/api.md says.
It is built once per application, from that application's settings.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from service.config import Settings
from service.transports import openapi_protocols
from service.transports.context import CONTEXT
from service.transports.openapi_chat import chat_paths
from service.transports.openapi_components import (
    JSON,
    RETRY_AFTER,
    components,
    error,
    json_reply,
    ref,
    refs,
    sse,
)
from service.transports.sse import SELFTEST_MAX_INTERVAL_MS, SELFTEST_MAX_TICKS

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
`?token=` or the `agentstream_token` cookie). Without keys no credentials are needed.

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


def build_spec(settings: Settings) -> dict[str, Any]:
    """The OpenAPI 3.1 document for an application with these settings."""
    agent_body = ref("AgentRequest")
    message_body = ref("MessageRequest")
    session = {"$ref": "#/components/parameters/SessionId"}
    json_body = refs("BadRequest", "TooLarge", "Unprocessable")

    def body(schema: dict[str, Any], required: bool = True) -> dict[str, Any]:
        return {"required": required, "content": {JSON: {"schema": schema}}}

    common = refs("Unauthorized", "Forbidden", "TooManyRequests")
    public: dict[str, Any] = {"security": [], "responses": {}}

    paths: dict[str, Any] = {
        "/agent/stream": {
            "post": {
                "operationId": "agentStream",
                "summary": "Run a query and stream it (agent dialect)",
                "description": (
                    "A short-lived session runs the query; its events arrive as `data: {json}` "
                    "lines (no `event:` or `id:`), `done` or `error` last, then the stream closes. "
                    "A client that goes away cancels the query."
                ),
                "requestBody": body(agent_body),
                "responses": {
                    "200": sse(
                        "The run's events, `done` or `error` last.",
                        "AgentEvent",
                        "`data:` only (no `event:`, no `id:`).",
                    ),
                    **json_body,
                    **common,
                    **refs("Unavailable"),
                },
            }
        },
        "/agent/run": {
            "post": {
                "operationId": "agentRun",
                "summary": "Run a query and answer once (JSON)",
                "requestBody": body(agent_body),
                "responses": {
                    "200": json_reply("The run's whole text and its `done` fields.", "AgentRunResult"),
                    **json_body,
                    **common,
                    "503": error(
                        "The service is at a limit or its store is down (`Error`, with `Retry-After`), or "
                        "the run failed upstream (`AgentRunFailure`: `code`, `turns`, `response`, `usage`).",
                        {
                            "anyOf": [
                                ref("AgentRunFailure"),
                                ref("Error"),
                            ]
                        },
                        headers=RETRY_AFTER,
                    ),
                },
            }
        },
        "/sessions": {
            "get": {
                "operationId": "listSessions",
                "summary": "The caller's sessions, last updated first (needs the session database)",
                "parameters": [
                    {
                        "name": "limit",
                        "in": "query",
                        "required": False,
                        "schema": {"type": "integer", "minimum": 1, "description": "at most 100; default 20"},
                    },
                    {
                        "name": "before",
                        "in": "query",
                        "required": False,
                        "schema": {"type": "string", "description": "`next_before` of the page before"},
                    },
                ],
                "responses": {
                    "200": json_reply("A page of sessions.", "SessionList"),
                    "400": error("`limit` is not a positive integer, or `before` is not a cursor of ours."),
                    "501": error("`AGENT_DATABASE_URL` is empty: no session database to list from."),
                    **common,
                    **refs("Unavailable"),
                },
            },
            "post": {
                "operationId": "createSession",
                "summary": "Create a session",
                "requestBody": body(ref("CreateSessionRequest"), required=False),
                "responses": {
                    "201": json_reply("The new, idle session.", "SessionCreated"),
                    **refs("BadRequest", "TooLarge"),
                    "422": error("The body is JSON but not an object."),
                    **common,
                    **refs("Unavailable"),
                },
            },
        },
        "/sessions/{session_id}": {
            "parameters": [session],
            "get": {
                "operationId": "getSession",
                "summary": "A session's status and conversation",
                "responses": {
                    "200": json_reply("The session.", "Session"),
                    **common,
                    **refs("NotFound", "Unavailable"),
                },
            },
            "patch": {
                "operationId": "renameSession",
                "summary": "Rename a session (needs the session database)",
                "requestBody": body(ref("TitleRequest")),
                "responses": {
                    "200": json_reply("Renamed.", "SessionRenamed"),
                    **json_body,
                    "501": error("`AGENT_DATABASE_URL` is empty: no session database."),
                    **common,
                    **refs("NotFound", "Unavailable"),
                },
            },
            "delete": {
                "operationId": "deleteSession",
                "summary": "Delete a session (its running query is cancelled first)",
                "responses": {
                    "204": {"description": "Deleted."},
                    **common,
                    **refs("NotFound", "Unavailable"),
                },
            },
        },
        "/sessions/{session_id}/messages": {
            "parameters": [session],
            "post": {
                "operationId": "postMessage",
                "summary": "Start a query in the background",
                "description": (
                    "Each query sees the conversation so far. Follow it with "
                    "`GET /sessions/{id}/events` (`Last-Event-ID: after_id`) or polling "
                    "(`since_index=after_id`)."
                ),
                "requestBody": body(message_body),
                "responses": {
                    "202": json_reply("Accepted; the query runs.", "MessageAccepted"),
                    **json_body,
                    **common,
                    **refs("NotFound", "Conflict", "Unavailable"),
                },
            },
        },
        "/sessions/{session_id}/cancel": {
            "parameters": [session],
            "post": {
                "operationId": "cancelQuery",
                "summary": "Cancel the running query",
                "description": (
                    "Every subscriber sees `status_change: cancelled` and a `done` with "
                    "`cancelled: true`. No body is read."
                ),
                "responses": {
                    "202": json_reply(
                        "Asked; `cancelled` says whether a query was running.", "CancelAccepted"
                    ),
                    **common,
                    **refs("NotFound", "Unavailable"),
                },
            },
        },
        "/sessions/{session_id}/approvals/{approval_id}": {
            "parameters": [
                session,
                {"name": "approval_id", "in": "path", "required": True, "schema": {"type": "string"}},
            ],
            "post": {
                "operationId": "answerApproval",
                "summary": "Approve or deny a tool call that waits for a person",
                "description": (
                    "Answers the `tool_approval_request` with that `approval_id` (tools named in "
                    "`AGENT_TOOLS_REQUIRE_APPROVAL`); the answer is logged as `tool_approval_response` "
                    "and the query goes on. The same answer again is accepted; an edited `input` must "
                    "fit the tool's input schema (else 422)."
                ),
                "requestBody": body(ref("ApprovalAnswer")),
                "responses": {
                    "200": json_reply("Answered (now or before, the same way).", "ApprovalAnswered"),
                    **json_body,
                    **common,
                    "404": error("Unknown session or approval (or a session that is not the caller's)."),
                    "409": error("Answered otherwise already, or its query ended before it was answered."),
                    **refs("Unavailable"),
                },
            },
        },
        "/sessions/{session_id}/events": {
            "parameters": [session],
            "get": {
                "operationId": "sessionEvents",
                "summary": "Follow a session (SSE, session dialect), resumable",
                "description": (
                    "`id:` + `event:` (= type) + `data:`. A fresh connection to an idle session "
                    "gets one `status_change` and the close; mid-query, `status_change: running` "
                    "(no id), then every event until `done`. With `Last-Event-ID` (or "
                    "`?last_event_id=`): every event after it, then live, closing after the "
                    "`done` that ends the log. `heartbeat` {last_id, status} (no id) while idle; "
                    "`retry:` with the first frame. A reader that falls behind the purge horizon "
                    "gets an `error` event with `code: events_purged`."
                ),
                "parameters": [
                    {"$ref": "#/components/parameters/LastEventIdHeader"},
                    {"$ref": "#/components/parameters/LastEventIdQuery"},
                ],
                "responses": {
                    "200": sse(
                        "The session's events.",
                        "SessionStreamEvent",
                        "`event:` (the payload's `type`), `id:` for a logged event, `data:`; `retry:` with the first.",
                    ),
                    "204": {
                        "description": (
                            "The id given is already the last one and no query runs: nothing to "
                            "send (stops a browser's EventSource from reconnecting)."
                        )
                    },
                    **refs("BadRequest"),
                    **common,
                    **refs("NotFound", "Gone", "Unavailable"),
                },
            },
        },
        "/sessions/{session_id}/events/poll": {
            "parameters": [session],
            "get": {
                "operationId": "pollEvents",
                "summary": "Poll a session's events",
                "description": (
                    "The same log, ids and payloads as the SSE stream; SSE and polling may be mixed "
                    "with nothing lost or twice. From an index older than the oldest kept event it "
                    "starts at the oldest kept one with `purged: true` and a `snapshot`."
                ),
                "parameters": [
                    {"$ref": "#/components/parameters/SinceIndex"},
                    {"$ref": "#/components/parameters/Limit"},
                ],
                "responses": {
                    "200": json_reply("The events after `since_index`.", "Poll"),
                    **refs("BadRequest"),
                    **common,
                    **refs("NotFound", "Unavailable"),
                },
            },
        },
        "/sessions/{session_id}/stream": {
            "parameters": [session],
            "get": {
                "operationId": "stepsStream",
                "summary": "Start a query and stream its steps (SSE, steps dialect)",
                "parameters": [{"$ref": "#/components/parameters/Query"}],
                "responses": {
                    "200": sse(
                        "The query's steps, `done` or `error` last.",
                        "StepsEvent",
                        "`id:` (the session event's id) and `data:`.",
                    ),
                    **refs("BadRequest"),
                    **common,
                    **refs("NotFound", "Conflict"),
                    "422": error("The query is longer than `AGENT_MAX_MESSAGE_CHARS`."),
                    **refs("Unavailable"),
                },
            },
        },
        "/selftest/stream": {
            "get": {
                "operationId": "selftestStream",
                "summary": "Path check: timestamped ticks on a schedule (SSE)",
                "description": (
                    "No model, no session: `tick` events {n, of, ts, interval_ms} written "
                    "`interval_ms` apart (the last after an extra `idle_ms`), then `end`. Ticks "
                    "arriving together mean something on the way buffers; a `Content-Encoding` "
                    "means compression; a cut during `idle_ms` means something closes idle streams."
                ),
                "parameters": [
                    {
                        "name": "ticks",
                        "in": "query",
                        "schema": {
                            "type": "integer",
                            "minimum": 1,
                            "maximum": SELFTEST_MAX_TICKS,
                            "default": 20,
                        },
                    },
                    {
                        "name": "interval_ms",
                        "in": "query",
                        "schema": {
                            "type": "integer",
                            "minimum": 0,
                            "maximum": SELFTEST_MAX_INTERVAL_MS,
                            "default": 100,
                        },
                    },
                    {
                        "name": "idle_ms",
                        "in": "query",
                        "schema": {
                            "type": "integer",
                            "minimum": 0,
                            "maximum": SELFTEST_MAX_INTERVAL_MS * 5,
                            "default": 0,
                        },
                    },
                ],
                "responses": {
                    "200": sse(
                        "`tick` events, then `end`.",
                        "SelftestEvent",
                        "`event: tick` (with `id:`), or `event: end`.",
                    ),
                    **refs("BadRequest"),
                    **common,
                },
            }
        },
        "/healthz": {
            "get": {
                "operationId": "healthz",
                "summary": "Health (no key needed)",
                "security": [],
                "parameters": [
                    {
                        "name": "lag_since",
                        "in": "query",
                        "description": "A `time.monotonic()` reading: loop lag only from then on.",
                        "schema": {"type": "number"},
                    }
                ],
                "responses": {
                    "200": json_reply("Serving.", "Health"),
                    "400": error("`lag_since` is not a number."),
                    "503": json_reply(
                        "Degraded: the store (Redis) or the session database does not answer "
                        "(named in `unavailable`).",
                        "Health",
                    ),
                },
            }
        },
        "/metrics": {
            "get": {
                "operationId": "metrics",
                "summary": "Prometheus metrics (needs a key when keys are set)",
                "responses": {
                    "200": {
                        "description": "Prometheus text format.",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    },
                    **common,
                },
            }
        },
        "/auth/token": {
            "post": {
                "operationId": "issueToken",
                "summary": "Trade a key for a short-lived browser token",
                "description": (
                    "Send the key as `Authorization: Bearer <key>`. The token is also set as the "
                    "HttpOnly `agentstream_token` cookie; pass it as `?token=`, the cookie or a "
                    "Bearer value where headers can't be set (EventSource, WebSocket)."
                ),
                "responses": {
                    "200": json_reply("The token.", "Token"),
                    **common,
                    "404": error("No API keys are configured, so no token is needed."),
                },
            }
        },
        "/openapi.json": {
            "get": {
                "operationId": "openapi",
                "summary": "This document (no key needed)",
                **public,
                "responses": {
                    "200": {"description": "OpenAPI 3.1.", "content": {JSON: {"schema": {"type": "object"}}}},
                    **refs("Forbidden"),
                },
            }
        },
        "/": {
            "get": {
                "operationId": "browserClient",
                "summary": "The browser client (no key needed)",
                **public,
                "responses": {
                    "200": {
                        "description": "The chat page.",
                        "content": {"text/html": {"schema": {"type": "string"}}},
                    },
                    **refs("Forbidden"),
                },
            }
        },
    }
    paths.update(openapi_protocols.paths(settings, common))
    parts = components(settings)
    parts["schemas"].update(openapi_protocols.schemas())
    paths.update(chat_paths(settings))
    return {
        "openapi": "3.1.0",
        "info": {"title": "agentstream", "version": "0.1.0", "description": DESCRIPTION},
        "security": [{}, {"bearer": []}, {"token": []}, {"cookie": []}],
        "paths": paths,
        "components": parts,
    }


async def openapi_json(request: web.Request) -> web.Response:
    """``GET /openapi.json``: the document (public, like ``/healthz``)."""
    return web.Response(body=request.app[SPEC_KEY], content_type=JSON)


def add_routes(app: web.Application) -> None:
    """Register ``GET /openapi.json``, its document built now from the application's settings."""
    app[SPEC_KEY] = json.dumps(build_spec(app[CONTEXT].settings), indent=1).encode()
    app.router.add_get("/openapi.json", openapi_json)
