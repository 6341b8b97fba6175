"""The WebSocket face, ``GET /ws``: many sessions on one socket, fed by pumps and an outbox."""

from service.transports.ws.routes import add_routes

__all__ = ["add_routes"]
