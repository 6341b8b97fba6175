"""Reading a WebSocket client's messages: a malformed one is a :class:`ClientError`, which the
connection answers with an ``error`` frame (the socket stays open)."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from service import jsonsafe
from service.transports.edge.inputs import text_refused

Model = TypeVar("Model", bound=BaseModel)


class ClientError(Exception):
    """A bad client message: becomes an ``error`` frame with ``code``."""

    def __init__(self, code: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.code = code
        self.extra = extra


def parsed(text: str) -> dict[str, Any]:
    """A client's JSON text as the object every message is."""
    try:
        message = jsonsafe.loads(text)
    except ValueError as exc:
        raise ClientError("bad_json", f"malformed JSON: {exc}") from None
    if not isinstance(message, dict):
        raise ClientError("invalid", "a message must be a JSON object")
    refused = text_refused(text, message)
    if refused is not None:
        raise ClientError("invalid", refused)
    return message


def validated(model: type[Model], fields: dict[str, Any], **context: Any) -> Model:
    """``fields`` as ``model``; an ``invalid`` error naming the first problem otherwise."""
    try:
        return model.model_validate(fields)
    except ValidationError as exc:
        problem = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in problem["loc"])
        raise ClientError(
            "invalid", f"{where}: {problem['msg']}" if where else problem["msg"], **context
        ) from None


def required_str(message: dict[str, Any], name: str) -> str:
    value = message.get(name)
    if not isinstance(value, str) or not value:
        raise ClientError("invalid", f"{name} (a non-empty string) is required")
    return value


def optional_str(message: dict[str, Any], name: str) -> str | None:
    value = message.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ClientError("invalid", f"{name} must be a non-empty string")
    return value


def optional_int(message: dict[str, Any], name: str) -> int | None:
    value = message.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ClientError("invalid", f"{name} must be a non-negative integer")
    return value


def check_meta(message: dict[str, Any]) -> None:
    """``_meta``, where a client puts its trace context (``traceparent``), is an object when sent."""
    if "_meta" in message and not isinstance(message["_meta"], dict):
        raise ClientError("invalid", "_meta must be an object")
