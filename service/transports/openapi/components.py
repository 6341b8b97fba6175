"""The ``components`` of ``GET /openapi.json``: schemas, shared responses, parameters, security.

The schemas are generated, not written here: from the types each face's fragment names (the
request models its handlers validate with, the reply and event types its handlers and projectors
build), all together so shared definitions come out once, then tightened by each face with what
its handlers check on top (no blank text, the configured length limit). Limits shown are this
instance's settings.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Sequence
from typing import Any

from pydantic import TypeAdapter
from pydantic.json_schema import JsonSchemaMode

from service.config import Settings
from service.transports.edge.openapi import REF, RETRY_AFTER, Fragment, error


@functools.cache
def _generated(named: tuple[Any, ...]) -> dict[str, Any]:
    """Every schema the named types need, built once per process (it does not depend on settings)."""
    inputs: list[tuple[int, JsonSchemaMode, TypeAdapter[Any]]] = [
        (index, "validation", TypeAdapter(each)) for index, each in enumerate(named)
    ]
    _, definitions = TypeAdapter.json_schemas(inputs, ref_template=REF)
    return definitions["$defs"]


def schemas(settings: Settings, fragments: Sequence[Fragment]) -> dict[str, Any]:
    """``components.schemas`` for an application with these settings: the faces' named types'
    schemas generated together, each face's edits, then the schemas each face builds itself."""
    found = copy.deepcopy(_generated(tuple(named for fragment in fragments for named in fragment.named)))
    for fragment in fragments:
        fragment.tighten(found, settings)
    for fragment in fragments:
        found.update(fragment.schemas())
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


def components(settings: Settings, fragments: Sequence[Fragment]) -> dict[str, Any]:
    """The document's ``components`` for an application with these settings and faces."""
    return {
        "schemas": schemas(settings, fragments),
        "responses": responses(settings),
        "parameters": parameters(settings),
        "securitySchemes": copy.deepcopy(SECURITY_SCHEMES),
    }
