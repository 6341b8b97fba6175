"""The ``/v1`` routes (OpenAI Chat Completions) in ``GET /openapi.json``.

Merged into the document by :mod:`service.transports.openapi.document`: their bodies, replies and
errors are OpenAI's shapes (:mod:`service.transports.openai.models`), not the service's own, so
every response here names its own schema rather than the shared ones.
"""

from __future__ import annotations

from typing import Any

from service.config import Settings
from service.transports.edge.openapi import JSON, RETRY_AFTER, Fragment, Parts, error, json_reply, ref, sse
from service.transports.openai import models as openai_types

CHAT_ERROR = "ChatError"


def _errors(*statuses: tuple[int, str], retry: bool = False) -> dict[str, Any]:
    return {
        str(status): error(description, CHAT_ERROR, headers=RETRY_AFTER if retry else None)
        for status, description in statuses
    }


ACCESS = (
    (401, "No key or a bad one (only when `AGENT_API_KEYS` is set): `authentication_error`."),
    (403, "A cross-origin request from an origin not in `AGENT_ALLOWED_ORIGINS`."),
)


def chat_paths(settings: Settings) -> dict[str, Any]:
    """The ``paths`` entries of the OpenAI-compatible routes."""
    completion = json_reply("The answer (without `stream`).", "ChatCompletion")
    streamed = sse(
        "With `stream: true`: the answer as chunks, then `data: [DONE]`.",
        "ChatStreamData",
        "`id:` (the session event's id; none on the first chunk, the usage chunk or `[DONE]`) and "
        "`data:` (a chunk; an `error` object ends a failed stream, without `[DONE]`).",
    )
    completion["content"].update(streamed["content"])
    completion["headers"] = streamed["headers"]
    return {
        "/v1/chat/completions": {
            "post": {
                "operationId": "chatCompletions",
                "summary": "OpenAI Chat Completions: run the agent on a conversation",
                "description": (
                    "A short-lived session runs one query on the conversation given (system and "
                    "developer messages are the system prompt, after the service's own). The agent "
                    "uses its own tools inside; with `tools`, the model's calls to them come back as "
                    "`tool_calls` with `finish_reason: tool_calls`, unrun, and a next request with "
                    "the `tool` results continues. Only `model`, `messages`, `stream`, "
                    "`stream_options`, `tools`, `tool_choice` (`none` leaves the tools out), "
                    "`max_tokens`/`max_completion_tokens` and `n` (1) are read; other fields are "
                    f"ignored. The last user message may hold {settings.max_message_chars} "
                    "characters (`AGENT_MAX_MESSAGE_CHARS`)."
                ),
                "requestBody": {
                    "required": True,
                    "content": {JSON: {"schema": ref("ChatCompletionRequest")}},
                },
                "responses": {
                    "200": completion,
                    **_errors(
                        (
                            400,
                            "A body of the wrong shape, an unknown role, an empty conversation, or "
                            "one the model refused: `invalid_request_error` with `param`.",
                        ),
                        *ACCESS,
                        (404, "Not the model `GET /v1/models` lists: `model_not_found`."),
                        (413, f"The body is over `AGENT_MAX_REQUEST_BYTES` ({settings.max_request_bytes})."),
                    ),
                    **_errors((429, "Over this key's quota: `rate_limit_error`."), retry=True),
                    **_errors((502, "The model failed: `server_error`.")),
                    **_errors(
                        (503, "The model may succeed on a retry, or the service is at a limit."), retry=True
                    ),
                },
            }
        },
        "/v1/models": {
            "get": {
                "operationId": "listModels",
                "summary": "OpenAI models: the configured model",
                "responses": {
                    "200": json_reply("The one model (`AGENT_MODEL_ID`).", "ChatModelList"),
                    **_errors(*ACCESS),
                    **_errors((429, "Over this key's quota."), retry=True),
                },
            }
        },
        "/v1/models/{model}": {
            "get": {
                "operationId": "getModel",
                "summary": "OpenAI model: the configured one, or 404",
                "parameters": [
                    {
                        "name": "model",
                        "in": "path",
                        "required": True,
                        "description": "A model id (one with other characters, such as an ARN, is only listed).",
                        "schema": {"type": "string", "pattern": "^[A-Za-z0-9._:@+-]{1,256}$"},
                    }
                ],
                "responses": {
                    "200": json_reply("The model.", "ChatModel"),
                    **_errors(*ACCESS, (404, "Not this service's model: `model_not_found`.")),
                    **_errors((429, "Over this key's quota."), retry=True),
                },
            }
        },
    }


def _paths(settings: Settings, parts: Parts) -> dict[str, Any]:
    return chat_paths(settings)


FRAGMENT = Fragment(
    _paths,
    (
        openai_types.ChatCompletionRequest,
        openai_types.ChatCompletion,
        openai_types.ChatStreamData,
        openai_types.ChatModelList,
        openai_types.ChatModel,
        openai_types.ChatError,
    ),
)
