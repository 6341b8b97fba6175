"""The Responses routes in ``GET /openapi.json``: OpenAI's shapes
(:mod:`service.transports.responses.models`), each response naming its own schema."""

from __future__ import annotations

from typing import Any

from service.config import Settings
from service.transports.edge.openapi import JSON, RETRY_AFTER, Fragment, Parts, error, json_reply, ref, sse
from service.transports.responses import models

ERROR = "ResponseError"
ACCESS = (
    (401, "No key or a bad one (only when `AGENT_API_KEYS` is set): `authentication_error`."),
    (403, "A cross-origin request from an origin not in `AGENT_ALLOWED_ORIGINS`."),
)
RESPONSE_ID = {
    "name": "response_id",
    "in": "path",
    "required": True,
    "description": "A response's id (`resp_`, a token, the id of the session it runs in).",
    "schema": {"type": "string", "pattern": "^resp_[0-9a-f]{16}[A-Za-z0-9_-]{1,128}$"},
}


def _errors(*statuses: tuple[int, str], retry: bool = False) -> dict[str, Any]:
    return {
        str(status): error(description, ERROR, headers=RETRY_AFTER if retry else None)
        for status, description in statuses
    }


_NOT_FOUND = (404, "No response of that id is the caller's: `not_found`.")
_LIMITS = _errors((429, "Over this key's quota: `rate_limit_error`."), retry=True)


def _stream(description: str) -> dict[str, Any]:
    return sse(
        description,
        "ResponseStreamEvent",
        "`event:` (the event's `type`) and `data:` (the event, with its `sequence_number`); an "
        "`error` event ends a stream cut short (the log purged or closed under it).",
    )


def _paths(settings: Settings, parts: Parts) -> dict[str, Any]:
    created = json_reply("The response: finished, or `in_progress` with `background`.", "ResponseObject")
    streamed = _stream("With `stream: true`: the response's events, from `response.created` to its end.")
    created["content"].update(streamed["content"])
    created["headers"] = streamed["headers"]
    polled = json_reply("The response as it stands.", "ResponseObject")
    followed = _stream("With `stream=true`: its events after `starting_after`, then live to its end.")
    polled["content"].update(followed["content"])
    polled["headers"] = followed["headers"]
    return {
        "/v1/responses": {
            "post": {
                "operationId": "createResponse",
                "summary": "OpenAI Responses: run the agent and answer as a response",
                "description": (
                    "Without `previous_response_id` a new session runs the query on `input` (a short-"
                    "lived one with `store: false`); with it, that response's session goes on. The "
                    "agent uses its own tools inside (shown as `mcp_call` items); the client's "
                    "function `tools` are handed back as `function_call` items, unrun, and a next "
                    "request's `function_call_output` items continue. `background: true` answers at "
                    "once and runs on; a response that is not background is cancelled when its client "
                    "leaves. A call that needs approval keeps the response `in_progress` with an "
                    "`mcp_approval_request` item: answer it with `POST "
                    "/sessions/{session_id}/approvals/{approval_id}`. Unknown parameters are refused by "
                    f"name. The user's message may hold {settings.max_message_chars} characters."
                ),
                "requestBody": {"required": True, "content": {JSON: {"schema": ref("ResponseRequest")}}},
                "responses": {
                    "200": created,
                    **_errors(
                        (
                            400,
                            "A body of the wrong shape, an unknown or unsupported parameter (`param` "
                            "names it), or input no model could take.",
                        ),
                        *ACCESS,
                        (404, "Not the model `GET /v1/models` lists, or no such `previous_response_id`."),
                        (409, "The previous response's session runs a query, or it was continued already."),
                        (413, f"The body is over `AGENT_MAX_REQUEST_BYTES` ({settings.max_request_bytes})."),
                    ),
                    **_LIMITS,
                    **_errors((502, "The model failed (without `stream` or `background`): `server_error`.")),
                    **_errors(
                        (503, "The model may succeed on a retry, or the service is at a limit."), retry=True
                    ),
                },
            }
        },
        "/v1/responses/{response_id}": {
            "get": {
                "operationId": "getResponse",
                "summary": "OpenAI Responses: a response, polled or streamed from a sequence number",
                "description": (
                    "Any instance answers. With `stream=true` the response's events come again after "
                    "`starting_after` (or `Last-Event-ID`), numbered as they first were, then live to "
                    "its end: background or not, while the session's log holds them."
                ),
                "parameters": [
                    RESPONSE_ID,
                    {"name": "stream", "in": "query", "schema": {"type": "boolean"}},
                    {"name": "starting_after", "in": "query", "schema": {"type": "integer", "minimum": 0}},
                ],
                "responses": {
                    "200": polled,
                    **_errors(
                        (400, "A bad `stream` or `starting_after`, or its events are no longer kept."),
                        *ACCESS,
                        _NOT_FOUND,
                    ),
                    **_LIMITS,
                },
            },
            "delete": {
                "operationId": "deleteResponse",
                "summary": "OpenAI Responses: forget a response and its conversation",
                "description": (
                    "Stops its query if it runs and deletes its session: the responses it continued "
                    "and those that continued it go with it."
                ),
                "parameters": [RESPONSE_ID],
                "responses": {
                    "200": json_reply("Deleted.", "ResponseDeleted"),
                    **_errors(*ACCESS, _NOT_FOUND),
                    **_LIMITS,
                },
            },
        },
        "/v1/responses/{response_id}/cancel": {
            "post": {
                "operationId": "cancelResponse",
                "summary": "OpenAI Responses: stop a response's query",
                "description": "The response afterwards: `cancelled` if it was running, else as it was.",
                "parameters": [RESPONSE_ID],
                "responses": {
                    "200": json_reply("The response.", "ResponseObject"),
                    **_errors(*ACCESS, _NOT_FOUND),
                    **_LIMITS,
                },
            }
        },
    }


FRAGMENT = Fragment(
    _paths,
    (
        models.ResponseRequest,
        models.ResponseObject,
        models.ResponseStreamEvent,
        models.ResponseDeleted,
        models.ResponseError,
    ),
)
