"""``/mcp``: the MCP Streamable HTTP transport, a third face on the same sessions (seed 004).

- ``POST /mcp``: one JSON-RPC message. ``initialize`` opens an MCP session (``Mcp-Session-Id``
  in the reply); requests are answered with JSON, or with an SSE stream for a
  ``session_message`` that waits for its answer (progress notifications, then the result);
  notifications get 202.
- ``GET /mcp``: the session's stream of server-initiated messages. Once the client has set a
  logging level, every event of each agent session it sent a message to arrives as a
  ``notifications/message`` whose ``data`` is the event (``session_id``, ``id``, ``type``, ...).
- ``DELETE /mcp``: end the MCP session.

The protocol itself (negotiation, validation, the tools) is the official SDK's
:class:`~mcp.server.runner.ServerRunner` over the server built in
:mod:`service.transports.mcp.tools`; :mod:`~service.transports.mcp.http` is the HTTP side,
:mod:`~service.transports.mcp.session` the MCP sessions and their streams.

Event ids on the GET stream come from the session event logs. An MCP session may follow several
agent sessions, so an id lists each one's position: ``<session_id>:<event id>``, joined by commas
(one entry when it follows one session). A reconnect with ``Last-Event-ID`` resumes every
followed session after its position. A position older than the log keeps gives, on the stream,
an ``error`` notification with ``code: events_purged`` naming the session and the index to poll
``session_events`` from, and the stream goes on from the oldest event kept.

MCP sessions live in the instance that made them (route ``/mcp`` by ``Mcp-Session-Id`` when
several instances share Redis); the agent sessions they follow are shared as usual. An unknown
or expired MCP session gets 404, which tells an MCP client to initialize again.
"""

from __future__ import annotations

from aiohttp import web

from service.transports.edge.context import CONTEXT
from service.transports.mcp.http import PATH, delete, get, post
from service.transports.mcp.notifications import format_cursor, parse_cursor
from service.transports.mcp.session import MCP_SESSIONS, McpSession, McpSessions

__all__ = ["MCP_SESSIONS", "McpSession", "add_routes", "format_cursor", "parse_cursor"]


def add_routes(app: web.Application) -> None:
    """Register ``/mcp`` and the MCP sessions' lifetime."""
    context = app[CONTEXT]
    registry = McpSessions(context)
    app[MCP_SESSIONS] = registry
    context.metrics.track(
        "agentstream_mcp_sessions", "MCP sessions held by this instance.", lambda: len(registry)
    )

    async def close_sessions(app: web.Application) -> None:
        await registry.close_all()

    app.on_shutdown.append(close_sessions)
    app.router.add_post(PATH, post)
    app.router.add_get(PATH, get)
    app.router.add_delete(PATH, delete)
