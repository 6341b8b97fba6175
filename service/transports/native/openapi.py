"""The native face's part of ``GET /openapi.json``: the agent, session and steps dialects' routes
and the service's own (health, metrics, tokens, the page), as fragments of ``paths``."""

from __future__ import annotations

from typing import Any

from service.config import Settings
from service.transports.edge.inputs import (
    AgentRequest,
    ApprovalAnswer,
    MessageRequest,
    SessionRequest,
    TitleRequest,
    ToolResultRequest,
)
from service.transports.edge.openapi import (
    JSON,
    RETRY_AFTER,
    Fragment,
    Parts,
    error,
    json_reply,
    ref,
    refs,
    sse,
)
from service.transports.native import payloads, replies
from service.transports.native.streams import SELFTEST_MAX_INTERVAL_MS, SELFTEST_MAX_TICKS
from service.transports.stream import payloads as stream_payloads


def _body(schema: dict[str, Any], required: bool = True) -> dict[str, Any]:
    return {"required": required, "content": {JSON: {"schema": schema}}}


def _agent_paths(settings: Settings, parts: Parts) -> dict[str, Any]:
    """The agent dialect's routes: a query streamed, or answered once."""
    return {
        "/agent/stream": {
            "post": {
                "operationId": "agentStream",
                "summary": "Run a query and stream it (agent dialect)",
                "description": (
                    "A short-lived session runs the query; its events arrive as `data: {json}` "
                    "lines (no `event:` or `id:`), `done` or `error` last, then the stream closes. "
                    "A client that goes away cancels the query."
                ),
                "requestBody": _body(parts.agent_body),
                "responses": {
                    "200": sse(
                        "The run's events, `done` or `error` last.",
                        "AgentEvent",
                        "`data:` only (no `event:`, no `id:`).",
                    ),
                    **parts.json_body,
                    **parts.common,
                    **refs("Unavailable"),
                },
            }
        },
        "/agent/run": {
            "post": {
                "operationId": "agentRun",
                "summary": "Run a query and answer once (JSON)",
                "requestBody": _body(parts.agent_body),
                "responses": {
                    "200": json_reply("The run's whole text and its `done` fields.", "AgentRunResult"),
                    **parts.json_body,
                    **parts.common,
                    "503": error(
                        "The service is at a limit or its store is down (`Error`, with `Retry-After`), or "
                        "the run failed upstream (`AgentRunFailure`: `code`, `turns`, `response`, `usage`).",
                        {"anyOf": [ref("AgentRunFailure"), ref("Error")]},
                        headers=RETRY_AFTER,
                    ),
                },
            }
        },
    }


def _session_paths(settings: Settings, parts: Parts) -> dict[str, Any]:
    """The session routes over JSON: list, create, read, rename, delete; and the agents."""
    return {
        "/agents": {
            "get": {
                "operationId": "listAgents",
                "summary": "The agents a session may be made for (`AGENT_AGENTS_FILE`)",
                "responses": {
                    "200": json_reply("Every agent, and the default one.", "AgentList"),
                    **parts.common,
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
                    **parts.common,
                    **refs("Unavailable"),
                },
            },
            "post": {
                "operationId": "createSession",
                "summary": "Create a session",
                "requestBody": _body(ref("SessionRequest"), required=False),
                "responses": {
                    "201": json_reply("The new, idle session.", "SessionCreated"),
                    **refs("BadRequest", "TooLarge"),
                    "422": error(
                        "The body is JSON but not an object, or names an agent that is not defined "
                        "(`code: unknown_agent`, `agents` lists them)."
                    ),
                    **parts.common,
                    **refs("Unavailable"),
                },
            },
        },
        "/sessions/{session_id}": {
            "parameters": [parts.session],
            "get": {
                "operationId": "getSession",
                "summary": "A session's status and conversation",
                "responses": {
                    "200": json_reply("The session.", "Session"),
                    **parts.common,
                    **refs("NotFound", "Unavailable"),
                },
            },
            "patch": {
                "operationId": "renameSession",
                "summary": "Rename a session (needs the session database)",
                "requestBody": _body(ref("TitleRequest")),
                "responses": {
                    "200": json_reply("Renamed.", "SessionRenamed"),
                    **parts.json_body,
                    "501": error("`AGENT_DATABASE_URL` is empty: no session database."),
                    **parts.common,
                    **refs("NotFound", "Unavailable"),
                },
            },
            "delete": {
                "operationId": "deleteSession",
                "summary": "Delete a session (its running query is cancelled first)",
                "responses": {
                    "204": {"description": "Deleted."},
                    **parts.common,
                    **refs("NotFound", "Unavailable"),
                },
            },
        },
    }


def _session_action_paths(settings: Settings, parts: Parts) -> dict[str, Any]:
    """What a client does in a session: ask, cancel, answer an approval."""
    return {
        "/sessions/{session_id}/messages": {
            "parameters": [parts.session],
            "post": {
                "operationId": "postMessage",
                "summary": "Start a query in the background (or edit, regenerate)",
                "description": (
                    "Each query sees the conversation so far. Follow it with "
                    "`GET /sessions/{id}/events` (`Last-Event-ID: after_id`) or polling "
                    "(`since_index=after_id`). `edit` (a user message's id) or `regenerate` (an "
                    "answer's id, or `true` for the last) first cut the conversation back to before "
                    "that message, logged as `conversation_rewound`. `tools` are browser-side tools: "
                    "a call of one logs `client_tool_request` and waits for "
                    "`POST /sessions/{id}/tool-results/{tool_call_id}`. While a query runs, "
                    "`multitask_strategy` decides: `reject` (409), `enqueue` (202 with `queued`; at "
                    "most `AGENT_MAX_QUEUED`, else 429), `interrupt` or `rollback`."
                ),
                "requestBody": _body(parts.message_body),
                "responses": {
                    "202": json_reply("Accepted; the query runs, or waits its turn.", "MessageAccepted"),
                    **parts.json_body,
                    **parts.common,
                    "404": error("Unknown session, or no message of that id to edit or regenerate."),
                    "422": error("A body of the wrong shape, or client tools that cannot be offered."),
                    **refs("Conflict", "Unavailable"),
                },
            },
        },
        "/sessions/{session_id}/cancel": {
            "parameters": [parts.session],
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
                    **parts.common,
                    **refs("NotFound", "Unavailable"),
                },
            },
        },
        "/sessions/{session_id}/approvals/{approval_id}": {
            "parameters": [
                parts.session,
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
                "requestBody": _body(ref("ApprovalAnswer")),
                "responses": {
                    "200": json_reply("Answered (now or before, the same way).", "ApprovalAnswered"),
                    **parts.json_body,
                    **parts.common,
                    "404": error("Unknown session or approval (or a session that is not the caller's)."),
                    "409": error("Answered otherwise already, or its query ended before it was answered."),
                    **refs("Unavailable"),
                },
            },
        },
        "/sessions/{session_id}/tool-results/{tool_call_id}": {
            "parameters": [
                parts.session,
                {"name": "tool_call_id", "in": "path", "required": True, "schema": {"type": "string"}},
            ],
            "post": {
                "operationId": "postToolResult",
                "summary": "Give a browser-side tool's result",
                "description": (
                    "Answers the `client_tool_request` of that `toolUseId` with its `output` (any "
                    "JSON) or its `error`; logged once as `client_tool_result`, whichever tab sends it "
                    "first, and the query goes on. Unanswered for `AGENT_CLIENT_TOOL_TIMEOUT_S`, the "
                    "call gets an error result."
                ),
                "requestBody": _body(ref("ToolResultRequest")),
                "responses": {
                    "200": json_reply("Taken.", "ToolResultAccepted"),
                    **parts.json_body,
                    **parts.common,
                    "404": error("Unknown session or tool call (or a session that is not the caller's)."),
                    "409": error("The call has its result already, timed out, or its query ended."),
                    **refs("Unavailable"),
                },
            },
        },
    }


def _event_paths(settings: Settings, parts: Parts) -> dict[str, Any]:
    """A session's events: the session dialect over SSE, and polling."""
    return {
        "/sessions/{session_id}/events": {
            "parameters": [parts.session],
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
                    **parts.common,
                    **refs("NotFound", "Gone", "Unavailable"),
                },
            },
        },
        "/sessions/{session_id}/events/poll": {
            "parameters": [parts.session],
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
                    **parts.common,
                    **refs("NotFound", "Unavailable"),
                },
            },
        },
    }


def _stream_paths(settings: Settings, parts: Parts) -> dict[str, Any]:
    """Streams of their own: a query in the steps dialect, and the self-test."""
    return {
        "/sessions/{session_id}/stream": {
            "parameters": [parts.session],
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
                    **parts.common,
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
                    **parts.common,
                },
            }
        },
    }


def _service_paths(settings: Settings, parts: Parts) -> dict[str, Any]:
    """The routes about the service itself: health, metrics, tokens, this document, the page."""
    return {
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
                    **parts.common,
                },
            }
        },
        "/auth/token": {
            "post": {
                "operationId": "issueToken",
                "summary": "Trade a key for a short-lived token, for the key or one of its app's users",
                "description": (
                    "Send the key as `Authorization: Bearer <key>`. The token is also set as the "
                    "HttpOnly `agentstream_token` cookie; pass it as `?token=`, the cookie or a "
                    "Bearer value where headers can't be set (EventSource, WebSocket). With a body "
                    '`{"sub": "alice"}` the token is for that user of the app holding the key: '
                    "their sessions are theirs alone (an app without an identity provider hands "
                    "each person a token of their own)."
                ),
                "requestBody": _body(
                    {
                        "type": "object",
                        "properties": {"sub": {"type": "string", "minLength": 1, "maxLength": 256}},
                    },
                    required=False,
                ),
                "responses": {
                    "200": json_reply("The token.", "Token"),
                    **parts.common,
                    "404": error("No API keys are configured, so no token is issued here."),
                    "422": error("The body is not an object with a `sub` of 1 to 256 characters."),
                },
            }
        },
        "/.well-known/oauth-protected-resource": {
            "get": {
                "operationId": "protectedResourceMetadata",
                "summary": "Where MCP clients sign in (RFC 9728; no key needed)",
                "description": (
                    "With `AGENT_JWKS_URL` or `AGENT_JWT_SECRET` set: this service as an OAuth "
                    "protected resource, `AGENT_JWT_ISSUER` as its authorization server. A 401 on "
                    "`/mcp` names this document in its `WWW-Authenticate`."
                ),
                **parts.public,
                "responses": {
                    "200": {
                        "description": "The metadata.",
                        "content": {JSON: {"schema": {"type": "object"}}},
                    },
                    "404": error("Users do not sign in with tokens here."),
                    **refs("Forbidden"),
                },
            }
        },
        "/openapi.json": {
            "get": {
                "operationId": "openapi",
                "summary": "This document (no key needed)",
                **parts.public,
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
                **parts.public,
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


FRAGMENTS = (_agent_paths, _session_paths, _session_action_paths, _event_paths, _stream_paths, _service_paths)


# The bodies, replies and events its routes name by ``$ref``.
NAMED: tuple[Any, ...] = (
    AgentRequest,
    MessageRequest,
    ApprovalAnswer,
    replies.ApprovalAnswered,
    ToolResultRequest,
    replies.ToolResultAccepted,
    replies.Error,
    replies.ValidationError,
    replies.Purged,
    replies.AgentRunResult,
    replies.AgentRunFailure,
    replies.SessionCreated,
    SessionRequest,
    replies.AgentList,
    replies.Session,
    replies.SessionList,
    replies.SessionRenamed,
    TitleRequest,
    replies.MessageAccepted,
    replies.CancelAccepted,
    replies.Poll,
    replies.Health,
    replies.Token,
    payloads.AgentEvent,
    stream_payloads.SessionEvent,
    stream_payloads.SessionStreamEvent,
    payloads.StepsEvent,
    payloads.SelftestEvent,
)


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


def _tighten(schemas: dict[str, Any], settings: Settings) -> None:
    """What the handlers check beyond the request models, with this instance's limits."""
    _text_field(schemas["AgentRequest"], "message", settings)
    _max_turns(schemas["AgentRequest"])
    _text_field(schemas["MessageRequest"], "content", settings)
    _max_turns(schemas["MessageRequest"])


def _paths(settings: Settings, parts: Parts) -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for fragment in FRAGMENTS:
        paths.update(fragment(settings, parts))
    return paths


FRAGMENT = Fragment(_paths, NAMED, tighten=_tighten)
