"""OpenAI's error shape, for the faces that speak OpenAI's API (Chat Completions, Responses).

Every error on ``/v1/`` is ``{"error": {"message", "type", "code", "param"}}``, whichever face or
edge check raised it: :func:`reshaped` is registered for the prefix (see
:func:`~service.transports.edge.middleware.add_error_shape`) and turns the service's own error
bodies (401 no key, 429 quota, 413 too large, 503 at a limit) into it.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from service import jsonsafe
from service.config import Settings
from service.core.agents import AgentDirectory, check_client_tools
from service.core.events import RunError
from service.errors import ClientToolsRefused

PREFIX = "/v1/"
_STATUS_CLASSES: dict[int, type[web.HTTPException]] = {
    cls.status_code: cls
    for cls in (
        web.HTTPBadRequest,
        web.HTTPNotFound,
        web.HTTPConflict,
        web.HTTPBadGateway,
        web.HTTPServiceUnavailable,
    )
}
ERROR_TYPES = {401: "authentication_error", 403: "permission_error", 429: "rate_limit_error"}


class InvalidParam(ValueError):
    """A request no model could take: a 400 ``invalid_value`` with this message and ``param``."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def error_type(status: int) -> str:
    """OpenAI's error ``type`` for an HTTP status."""
    if status >= 500:
        return "server_error"
    return ERROR_TYPES.get(status, "invalid_request_error")


def error_body(
    status: int, message: str, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    """An error in OpenAI's shape."""
    return {"error": {"message": message, "type": error_type(status), "code": code, "param": param}}


_INVALID_UPSTREAM = {"validationexception", "http_400", "http_422"}


def run_error_status(error: RunError) -> int:
    """The status a failed run answers with when no stream has started: 400 when the model
    refused the conversation as invalid, 503 for what may pass on a retry, else 502."""
    if error.code.lower() in _INVALID_UPSTREAM:
        return 400
    return 503 if error.recoverable else 502


def openai_error(
    status: int, message: str, code: str | None = None, param: str | None = None
) -> web.HTTPException:
    """An error in OpenAI's shape, to raise from a handler (it passes the service's error
    middleware as it is: a JSON error)."""
    cls = _STATUS_CLASSES.get(status, web.HTTPBadRequest)
    return cls(text=jsonsafe.dumps(error_body(status, message, code, param)), content_type="application/json")


def served_models(directory: AgentDirectory, settings: Settings) -> list[str]:
    """The ``model`` ids the OpenAI faces answer to: each agent's name, or, with no agents file,
    the one ``AGENT_MODEL_ID`` as before agents had names."""
    if not settings.agents_file:
        return [settings.model_id]
    return [info.name for info in directory.agents()]


def agent_for_model(directory: AgentDirectory, settings: Settings, model: str) -> str:
    """The agent a request's ``model`` names; a 404 ``model_not_found`` naming the models there
    are otherwise."""
    served = served_models(directory, settings)
    if model in served:
        return directory.default if not settings.agents_file else model
    raise openai_error(
        404,
        f"The model `{model}` does not exist; this service answers as {', '.join(f'`{m}`' for m in served)} "
        "(see GET /v1/models).",
        "model_not_found",
        "model",
    )


def require_client_tools_taken(directory: AgentDirectory, agent: str, count: int) -> None:
    """A 400 ``client_tools_refused`` (param ``tools``) when a request offers ``count`` tools of
    its own to an agent defined with ``client_tools = false``."""
    try:
        check_client_tools(directory, agent, count)
    except ClientToolsRefused as exc:
        raise openai_error(400, str(exc), exc.code, "tools") from None


def require_unicode(data: Any) -> None:
    """A 400 for a body holding a lone surrogate, which no upstream could take."""
    try:
        json.dumps(data, ensure_ascii=False, allow_nan=False).encode()
    except UnicodeEncodeError:
        raise openai_error(400, "the body must be valid Unicode text (no lone surrogates)") from None


def reshaped(status: int, body: Any, headers: Any) -> web.Response:
    """A service error body (``{"error": str, "code"?, ...}``) as OpenAI's; 422 becomes 400, as
    OpenAI answers every bad body."""
    status = 400 if status == 422 else status
    message = body.get("error") if isinstance(body, dict) else None
    code = body.get("code") if isinstance(body, dict) and isinstance(body.get("code"), str) else None
    if status == 401:
        code = code or "invalid_api_key"
    reply = error_body(status, message if isinstance(message, str) else "error", code)
    if isinstance(body, dict):
        # What the service adds (a quota's name, limit and retry_after; purged ids) stays beside.
        reply["error"].update({k: v for k, v in body.items() if k not in {"error", "code"}})
    kept = {k: v for k, v in headers.items() if k.lower() not in {"content-type", "content-length"}}
    return web.json_response(reply, status=status, headers=kept, dumps=jsonsafe.dumps)
