"""Directives: ``[emu:NAME]`` or ``[emu:NAME=VALUE]`` written in a prompt to steer the emulator.

Parsing, the tolerant reading of their values (a malformed value degrades to the default), and
the errors that the failure directives (``http``, ``fail``) name.
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import unquote

from service.emulator.steps import HttpError

DEFAULT_FAIL_AFTER = 3

_DIRECTIVE_RE = re.compile(r"\[emu:([A-Za-z_][A-Za-z0-9_]*)(?:=([^\]]*))?\]")

_HTTP_ERROR_TYPES: dict[int, str] = {
    400: "ValidationException",
    403: "AccessDeniedException",
    404: "ResourceNotFoundException",
    408: "ModelTimeoutException",
    424: "ModelErrorException",
    429: "ThrottlingException",
    500: "InternalServerException",
    503: "ServiceUnavailableException",
}
_ERROR_MESSAGES: dict[str, str] = {
    "throttling": "Too many requests, please wait before trying again.",
    "internalserver": "The server encountered an internal error.",
    "serviceunavailable": "The service is temporarily unavailable.",
    "validation": "The request is not valid.",
    "modelstreamerror": "The model stream failed.",
}


def parse_directives(text: str) -> dict[str, str]:
    """Directives in ``text`` as name -> value (``""`` when valueless); later ones win."""
    return {m.group(1).lower(): (m.group(2) or "").strip() for m in _DIRECTIVE_RE.finditer(text)}


def strip_directives(text: str) -> str:
    """``text`` without its directives, whitespace collapsed."""
    return " ".join(_DIRECTIVE_RE.sub(" ", text).split())


def int_value(directives: dict[str, str], name: str, default: int | None) -> int | None:
    """The directive's integer value, or ``default`` when it is absent or malformed."""
    # A malformed value is ignored rather than rejected, so a typo degrades to the default.
    try:
        return int(directives[name])
    except (KeyError, ValueError):
        return default


def float_value(directives: dict[str, str], name: str) -> float | None:
    """The directive's non-negative number, or None when it is absent, malformed or negative."""
    try:
        value = float(directives[name])
    except (KeyError, ValueError):
        return None
    return value if value >= 0 else None


def json_object_value(directives: dict[str, str], name: str) -> dict[str, Any]:
    """The directive's value read as a JSON object, or ``{}`` when it is absent, malformed or
    not an object (``[emu:tool_input={"city": "Paris"}]``; a value cannot hold a ``]``)."""
    try:
        value = json.loads(directives[name])
    except (KeyError, ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def said_text(directives: dict[str, str]) -> str | None:
    """The answer ``[emu:say=TEXT]`` dictates, percent-decoded (``%0A`` a newline, ``%5D`` a
    ``]``, which a directive cannot hold as is); None without one."""
    raw = directives.get("say")
    return None if raw is None else unquote(raw)


def exception_name(name: str) -> str:
    """The stream exception a ``fail`` directive names, spelt as botocore spells it."""
    # botocore names stream exceptions in camelCase; accept the PascalCase spelling too.
    return name[:1].lower() + name[1:] if name else "internalServerException"


def error_message(error_type: str) -> str:
    """The message that goes with an emulated error of this type."""
    key = error_type.lower().removesuffix("exception")
    return _ERROR_MESSAGES.get(key, f"Emulated {error_type}.")


def http_error_for(directives: dict[str, str]) -> HttpError | None:
    """The HTTP error an ``http`` directive asks for; None without one or out of 400-599."""
    status = int_value(directives, "http", None)
    if status is None or not 400 <= status <= 599:
        return None
    error_type = _HTTP_ERROR_TYPES.get(
        status, "InternalServerException" if status >= 500 else "ValidationException"
    )
    return HttpError(status, error_type, error_message(error_type))
