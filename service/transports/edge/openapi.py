"""What a face's part of ``GET /openapi.json`` is written with: a :class:`Fragment` (its paths and
the types its schemas come from), references to the shared schemas and responses
(:mod:`service.transports.openapi.components` holds them), JSON replies and errors, and SSE
responses described event by event. The document (:mod:`service.transports.openapi.document`)
merges the fragments it is handed; it imports no face."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from service.config import Settings

JSON = "application/json"
SSE = "text/event-stream"
REF = "#/components/schemas/{model}"


def ref(name: str) -> dict[str, str]:
    """A ``$ref`` to the schema ``name``."""
    return {"$ref": REF.format(model=name)}


def error(
    description: str, schema: str | dict[str, Any] = "Error", headers: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A JSON error response."""
    response: dict[str, Any] = {
        "description": description,
        "content": {JSON: {"schema": ref(schema) if isinstance(schema, str) else schema}},
    }
    if headers:
        response["headers"] = headers
    return response


def json_reply(description: str, schema: str) -> dict[str, Any]:
    """A JSON response with the schema ``schema``."""
    return {"description": description, "content": {JSON: {"schema": ref(schema)}}}


RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait.", "schema": {"type": "string"}}}


_STATUS = {
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


def refs(*names: str) -> dict[str, Any]:
    """The shared responses ``names``, keyed by their status."""
    return {_STATUS[name]: {"$ref": f"#/components/responses/{name}"} for name in names}


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
                "contentSchema": ref(payload),
            },
            "event": {"type": "string"},
            "id": {"type": "string", "description": "The event id, where the stream gives one."},
            "retry": {"type": "integer", "minimum": 0},
        },
    }


def sse(description: str, payload: str, event_description: str = "") -> dict[str, Any]:
    """An SSE response whose events carry ``payload`` as their data."""
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


# The protocol faces (AI SDK, AG-UI) name a session by the client's own id, and share their errors.
CLIENT_ID = {
    "name": "session_id",
    "in": "path",
    "required": True,
    "description": "The chat id (AI SDK) or thread id (AG-UI): the session's id.",
    "schema": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,128}$"},
}
LAST_EVENT_ID = {"$ref": "#/components/parameters/LastEventIdHeader"}


def start_errors(common: dict[str, Any]) -> dict[str, Any]:
    """The errors of a request that starts (or continues) a query in the caller's chat."""
    return {
        **refs("BadRequest", "TooLarge", "Unprocessable"),
        **common,
        **refs("NotFound", "Conflict", "Unavailable"),
    }


def resume_errors(common: dict[str, Any]) -> dict[str, Any]:
    """The errors of a request that follows a chat's running query again."""
    return {**refs("BadRequest"), **common, **refs("NotFound", "Gone", "Unavailable")}


@dataclass(frozen=True)
class Parts:
    """What the fragments of ``paths`` share; each document gets its own."""

    agent_body: dict[str, Any] = field(default_factory=lambda: ref("AgentRequest"))
    message_body: dict[str, Any] = field(default_factory=lambda: ref("MessageRequest"))
    session: dict[str, Any] = field(default_factory=lambda: {"$ref": "#/components/parameters/SessionId"})
    json_body: dict[str, Any] = field(default_factory=lambda: refs("BadRequest", "TooLarge", "Unprocessable"))
    common: dict[str, Any] = field(
        default_factory=lambda: refs("Unauthorized", "Forbidden", "TooManyRequests")
    )
    public: dict[str, Any] = field(default_factory=lambda: {"security": [], "responses": {}})


def _no_schemas() -> dict[str, Any]:
    return {}


def _as_generated(schemas: dict[str, Any], settings: Settings) -> None:
    pass


@dataclass(frozen=True)
class Fragment:
    """One face's part of the document."""

    # Its operations, by path.
    paths: Callable[[Settings, Parts], dict[str, Any]]
    # The types it names by ``$ref``: their schemas are generated with every face's together,
    # so the definitions they share (usage, tool calls) come out once.
    named: tuple[Any, ...] = ()
    # Schemas it builds itself (a protocol's own models, under a prefix of its own).
    schemas: Callable[[], dict[str, Any]] = _no_schemas
    # What the handlers check beyond the models, with this instance's limits.
    tighten: Callable[[dict[str, Any], Settings], None] = _as_generated
