"""Real headless Chromium (Debian's package) driven by Playwright, against the service on a real port."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web

from service.app import create_app
from service.config import Settings
from tests.browser.proxy import Proxy
from tests.conftest import TEST_SETTINGS, test_tools

CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium_path() -> str | None:
    """Debian's chromium, or any the environment names."""
    for candidate in (os.environ.get("CHROMIUM_PATH"), "/usr/bin/chromium", shutil.which("chromium")):
        if candidate and os.path.exists(candidate):
            return candidate
    return None


def _unavailable(reason: str) -> None:
    # In CI a browser test must run: a missing browser is a failure there, a skip elsewhere.
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"browser tests cannot run in CI: {reason}")
    pytest.skip(reason)


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    """A headless Chromium."""
    path = chromium_path()
    if path is None:
        _unavailable("Chromium is not installed (apt-get install chromium)")
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        _unavailable("playwright is not installed (pip install -e '.[test]')")
    async with async_playwright() as playwright:
        instance = await playwright.chromium.launch(executable_path=path, headless=True, args=CHROMIUM_FLAGS)
        try:
            yield instance
        finally:
            await instance.close()


class Served:
    """The service on a real port, with a log of the requests it answered."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self.requests: list[tuple[str, str, int]] = []

    @property
    def url(self) -> str:
        return str(self.server.make_url("/"))

    @property
    def app(self) -> web.Application:
        return self.server.app


ServedFactory = Callable[..., Awaitable[Served]]


@pytest.fixture
def make_served(aiohttp_server: Any) -> ServedFactory:
    """Start the service with paced emulator answers, as a browser would meet it; keyword
    arguments override its settings."""

    async def start(**overrides: Any) -> Served:
        settings = Settings(
            **{**TEST_SETTINGS, "emulator_tokens_per_second": 200, "emulator_ttft_ms": 50, **overrides}
        )
        app = create_app(settings, tools=test_tools())
        holder: dict[str, Served] = {}

        @web.middleware
        async def record(request: web.Request, handler: Any) -> web.StreamResponse:
            response = await handler(request)
            holder["served"].requests.append((request.method, request.path_qs, response.status))
            return response

        app.middlewares.insert(0, record)
        server = await aiohttp_server(app)
        holder["served"] = Served(server)
        return holder["served"]

    return start


@pytest.fixture
async def served(make_served: ServedFactory) -> Served:
    """The service with paced emulator answers, as a browser would meet it."""
    return await make_served()


@pytest.fixture
def make_proxy(aiohttp_server: Any) -> Callable[[Served], Awaitable[tuple[Proxy, str]]]:
    """A misbehaving reverse proxy (tests/browser/proxy.py) in front of a served service, on a
    real port: returns the proxy and the URL the browser should open."""

    async def start(target: Served) -> tuple[Proxy, str]:
        proxy = Proxy(target.url.rstrip("/"))
        server = await aiohttp_server(proxy.app())
        return proxy, str(server.make_url("/"))

    return start
