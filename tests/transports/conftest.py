"""Fixtures shared by the transports' tests: a real OTLP receiver, and a service sending it its
spans (tests/support/traces.py)."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from tests.conftest import ClientFactory
from tests.support.traces import Receiver


@pytest.fixture
async def receiver(aiohttp_server: Any, monkeypatch: pytest.MonkeyPatch) -> Receiver:
    receiving = Receiver()
    app = web.Application()
    app.router.add_post("/v1/traces", receiving.handle)
    server = await aiohttp_server(app)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{server.port}")
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "agentstream-test")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "5")  # milliseconds: spans leave as they end
    return receiving


@pytest.fixture
async def traced(receiver: Receiver, make_client: ClientFactory) -> TestClient:
    return await make_client()
