"""The MCP face's dialect: session events as ``notifications/message`` log notifications, at a
level per event, and the SSE id that lists each followed session's position.

Pure functions of an entry (or a position map), like ``transports/stream/session.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, get_args

import mcp_types as types

from service import jsonsafe
from service.core.log import LogEntry
from service.transports.stream.session import session_payload

LOGGER_NAME = "agentstream"
LEVELS: tuple[str, ...] = get_args(types.LoggingLevel)  # severity ascending


def level_rank(level: str) -> int:
    """Position of ``level`` on the syslog scale (debug lowest)."""
    return LEVELS.index(level)


def event_level(payload: Mapping[str, Any]) -> str:
    """The log level an event is sent at: errors ``error``; failed tools and tool calls waiting for a
    person's approval ``warning``; the rest ``info`` (partial tool input ``debug``)."""
    kind = payload["type"]
    if kind == "tool_approval_request":
        return "warning"
    if kind == "error":
        return "error"
    if kind == "tool_result" and payload.get("isError"):
        return "warning"
    if kind == "tool_input_delta":
        return "debug"
    return "info"


_TOOL_STATUS = {
    "tool_use_start": "started",
    "tool_use": "requested",
    "tool_executing": "executing",
    "tool_approval_request": "awaiting_approval",
}


def notification_data(session_id: str, entry: LogEntry) -> dict[str, Any]:
    """A log entry as a notification's ``data``: the session-dialect event plus ``session_id``
    (and a ``status`` on tool events)."""
    payload = session_payload(entry)
    kind = payload["type"]
    if kind in _TOOL_STATUS:
        payload["status"] = _TOOL_STATUS[kind]
    elif kind == "tool_result":
        payload["status"] = "failed" if payload.get("isError") else "completed"
    return {"session_id": session_id, **payload}


def log_message(level: str, data: Mapping[str, Any]) -> str:
    """A ``notifications/message`` JSON-RPC notification, encoded."""
    return jsonsafe.dumps(
        {
            "jsonrpc": "2.0",
            "method": "notifications/message",
            "params": {"level": level, "logger": LOGGER_NAME, "data": data},
        }
    )


def format_cursor(positions: Mapping[str, int]) -> str:
    """The SSE id: each followed session's last event id."""
    return ",".join(f"{session_id}:{event_id}" for session_id, event_id in positions.items())


def parse_cursor(text: str) -> dict[str, int]:
    """The positions in a ``Last-Event-ID``; ValueError if it is not one of ours."""
    positions: dict[str, int] = {}
    for part in text.split(","):
        session_id, sep, number = part.strip().rpartition(":")
        if not sep or not session_id or not number.isdigit():
            raise ValueError(part)
        positions[session_id] = int(number)
    return positions
