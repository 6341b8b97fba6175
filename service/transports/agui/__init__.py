"""The AG-UI face: ``POST /ag-ui`` runs and the running query's events again."""

from service.transports.agui.openapi import FRAGMENT as OPENAPI
from service.transports.agui.routes import add_routes

__all__ = ["OPENAPI", "add_routes"]
