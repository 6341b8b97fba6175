"""The AI SDK face's part of ``GET /openapi.json``: ``/api/chat``, its resume, and the chat as
``UIMessage[]``.

The request body is generated from :class:`~service.transports.aisdk.models.ChatRequest`, the
model the handler validates with (its schemas named ``AiSdk...``); the stream's parts are summed
up in one schema, since their exact shapes are the ``ai`` package's.
"""

from __future__ import annotations

import functools
from typing import Any

from pydantic import TypeAdapter

from service.config import Settings
from service.transports.aisdk.models import ChatRequest
from service.transports.edge.openapi import (
    CLIENT_ID,
    JSON,
    LAST_EVENT_ID,
    Fragment,
    Parts,
    ref,
    refs,
    resume_errors,
    sse,
    start_errors,
)

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
    "tool-approval-request",
    "tool-output-denied",
    "abort",
    "finish",
    "error",
]


@functools.cache
def _generated() -> dict[str, Any]:
    chat = TypeAdapter(ChatRequest).json_schema(ref_template="#/components/schemas/AiSdk{model}")
    found = {f"AiSdk{name}": schema for name, schema in chat.pop("$defs", {}).items()}
    found["AiSdkChatRequest"] = chat
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
    found["AiSdkChatMessage"] = {
        "type": "object",
        "description": (
            "A message of the chat as npm `ai`'s `UIMessage` holds it: the user's text, or an "
            "answer (every model turn of one query) with its parts."
        ),
        "required": ["id", "role", "parts"],
        "properties": {
            "id": {"type": "string", "description": "The id the server's conversation keeps it by."},
            "role": {"type": "string", "enum": ["user", "assistant"]},
            "parts": {"type": "array", "items": {"$ref": "#/components/schemas/AiSdkChatPart"}},
            "metadata": {
                "type": "object",
                "description": "An answer's `usage` (its model turns'), and `interrupted: true` if it was cut short.",
                "properties": {"usage": {"type": "object"}, "interrupted": {"type": "boolean"}},
            },
        },
    }
    found["AiSdkChatPart"] = {
        "type": "object",
        "description": (
            "`text`, `reasoning`, `step-start` (one per model turn), `dynamic-tool` (the service's "
            "own tools) or `tool-<name>` (the browser's)."
        ),
        "required": ["type"],
        "properties": {
            "type": {"type": "string"},
            "text": {"type": "string"},
            "state": {
                "type": "string",
                "enum": ["done", "input-available", "output-available", "output-error"],
            },
            "toolName": {"type": "string"},
            "toolCallId": {"type": "string"},
            "input": {},
            "output": {},
            "errorText": {"type": "string"},
        },
    }
    return found


def schemas() -> dict[str, Any]:
    """The schemas these operations name, to add to ``components.schemas``."""
    return dict(_generated())


def paths(settings: Settings, parts: Parts) -> dict[str, Any]:
    """The AI SDK's operations, by path."""
    return {
        "/api/chat": {
            "post": {
                "operationId": "aiSdkChat",
                "summary": "Ask in a chat (AI SDK UI message stream v1)",
                "description": (
                    "The body `DefaultChatTransport` (npm `ai`) sends. `id` names the caller's "
                    "session, made on first use; the last message must be the user's and is the "
                    f"new query (at most {settings.max_message_chars} characters), keeping its "
                    "id. `start`'s `messageId` is the id the server keeps the answer by. "
                    "`trigger: regenerate-message` answers again the answer `messageId` names (or "
                    "the last); `submit-message` with a `messageId` naming an earlier message of "
                    "the user's is an edit of it; an id the chat does not hold is a 404. `tools` "
                    "(sent with the transport's `body`) are tools the browser runs: their calls "
                    "are static tool parts and end the stream as a step awaiting them; the next "
                    "request, its tool parts in `output-available` or `output-error`, gets the "
                    "rest of the query (a result for a call not waited on: 404 or 409). A "
                    "`tools` name of a service tool is a 422. `multitask_strategy`: while a "
                    "query runs, a 409 (`reject`), or wait for it (`enqueue`), or stop it "
                    "(`interrupt`, `rollback`). The reply has "
                    "`x-vercel-ai-ui-message-stream: v1`; each part has the log's id as `id:`."
                ),
                "requestBody": {"required": True, "content": {JSON: {"schema": ref("AiSdkChatRequest")}}},
                "responses": {
                    "200": sse("The query's UI message stream.", "AiSdkPart"),
                    **start_errors(parts.common),
                },
            }
        },
        "/api/chat/{session_id}": {
            "parameters": [CLIENT_ID],
            "get": {
                "operationId": "aiSdkChatMessages",
                "summary": "The chat as UIMessage[] (for useChat({messages}))",
                "description": (
                    "The server's conversation as npm `ai`'s `UIMessage[]`: each user message, "
                    "then one assistant message per answer (its id the answer's, one `step-start` "
                    "per model turn). 404 for a chat the caller has not made."
                ),
                "responses": {
                    "200": {
                        "description": "The chat's messages, oldest first.",
                        "content": {JSON: {"schema": {"type": "array", "items": ref("AiSdkChatMessage")}}},
                    },
                    **parts.common,
                    **refs("NotFound", "Unavailable"),
                },
            },
        },
        "/api/chat/{session_id}/stream": {
            "parameters": [CLIENT_ID],
            "get": {
                "operationId": "aiSdkResume",
                "summary": "Resume a chat's running query (useChat's resume)",
                "description": (
                    "The running query's parts from its first (or after `Last-Event-ID`); 204 "
                    "when no query runs, a chat not posted yet included (`useChat({resume: true})` "
                    "asks on every mount); 404 for another key's chat. Stop it with "
                    "`POST /sessions/{id}/cancel`."
                ),
                "parameters": [LAST_EVENT_ID],
                "responses": {
                    "200": sse("The running query's UI message stream.", "AiSdkPart"),
                    "204": {
                        "description": "No query runs in the chat, or no chat of that id yet: nothing to resume."
                    },
                    **resume_errors(parts.common),
                },
            },
        },
    }


FRAGMENT = Fragment(paths, schemas=schemas)
