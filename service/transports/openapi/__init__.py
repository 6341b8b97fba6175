"""``GET /openapi.json``: the document that merges the fragments the faces hand it."""

from service.transports.openapi.document import add_routes, build_spec

__all__ = ["add_routes", "build_spec"]
