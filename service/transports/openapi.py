"""``GET /openapi.json``: an OpenAPI 3.1 description of the HTTP routes.

The request bodies come from the pydantic models the handlers validate with
(``model_json_schema``), tightened with what the handlers check on top (no blank text, the
configured length limit); responses, parameters and the SSE streams are described by hand here,
next to the contracts in ``../shared/DESIGN.md`` they follow. The WebSocket (``/ws``) and MCP
(``/mcp``) faces are not plain HTTP operations and are only described in the text.

The document is public (like ``/healthz``): it holds nothing secret, only what docs/api.md says.
It is built once per application, from that application's settings.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web
from pydantic import BaseModel

from service.config import Settings
from service.transports.context import CONTEXT
from service.transports.inputs import AgentRequest, MessageRequest
from service.transports.sse import SELFTEST_MAX_INTERVAL_MS, SELFTEST_MAX_TICKS

SPEC_KEY = web.AppKey("openapi_spec", bytes)

JSON = "application/json"
SSE = "text/event-stream"
REF = "#/components/schemas/{model}"

DESCRIPTION = """\
Streams an LLM agent's work (model, then tools, then model again) as it happens.

**Errors.** Every error body is JSON `{"error": "<message>"}`, sometimes with more fields: 400 bad
input (malformed or empty JSON, a bad parameter), 401 no or bad key, 403 origin refused,
404 unknown route or session (or one that is not the caller's), 405 wrong method, 409 a query
already running, 410 events purged, 413 body too large, 422 a JSON body of the wrong shape (with
`details` naming each field), 429 over a key's quota (when quotas are set; with `Retry-After`),
503 a dependency down or the service at a limit (with `Retry-After`). A failure after a stream
has started is an `error` event, never a broken connection. Limits shown in this document
(lengths, sizes) are this instance's settings.

**Access.** With `AGENT_API_KEYS` set, every route but `/healthz`, `/openapi.json` and the page
needs a key: `Authorization: Bearer <key>`, or a token from `POST /auth/token` (as a Bearer value,
`?token=` or the `agentstream_token` cookie). Without keys no credentials are needed.

**Event ids.** Per session, integers from 1, strictly increasing, never reused: the same number is
the SSE `id:`, the WebSocket `id` and the polling index.

**Not described as operations:**
- `GET /ws`: a WebSocket with JSON text frames. Client messages `subscribe` (`session_id`,
  `last_event_id`?), `unsubscribe`, `message` (`session_id`, `content`), `cancel`, `run`
  (`message`, `max_turns`?), `ping`; the server sends each session event as
  `{"session_id", "id", "type", ...}`, acknowledgements, `pong`, and
  `{"type": "error", "error", "code", "request_type"}` for a bad message (the socket stays open).
  A binary frame closes it with 1003, an oversized one with 1009.
- `POST|GET|DELETE /mcp`: the MCP Streamable HTTP face (JSON-RPC), sessions as MCP tools and
  events as log notifications.
"""


def _model_schema(model: type[BaseModel], components: dict[str, Any]) -> dict[str, Any]:
    """``model``'s JSON schema, its definitions moved into ``components``; a ``$ref`` to it."""
    schema = model.model_json_schema(ref_template=REF)
    for name, definition in schema.pop("$defs", {}).items():
        components[name] = definition
    components[model.__name__] = schema
    return {"$ref": REF.format(model=model.__name__)}


def _text_field(schema: dict[str, Any], field: str, settings: Settings) -> None:
    """What the handlers check beyond the model: not blank, and at most the configured length."""
    prop = schema["properties"][field]
    prop["pattern"] = r"\S"
    prop["maxLength"] = settings.max_message_chars
    prop["description"] = (
        f"Not blank; at most {settings.max_message_chars} characters (`AGENT_MAX_MESSAGE_CHARS`), else 422."
    )


def _max_turns(schema: dict[str, Any]) -> None:
    schema["properties"]["max_turns"]["description"] = (
        "Model turns for this query, 1 to 100; default `AGENT_MAX_TURNS`."
    )


def _error_schemas() -> dict[str, Any]:
    return {
        "Error": {
            "type": "object",
            "description": "Every error reply; some carry more fields.",
            "required": ["error"],
            "properties": {
                "error": {"type": "string", "description": "What went wrong, for a person."},
                "code": {"type": "string", "description": "A machine-readable code, where there is one."},
            },
        },
        "ValidationError": {
            "allOf": [{"$ref": REF.format(model="Error")}],
            "type": "object",
            "description": "422: a JSON body of the wrong shape (or a text over the length limit).",
            "properties": {
                "details": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["field", "message"],
                        "properties": {"field": {"type": "string"}, "message": {"type": "string"}},
                    },
                }
            },
        },
        "Purged": {
            "allOf": [{"$ref": REF.format(model="Error")}],
            "type": "object",
            "description": (
                "410: the events after the id asked for are no longer kept; rebuild from the "
                "snapshot and go on from `last_id`."
            ),
            "required": ["oldest_id"],
            "properties": {
                "oldest_id": {"type": "integer"},
                "last_id": {"type": "integer"},
                "snapshot": {
                    "type": "object",
                    "description": (
                        "The conversation so far, the running query's text and finished tool "
                        "calls with their results, and the usage to date."
                    ),
                },
            },
        },
    }


def _usage() -> dict[str, Any]:
    count = {"type": "integer", "minimum": 0}
    return {
        "type": "object",
        "required": ["input_tokens", "output_tokens", "total_tokens"],
        "properties": {"input_tokens": count, "output_tokens": count, "total_tokens": count},
    }


def _resource_schemas() -> dict[str, Any]:
    usage = {"$ref": REF.format(model="Usage")}
    tool_call = {
        "type": "object",
        "required": ["tool", "input", "tool_use_id"],
        "properties": {
            "tool": {"type": "string"},
            "input": {"description": "The tool's input as the model gave it (usually an object)."},
            "tool_use_id": {"type": "string"},
            "result": {"type": "string"},
            "is_error": {"type": "boolean"},
        },
    }
    status = {
        "type": "string",
        "description": "`idle` or `running` (a query runs in the background).",
        "examples": ["idle", "running"],
    }
    return {
        "Usage": _usage(),
        "ToolCall": tool_call,
        "AgentRunResult": {
            "type": "object",
            "description": "The run as one reply: the whole text and the `done` event's fields.",
            "required": ["response", "turns", "tool_calls", "usage"],
            "properties": {
                "response": {"type": "string"},
                "turns": {"type": "integer", "minimum": 0},
                "tool_calls": {"type": "array", "items": {"$ref": REF.format(model="ToolCall")}},
                "usage": usage,
                "stop_reason": {"type": ["string", "null"]},
                "truncated": {"type": "boolean"},
                "max_turns_reached": {"type": "boolean"},
                "cancelled": {"type": "boolean"},
            },
        },
        "AgentRunFailure": {
            "allOf": [{"$ref": REF.format(model="Error")}],
            "type": "object",
            "description": "503 from `POST /agent/run`: the run failed upstream; what it produced so far.",
            "required": ["code", "turns", "response", "usage"],
            "properties": {
                "code": {"type": "string", "examples": ["throttlingException", "InternalServerException"]},
                "turns": {"type": "integer"},
                "response": {"type": "string"},
                "usage": usage,
            },
        },
        "SessionCreated": {
            "type": "object",
            "required": ["id", "status"],
            "properties": {"id": {"type": "string"}, "status": status},
        },
        "Session": {
            "type": "object",
            "required": ["id", "status", "messages", "usage", "last_event_id"],
            "properties": {
                "id": {"type": "string"},
                "status": status,
                "messages": {
                    "type": "array",
                    "description": "The conversation in Bedrock's Converse format (`role`, `content` blocks).",
                    "items": {"type": "object"},
                },
                "usage": usage,
                "last_event_id": {"type": "integer", "minimum": 0},
            },
        },
        "MessageAccepted": {
            "type": "object",
            "required": ["id", "status", "run_id", "after_id"],
            "properties": {
                "id": {"type": "string"},
                "status": status,
                "run_id": {"type": "string"},
                "after_id": {
                    "type": "integer",
                    "minimum": 0,
                    "description": "Resume from this id (`Last-Event-ID`, `since_index`) to see all of this query.",
                },
            },
        },
        "CancelAccepted": {
            "type": "object",
            "required": ["id", "status", "cancelled"],
            "properties": {
                "id": {"type": "string"},
                "status": status,
                "cancelled": {"type": "boolean", "description": "Whether a query was running."},
            },
        },
        "SessionEvent": {
            "type": "object",
            "description": (
                "An event in the **session** dialect: `processing`, `status_change`, "
                "`assistant_text`, `reasoning_text`, `tool_use_start`, `tool_input_delta`, "
                "`tool_executing`, `tool_use`, `tool_result`, `usage`, `plan`, `step`, `done`, "
                "`error` (see docs/api.md for each type's fields)."
            ),
            "required": ["id", "type", "ts"],
            "properties": {
                "id": {"type": "integer", "minimum": 1},
                "type": {"type": "string"},
                "ts": {"type": "number", "description": "When it was logged, epoch seconds."},
            },
        },
        "SessionStreamEvent": {
            "type": "object",
            "description": (
                "A `SessionEvent` (with `id` and `ts`), or what the stream makes up for one client "
                "(no id): the `status_change` sent on joining, `heartbeat` {last_id, status} while "
                "idle, an `error` with `code` `events_purged` or `store_unavailable`."
            ),
            "required": ["type"],
            "properties": {"type": {"type": "string"}, "id": {"type": "integer"}, "ts": {"type": "number"}},
        },
        "Poll": {
            "type": "object",
            "required": ["events", "next_index", "status", "last_id", "oldest_id", "purged"],
            "properties": {
                "events": {"type": "array", "items": {"$ref": REF.format(model="SessionEvent")}},
                "next_index": {
                    "type": "integer",
                    "minimum": 0,
                    "description": "The `since_index` to pass next time.",
                },
                "status": status,
                "last_id": {"type": "integer", "minimum": 0},
                "oldest_id": {"type": "integer", "minimum": 0},
                "purged": {
                    "type": "boolean",
                    "description": "`since_index` was older than the oldest kept event; `snapshot` rebuilds what was lost.",
                },
                "snapshot": {"type": "object"},
            },
        },
        "AgentEvent": {
            "type": "object",
            "description": (
                "An event in the **agent** dialect: `text_delta` {text}, `tool_use_start` {tool, id}, "
                "`tool_input_delta` {delta, id}, `tool_executing` {tool, id}, `tool_result` "
                "{tool, result, id, is_error?}, `reasoning_delta` {text}, `done` {turns, "
                "tool_calls, usage, stop_reason, truncated?, max_turns_reached?, cancelled?}, "
                "`error` {error, turns, code, recoverable}. `done` or `error` is last."
            ),
            "required": ["type"],
            "properties": {"type": {"type": "string"}},
        },
        "StepsEvent": {
            "type": "object",
            "description": (
                "An event in the **steps** dialect: `message` {role, content, timestamp}, `step` "
                "{step_type: planning | action, step_number, ..., token_usage}, `final` "
                "{step_number, output}, `done`, `error` {error}."
            ),
            "required": ["type"],
            "properties": {"type": {"type": "string"}},
        },
        "SelftestEvent": {
            "type": "object",
            "description": "`tick` {n, of, ts (server clock, epoch seconds), interval_ms, idle_ms on the last}, or `end` {ticks}.",
            "required": ["type"],
            "properties": {
                "type": {"type": "string", "enum": ["tick", "end"]},
                "n": {"type": "integer", "minimum": 1},
                "of": {"type": "integer", "minimum": 1},
                "ts": {"type": "number"},
                "interval_ms": {"type": "integer"},
                "idle_ms": {"type": "integer"},
                "ticks": {"type": "integer"},
            },
        },
        "Health": {
            "type": "object",
            "required": ["status", "provider", "runs_active", "sessions", "store", "loop_lag_ms"],
            "properties": {
                "status": {"type": "string", "enum": ["ok", "degraded"]},
                "provider": {"type": "string"},
                "runs_active": {"type": "integer", "minimum": 0},
                "sessions": {"type": ["integer", "null"]},
                "store": {
                    "type": "object",
                    "required": ["kind", "connected"],
                    "properties": {
                        "kind": {"type": "string", "enum": ["memory", "redis"]},
                        "connected": {"type": "boolean"},
                        "instance_id": {"type": "string"},
                    },
                },
                "loop_lag_ms": {
                    "type": "object",
                    "required": ["p50", "p99", "max", "samples"],
                    "properties": {
                        "p50": {"type": "number"},
                        "p99": {"type": "number"},
                        "max": {"type": "number"},
                        "samples": {"type": "integer", "minimum": 0},
                    },
                },
                "mcp": {
                    "type": "array",
                    "description": "Each configured MCP server: `url`, `connected`, `tools`, `last_error`.",
                    "items": {"type": "object"},
                },
            },
        },
        "Token": {
            "type": "object",
            "required": ["token", "expires_at"],
            "properties": {
                "token": {"type": "string"},
                "expires_at": {"type": "number", "description": "Epoch seconds."},
            },
        },
    }


def _error(
    description: str, schema: str | dict[str, Any] = "Error", headers: dict[str, Any] | None = None
) -> dict[str, Any]:
    ref = {"$ref": REF.format(model=schema)} if isinstance(schema, str) else schema
    response: dict[str, Any] = {"description": description, "content": {JSON: {"schema": ref}}}
    if headers:
        response["headers"] = headers
    return response


RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait.", "schema": {"type": "string"}}}


def _responses(settings: Settings) -> dict[str, Any]:
    return {
        "BadRequest": _error("Bad input: malformed or empty JSON, or a bad parameter."),
        "Unauthorized": _error(
            "No key or a bad one (only when `AGENT_API_KEYS` is set).",
            headers={"WWW-Authenticate": {"schema": {"type": "string"}}},
        ),
        "Forbidden": _error("A cross-origin request from an origin not in `AGENT_ALLOWED_ORIGINS`."),
        "NotFound": _error("Unknown session, or one that is not the caller's: `Session not found`."),
        "Conflict": _error("A query is already running in this session."),
        "TooLarge": _error(f"The body is over `AGENT_MAX_REQUEST_BYTES` ({settings.max_request_bytes})."),
        "Unprocessable": _error("A JSON body of the wrong shape.", "ValidationError"),
        "TooManyRequests": _error("Over this key's quota (when quotas are configured).", headers=RETRY_AFTER),
        "Unavailable": _error(
            "The service is at its limit of concurrent queries or sessions, or its store (Redis) is "
            "unreachable (`code: store_unavailable`); retry after `Retry-After`.",
            headers=RETRY_AFTER,
        ),
        "Gone": _error(
            "The events after that id were purged (the log is bounded); rebuild from `snapshot`.", "Purged"
        ),
    }


def _refs(*names: str) -> dict[str, Any]:
    codes = {
        "BadRequest": "400",
        "Unauthorized": "401",
        "Forbidden": "403",
        "NotFound": "404",
        "Conflict": "409",
        "Gone": "410",
        "TooLarge": "413",
        "Unprocessable": "422",
        "TooManyRequests": "429",
        "Unavailable": "503",
    }
    return {codes[name]: {"$ref": f"#/components/responses/{name}"} for name in names}


def _query_max_chars(settings: Settings) -> int:
    """The longest ``?query=`` sure to fit the request line: percent-encoded UTF-8 takes up to
    12 bytes a character, and the path and the rest of the line take some room."""
    line = getattr(settings, "max_header_bytes", 8190)
    return max(1, min(settings.max_message_chars, (line - 256) // 12))


def _parameters(settings: Settings) -> dict[str, Any]:
    return {
        "SessionId": {
            "name": "session_id",
            "in": "path",
            "required": True,
            "description": "A session id from `POST /sessions` (URL-safe).",
            "schema": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"},
        },
        "LastEventIdHeader": {
            "name": "Last-Event-ID",
            "in": "header",
            "required": False,
            "description": (
                "Resume: every event after this id (an integer), then live. Sent by a browser's "
                "EventSource when it reconnects. Wins over `?last_event_id=`; an empty value "
                "counts as absent. Not an integer: 400; ahead of the session's last id: 400; "
                "older than the oldest kept: 410."
            ),
            "schema": {"type": "string", "pattern": r"^\s*[0-9]*\s*$"},
        },
        "LastEventIdQuery": {
            "name": "last_event_id",
            "in": "query",
            "required": False,
            "description": "The same as the `Last-Event-ID` header, for clients that cannot set headers.",
            "schema": {"type": "integer", "minimum": 0},
        },
        "SinceIndex": {
            "name": "since_index",
            "in": "query",
            "required": False,
            "description": (
                "The events after this id (default 0: from the start). Pass the last reply's "
                "`next_index`. Ahead of the session's last id: 400."
            ),
            "schema": {"type": "integer", "minimum": 0, "default": 0},
        },
        "Limit": {
            "name": "limit",
            "in": "query",
            "required": False,
            "description": f"Most events to return; capped at `AGENT_POLL_MAX_EVENTS` ({settings.poll_max_events}).",
            "schema": {"type": "integer", "minimum": 1},
        },
        "Query": {
            "name": "query",
            "in": "query",
            "required": True,
            "description": (
                "The question; starts a query in the session. Missing or blank: 400 "
                '`{"error": "Query parameter is required"}`; longer than `AGENT_MAX_MESSAGE_CHARS`: '
                "422. It travels in the request line, which the HTTP parser limits to "
                "`AGENT_MAX_HEADER_BYTES` (a longer one gets the parser's plain-text 400): the "
                "length given here fits however it is percent-encoded; send longer questions with "
                "`POST /sessions/{id}/messages`."
            ),
            "schema": {
                "type": "string",
                "minLength": 1,
                "pattern": r"\S",
                "maxLength": _query_max_chars(settings),
            },
        },
    }


def _sse_event(payload: str, description: str) -> dict[str, Any]:
    """One Server-Sent Event as a client's parser sees it (``event`` is ``message`` when the
    stream names none). As OpenAPI 3.2's ``itemSchema`` does, and tools read a 3.1 ``schema`` of
    ``text/event-stream``, this describes each event of the stream."""
    return {
        "type": "object",
        "description": description,
        "required": ["data"],
        "properties": {
            "data": {
                "type": "string",
                "description": f"One line of JSON: an `{payload}`.",
                "contentMediaType": JSON,
                "contentSchema": {"$ref": REF.format(model=payload)},
            },
            "event": {"type": "string"},
            "id": {"type": "string", "description": "The event id, where the stream gives one."},
            "retry": {"type": "integer", "minimum": 0},
        },
    }


def _sse(description: str, payload: str, event_description: str = "") -> dict[str, Any]:
    return {
        "description": description,
        "headers": {
            "Cache-Control": {"schema": {"type": "string", "const": "no-cache"}},
            "X-Accel-Buffering": {"schema": {"type": "string", "const": "no"}},
        },
        "content": {
            SSE: {"schema": _sse_event(payload, event_description or f"Server-Sent Events: `{payload}`.")}
        },
    }


def _json(description: str, schema: str) -> dict[str, Any]:
    return {"description": description, "content": {JSON: {"schema": {"$ref": REF.format(model=schema)}}}}


def build_spec(settings: Settings) -> dict[str, Any]:
    """The OpenAPI 3.1 document for an application with these settings."""
    schemas: dict[str, Any] = {}
    schemas.update(_error_schemas())
    schemas.update(_resource_schemas())
    agent_body = _model_schema(AgentRequest, schemas)
    message_body = _model_schema(MessageRequest, schemas)
    _text_field(schemas["AgentRequest"], "message", settings)
    _max_turns(schemas["AgentRequest"])
    _text_field(schemas["MessageRequest"], "content", settings)
    _max_turns(schemas["MessageRequest"])
    schemas["CreateSessionRequest"] = {
        "type": "object",
        "description": "No fields are read yet; an empty body is fine too.",
    }

    session = {"$ref": "#/components/parameters/SessionId"}
    json_body = _refs("BadRequest", "TooLarge", "Unprocessable")

    def body(ref: dict[str, Any], required: bool = True) -> dict[str, Any]:
        return {"required": required, "content": {JSON: {"schema": ref}}}

    common = _refs("Unauthorized", "Forbidden", "TooManyRequests")
    public = {"security": [], "responses": {}}

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
                    "200": _sse(
                        "The run's events, `done` or `error` last.",
                        "AgentEvent",
                        "`data:` only (no `event:`, no `id:`).",
                    ),
                    **json_body,
                    **common,
                    **_refs("Unavailable"),
                },
            }
        },
        "/agent/run": {
            "post": {
                "operationId": "agentRun",
                "summary": "Run a query and answer once (JSON)",
                "requestBody": body(agent_body),
                "responses": {
                    "200": _json("The run's whole text and its `done` fields.", "AgentRunResult"),
                    **json_body,
                    **common,
                    "503": _error(
                        "The service is at a limit or its store is down (`Error`, with `Retry-After`), or "
                        "the run failed upstream (`AgentRunFailure`: `code`, `turns`, `response`, `usage`).",
                        {
                            "anyOf": [
                                {"$ref": REF.format(model="AgentRunFailure")},
                                {"$ref": REF.format(model="Error")},
                            ]
                        },
                        headers=RETRY_AFTER,
                    ),
                },
            }
        },
        "/sessions": {
            "post": {
                "operationId": "createSession",
                "summary": "Create a session",
                "requestBody": body({"$ref": REF.format(model="CreateSessionRequest")}, required=False),
                "responses": {
                    "201": _json("The new, idle session.", "SessionCreated"),
                    **_refs("BadRequest", "TooLarge"),
                    "422": _error("The body is JSON but not an object."),
                    **common,
                    **_refs("Unavailable"),
                },
            }
        },
        "/sessions/{session_id}": {
            "parameters": [session],
            "get": {
                "operationId": "getSession",
                "summary": "A session's status and conversation",
                "responses": {
                    "200": _json("The session.", "Session"),
                    **common,
                    **_refs("NotFound", "Unavailable"),
                },
            },
            "delete": {
                "operationId": "deleteSession",
                "summary": "Delete a session (its running query is cancelled first)",
                "responses": {
                    "204": {"description": "Deleted."},
                    **common,
                    **_refs("NotFound", "Unavailable"),
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
                    "202": _json("Accepted; the query runs.", "MessageAccepted"),
                    **json_body,
                    **common,
                    **_refs("NotFound", "Conflict", "Unavailable"),
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
                    "202": _json("Asked; `cancelled` says whether a query was running.", "CancelAccepted"),
                    **common,
                    **_refs("NotFound", "Unavailable"),
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
                    "200": _sse(
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
                    **_refs("BadRequest"),
                    **common,
                    **_refs("NotFound", "Gone", "Unavailable"),
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
                    "200": _json("The events after `since_index`.", "Poll"),
                    **_refs("BadRequest"),
                    **common,
                    **_refs("NotFound", "Unavailable"),
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
                    "200": _sse(
                        "The query's steps, `done` or `error` last.",
                        "StepsEvent",
                        "`id:` (the session event's id) and `data:`.",
                    ),
                    **_refs("BadRequest"),
                    **common,
                    **_refs("NotFound", "Conflict"),
                    "422": _error("The query is longer than `AGENT_MAX_MESSAGE_CHARS`."),
                    **_refs("Unavailable"),
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
                    "200": _sse(
                        "`tick` events, then `end`.",
                        "SelftestEvent",
                        "`event: tick` (with `id:`), or `event: end`.",
                    ),
                    **_refs("BadRequest"),
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
                    "200": _json("Serving.", "Health"),
                    "400": _error("`lag_since` is not a number."),
                    "503": _json("Degraded: the store (Redis) is unreachable.", "Health"),
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
                    "200": _json("The token.", "Token"),
                    **common,
                    "404": _error("No API keys are configured, so no token is needed."),
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
                    **_refs("Forbidden"),
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
                    **_refs("Forbidden"),
                },
            }
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "agentstream", "version": "0.1.0", "description": DESCRIPTION},
        "security": [{}, {"bearer": []}, {"token": []}, {"cookie": []}],
        "paths": paths,
        "components": {
            "schemas": schemas,
            "responses": _responses(settings),
            "parameters": _parameters(settings),
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "An API key, or a token from `POST /auth/token`.",
                },
                "token": {"type": "apiKey", "in": "query", "name": "token"},
                "cookie": {"type": "apiKey", "in": "cookie", "name": "agentstream_token"},
            },
        },
    }


async def openapi_json(request: web.Request) -> web.Response:
    """``GET /openapi.json``: the document (public, like ``/healthz``)."""
    return web.Response(body=request.app[SPEC_KEY], content_type=JSON)


def add_routes(app: web.Application) -> None:
    """Register ``GET /openapi.json``, its document built now from the application's settings."""
    app[SPEC_KEY] = json.dumps(build_spec(app[CONTEXT].settings), indent=1).encode()
    app.router.add_get("/openapi.json", openapi_json)
