"""``GET /openapi.json``: the document that merges the faces' fragments."""

from service.transports.openapi.document import add_routes, build_spec

__all__ = ["add_routes", "build_spec"]
