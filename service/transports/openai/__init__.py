"""The OpenAI Chat Completions face: ``POST /v1/chat/completions``, ``GET /v1/models``."""

from service.transports.openai.openapi import FRAGMENT as OPENAPI
from service.transports.openai.routes import add_routes

__all__ = ["OPENAPI", "add_routes"]
