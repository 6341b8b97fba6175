"""The browser client: ``GET /`` serves the single page, ``/static/`` its script and styles."""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

WEB_ROOT = Path(__file__).resolve().parents[2] / "web"


async def index(request: web.Request) -> web.FileResponse:
    """``GET /``: the chat page (plain HTML, CSS and JS; no build step)."""
    return web.FileResponse(WEB_ROOT / "index.html", headers={"Cache-Control": "no-cache"})


def add_routes(app: web.Application) -> None:
    """Register the page and its static files."""
    app.router.add_get("/", index)
    app.router.add_static("/static/", WEB_ROOT, show_index=False, append_version=False)
