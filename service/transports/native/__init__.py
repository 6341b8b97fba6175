"""The native face: the service's own routes and dialects (agent, session, steps), polling,
health and metrics, the page."""

from __future__ import annotations

from aiohttp import web

from service.transports.native import http, sessions, streams, web_client
from service.transports.native.openapi import FRAGMENT as OPENAPI

__all__ = ["OPENAPI", "add_routes"]


def add_routes(app: web.Application) -> None:
    """Register the native face's routes."""
    http.add_routes(app)
    sessions.add_routes(app)
    streams.add_routes(app)
    web_client.add_routes(app)
