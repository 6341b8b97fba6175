"""The ``components`` of ``GET /openapi.json``: schemas, shared responses, parameters, security.

The schemas are generated, not written here: the request bodies from the pydantic models the
handlers validate with (tightened with what the handlers check on top: no blank text, the
configured length limit), the reply bodies from :mod:`service.transports.native.replies` and the
streams' events from :mod:`service.transports.stream.payloads`, the types the handlers and dialects
build. Limits shown are this instance's settings.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

from pydantic import TypeAdapter
from pydantic.json_schema import JsonSchemaMode

from service.config import Settings
from service.transports.edge.inputs import AgentRequest, ApprovalAnswer, MessageRequest, TitleRequest
from service.transports.edge.openapi import REF, RETRY_AFTER, error
from service.transports.native import payloads as native_payloads
from service.transports.native import replies
from service.transports.openai import models as openai_types
from service.transports.stream import payloads

# Everything the routes name by ``$ref``; what these refer to comes along.
NAMED: tuple[Any, ...] = (
    AgentRequest,
    MessageRequest,
    ApprovalAnswer,
    replies.ApprovalAnswered,
    replies.Error,
    replies.ValidationError,
    replies.Purged,
    replies.AgentRunResult,
    replies.AgentRunFailure,
    replies.SessionCreated,
    replies.Session,
    replies.SessionList,
    replies.SessionRenamed,
    TitleRequest,
    replies.MessageAccepted,
    replies.CancelAccepted,
    replies.Poll,
    replies.Health,
    replies.Token,
    native_payloads.AgentEvent,
    payloads.SessionEvent,
    payloads.SessionStreamEvent,
    native_payloads.StepsEvent,
    native_payloads.SelftestEvent,
    openai_types.ChatCompletionRequest,
    openai_types.ChatCompletion,
    openai_types.ChatStreamData,
    openai_types.ChatModelList,
    openai_types.ChatModel,
    openai_types.ChatError,
)


@functools.cache
def _generated() -> dict[str, Any]:
    """Every schema the named types need, built once per process (it does not depend on settings)."""
    inputs: list[tuple[int, JsonSchemaMode, TypeAdapter[Any]]] = [
        (index, "validation", TypeAdapter(named)) for index, named in enumerate(NAMED)
    ]
    _, definitions = TypeAdapter.json_schemas(inputs, ref_template=REF)
    return definitions["$defs"]


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


def schemas(settings: Settings) -> dict[str, Any]:
    """``components.schemas`` for an application with these settings."""
    found = copy.deepcopy(_generated())
    _text_field(found["AgentRequest"], "message", settings)
    _max_turns(found["AgentRequest"])
    _text_field(found["MessageRequest"], "content", settings)
    _max_turns(found["MessageRequest"])
    # The handler reads no field of it yet: there is no model to generate it from.
    found["CreateSessionRequest"] = {
        "type": "object",
        "description": "No fields are read yet; an empty body is fine too.",
    }
    return found


def responses(settings: Settings) -> dict[str, Any]:
    """``components.responses``: the errors many routes share."""
    return {
        "BadRequest": error("Bad input: malformed or empty JSON, or a bad parameter."),
        "Unauthorized": error(
            "No key or a bad one (only when `AGENT_API_KEYS` is set).",
            headers={"WWW-Authenticate": {"schema": {"type": "string"}}},
        ),
        "Forbidden": error("A cross-origin request from an origin not in `AGENT_ALLOWED_ORIGINS`."),
        "NotFound": error("Unknown session, or one that is not the caller's: `Session not found`."),
        "Conflict": error("A query is already running in this session."),
        "TooLarge": error(f"The body is over `AGENT_MAX_REQUEST_BYTES` ({settings.max_request_bytes})."),
        "Unprocessable": error("A JSON body of the wrong shape.", "ValidationError"),
        "TooManyRequests": error("Over this key's quota (when quotas are configured).", headers=RETRY_AFTER),
        "Unavailable": error(
            "The service is at its limit of concurrent queries or sessions, or its store (Redis) is "
            "unreachable (`code: store_unavailable`); retry after `Retry-After`.",
            headers=RETRY_AFTER,
        ),
        "Gone": error(
            "The events after that id were purged (the log is bounded); rebuild from `snapshot`.", "Purged"
        ),
    }


def _query_max_chars(settings: Settings) -> int:
    """The longest ``?query=`` sure to fit the request line: percent-encoded UTF-8 takes up to
    12 bytes a character, and the path and the rest of the line take some room."""
    line = getattr(settings, "max_header_bytes", 8190)
    return max(1, min(settings.max_message_chars, (line - 256) // 12))


def parameters(settings: Settings) -> dict[str, Any]:
    """``components.parameters``: the ones several routes share, or too long to write inline."""
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


SECURITY_SCHEMES = {
    "bearer": {
        "type": "http",
        "scheme": "bearer",
        "description": "An API key, or a token from `POST /auth/token`.",
    },
    "token": {"type": "apiKey", "in": "query", "name": "token"},
    "cookie": {"type": "apiKey", "in": "cookie", "name": "agentstream_token"},
}


def components(settings: Settings) -> dict[str, Any]:
    """The document's ``components`` for an application with these settings."""
    return {
        "schemas": schemas(settings),
        "responses": responses(settings),
        "parameters": parameters(settings),
        "securitySchemes": copy.deepcopy(SECURITY_SCHEMES),
    }
