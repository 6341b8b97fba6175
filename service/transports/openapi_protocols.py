"""The OpenAPI operations and schemas of the ecosystem's protocols: ``/api/chat`` (the AI SDK's UI
message stream) and ``/ag-ui`` (AG-UI), merged into ``GET /openapi.json`` by
:mod:`service.transports.openapi`.

The request bodies are generated from the models the handlers validate with: the AI SDK's
:class:`~service.transports.aisdk.ChatRequest`, and ``ag-ui-protocol``'s own ``RunAgentInput``
and event union (their schemas named ``AgUi...`` so that they cannot meet the service's own).
The AI SDK's parts are summed up in one schema: their exact shapes are the ``ai`` package's.
"""

from __future__ import annotations

import functools
from typing import Any

from ag_ui.core import Event as AgUiEvent
from ag_ui.core import RunAgentInput
from pydantic import TypeAdapter

from service.config import Settings
from service.transports.aisdk import ChatRequest
from service.transports.openapi_components import JSON, ref, refs, sse

AG_UI_REF = "#/components/schemas/AgUi{model}"
PART_TYPES = [
    "start",
    "start-step",
    "finish-step",
    "text-start",
    "text-delta",
    "text-end",
    "reasoning-start",
    "reasoning-delta",
    "reasoning-end",
    "tool-input-start",
    "tool-input-delta",
    "tool-input-available",
    "tool-output-available",
    "tool-output-error",
    "abort",
    "finish",
    "error",
]


@functools.cache
def _generated() -> dict[str, Any]:
    chat = TypeAdapter(ChatRequest).json_schema(ref_template="#/components/schemas/AiSdk{model}")
    found = {f"AiSdk{name}": schema for name, schema in chat.pop("$defs", {}).items()}
    found["AiSdkChatRequest"] = chat
    inputs: list[tuple[int, Any, TypeAdapter[Any]]] = [
        (0, "validation", TypeAdapter(RunAgentInput)),
        (1, "serialization", TypeAdapter(AgUiEvent)),
    ]
    tops, definitions = TypeAdapter.json_schemas(inputs, ref_template=AG_UI_REF)
    found.update({f"AgUi{name}": schema for name, schema in definitions.get("$defs", {}).items()})
    found["AgUiEvent"] = tops[(1, "serialization")]
    found["AiSdkPart"] = {
        "type": "object",
        "description": (
            "One part of the AI SDK's UI message stream (protocol v1), as npm `ai`'s "
            "`uiMessageChunkSchema` defines it; `data: [DONE]` ends the stream."
        ),
        "required": ["type"],
        "properties": {
            "type": {"type": "string", "enum": PART_TYPES},
            "id": {"type": "string", "description": "text and reasoning blocks"},
            "delta": {"type": "string"},
            "messageId": {"type": "string"},
            "toolCallId": {"type": "string"},
            "toolName": {"type": "string"},
            "inputTextDelta": {"type": "string"},
            "input": {},
            "output": {},
            "errorText": {"type": "string"},
            "dynamic": {"type": "boolean"},
            "finishReason": {"type": "string"},
            "messageMetadata": {"type": "object", "description": "`usage`, `turns`, `stop_reason`"},
        },
    }
    return found


def schemas() -> dict[str, Any]:
    """The schemas these operations name, to add to ``components.schemas``."""
    return dict(_generated())


def paths(settings: Settings, common: dict[str, Any]) -> dict[str, Any]:
    """The four operations, by path."""
    chat_id = {
        "name": "session_id",
        "in": "path",
        "required": True,
        "description": "The chat id (AI SDK) or thread id (AG-UI): the session's id.",
        "schema": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,128}$"},
    }
    last_event_id = {"$ref": "#/components/parameters/LastEventIdHeader"}
    body_errors = refs("BadRequest", "TooLarge", "Unprocessable")
    start_errors = {**body_errors, **common, **refs("NotFound", "Conflict", "Unavailable")}
    resume_errors = {**refs("BadRequest"), **common, **refs("NotFound", "Gone", "Unavailable")}
    nothing_runs = {"description": "No query runs in the session: nothing to resume."}
    return {
        "/api/chat": {
            "post": {
                "operationId": "aiSdkChat",
                "summary": "Ask in a chat (AI SDK UI message stream v1)",
                "description": (
                    "The body `DefaultChatTransport` (npm `ai`) sends. `id` names the caller's "
                    "session, made on first use; the last message must be the user's and is the "
                    f"new query (at most {settings.max_message_chars} characters). The reply "
                    "has `x-vercel-ai-ui-message-stream: v1`; each part has the log's id as `id:`."
                ),
                "requestBody": {"required": True, "content": {JSON: {"schema": ref("AiSdkChatRequest")}}},
                "responses": {"200": sse("The query's UI message stream.", "AiSdkPart"), **start_errors},
            }
        },
        "/api/chat/{session_id}/stream": {
            "parameters": [chat_id],
            "get": {
                "operationId": "aiSdkResume",
                "summary": "Resume a chat's running query (useChat's resume)",
                "description": (
                    "The running query's parts from its first (or after `Last-Event-ID`); 204 "
                    "when no query runs, a chat not posted yet included (`useChat({resume: true})` "
                    "asks on every mount); 404 for another key's chat. Stop it with "
                    "`POST /sessions/{id}/cancel`."
                ),
                "parameters": [last_event_id],
                "responses": {
                    "200": sse("The running query's UI message stream.", "AiSdkPart"),
                    "204": {
                        "description": "No query runs in the chat, or no chat of that id yet: nothing to resume."
                    },
                    **resume_errors,
                },
            },
        },
        "/ag-ui": {
            "post": {
                "operationId": "agUiRun",
                "summary": "Run the agent (AG-UI)",
                "description": (
                    "A `RunAgentInput`; `threadId` names the caller's session (1 to 128 of "
                    "`A-Za-z0-9_-`), made on first use; the last message must be the user's "
                    "and is the new query. `tools`, `context`, `state` and `forwardedProps` "
                    "are accepted and not read. Each event has the log's id as `id:`."
                ),
                "requestBody": {"required": True, "content": {JSON: {"schema": ref("AgUiRunAgentInput")}}},
                "responses": {"200": sse("The run's AG-UI events.", "AgUiEvent"), **start_errors},
            }
        },
        "/ag-ui/{session_id}/events": {
            "parameters": [chat_id],
            "get": {
                "operationId": "agUiEvents",
                "summary": "Resume a thread's running query (AG-UI events)",
                "description": "The running query's events from its first (or after `Last-Event-ID`); 204 when none runs.",
                "parameters": [last_event_id],
                "responses": {
                    "200": sse("The running query's AG-UI events.", "AgUiEvent"),
                    "204": nothing_runs,
                    **resume_errors,
                },
            },
        },
    }
