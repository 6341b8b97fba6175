"""The Vercel AI SDK's face: ``useChat``'s UI message stream (``POST /api/chat``) and its resume."""

from service.transports.aisdk.openapi import FRAGMENT as OPENAPI
from service.transports.aisdk.routes import add_routes

__all__ = ["OPENAPI", "add_routes"]
