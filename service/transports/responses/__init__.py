"""OpenAI's Responses API face: ``/v1/responses`` (see :mod:`service.transports.responses.routes`)."""

from service.transports.responses.openapi import FRAGMENT as OPENAPI
from service.transports.responses.routes import add_routes

__all__ = ["OPENAPI", "add_routes"]
