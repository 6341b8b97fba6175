"""``GET /openapi.json`` and the service against it, checked by schemathesis.

The schema is read from the running service (the real app on a real port, embedded emulator);
schemathesis generates requests for each operation from it, valid ones and (where the schema
says what is invalid) invalid ones, sends them over HTTP from a worker thread (its client is
synchronous, and the service runs on this test's event loop), and checks each response: never
a 5xx, a documented status, the documented content type, and a JSON body that matches the
documented schema.

Streams cannot hang a test: the emulator answers at once with the test settings, an idle
session's stream closes after its status, every example that needs a session gets a new one
(so no stream waits on another example's query), the self-test's schedule is clamped to a few
milliseconds, and every request has a timeout.
"""

from __future__ import annotations

import asyncio
import logging
import re
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from aiohttp.test_utils import TestClient
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from openapi_spec_validator import validate
from schemathesis import GenerationMode, checks

from service.app import build_spec
from service.config import Settings
from tests.conftest import TEST_SETTINGS, ClientFactory

SETTINGS: dict[str, Any] = {
    "max_message_chars": 200,
    # Quotas off: every example is the same (anonymous) owner.
    "quota_streams": 0,
    "quota_runs": 0,
    "quota_requests_per_minute": 0,
    "quota_tokens_per_day": 0,
}
EXAMPLES = 25
REQUEST_TIMEOUT_S = 10
checks.load_all_checks()  # the Open API checks register themselves on import
CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
]

README_ROUTES = {
    ("POST", "/agent/stream"),
    ("POST", "/agent/run"),
    ("POST", "/sessions"),
    ("GET", "/sessions/{session_id}"),
    ("DELETE", "/sessions/{session_id}"),
    ("POST", "/sessions/{session_id}/messages"),
    ("GET", "/sessions"),
    ("PATCH", "/sessions/{session_id}"),
    ("POST", "/sessions/{session_id}/cancel"),
    ("GET", "/sessions/{session_id}/events"),
    ("GET", "/sessions/{session_id}/events/poll"),
    ("GET", "/sessions/{session_id}/stream"),
    ("GET", "/healthz"),
    ("GET", "/metrics"),
    ("GET", "/selftest/stream"),
    ("POST", "/auth/token"),
    ("GET", "/"),
    ("POST", "/api/chat"),
    ("GET", "/api/chat/{session_id}/stream"),
    ("POST", "/ag-ui"),
    ("GET", "/ag-ui/{session_id}/events"),
}


def operations() -> list[tuple[str, str, GenerationMode]]:
    """Every documented operation in each mode; negative only where it takes some input."""
    spec = build_spec(Settings(**{**TEST_SETTINGS, **SETTINGS}))
    found = []
    for path, item in spec["paths"].items():
        for method, operation in item.items():
            if method == "parameters":
                continue
            found.append((method.upper(), path, GenerationMode.POSITIVE))
            if item.get("parameters") or operation.get("parameters") or operation.get("requestBody"):
                found.append((method.upper(), path, GenerationMode.NEGATIVE))
    return found


OPERATIONS = operations()
SESSION_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
CONFIG = {
    # An unknown query parameter is ignored, as HTTP services do: not an invalid request here.
    "generation": {"allow-extra-parameters": False},
    # An invalid request may also be too large (413) or purged from (410): refused all the same.
    "checks": {
        "negative_data_rejection": {
            "expected-statuses": [400, 401, 403, 404, 405, 409, 410, 413, 422, 429, "5xx"],
        }
    },
}


async def live_schema(client: TestClient) -> dict[str, Any]:
    async with client.get("/openapi.json") as response:
        assert response.status == 200
        assert response.content_type == "application/json"
        return await response.json()


@pytest.mark.slow
async def test_the_document_is_public_and_covers_every_route(make_client: ClientFactory) -> None:
    client = await make_client(**SETTINGS, api_keys=["secret"])
    spec = await live_schema(client)  # no key needed, like /healthz
    assert spec["openapi"].startswith("3.1")
    documented = {
        (method.upper(), path)
        for path, item in spec["paths"].items()
        for method in item
        if method != "parameters"
    }
    assert README_ROUTES <= documented
    assert not {path for _, path in documented if path in {"/ws", "/mcp"}}  # described in the text
    assert "/ws" in spec["info"]["description"] and "/mcp" in spec["info"]["description"]
    async with client.get("/sessions/x") as response:
        assert response.status == 401  # while the rest still needs one
    # Built from the request models, with what the handlers check beyond them.
    agent = spec["components"]["schemas"]["AgentRequest"]
    assert agent["required"] == ["message"]
    assert agent["properties"]["message"]["maxLength"] == 200
    events = spec["paths"]["/sessions/{session_id}/events"]["get"]
    assert "text/event-stream" in events["responses"]["200"]["content"]
    assert {"204", "400", "404", "410"} <= set(events["responses"])
    names = {
        parameter.get("name") or parameter["$ref"].rsplit("/", 1)[-1]
        for path in spec["paths"].values()
        for operation in path.values()
        if isinstance(operation, dict)
        for parameter in operation.get("parameters", [])
    }
    assert {"LastEventIdHeader", "LastEventIdQuery", "SinceIndex", "Limit", "Query", "ticks"} <= names
    validate(spec)  # against the Open API 3.1 meta-schema


def clamp_selftest(case: Any) -> None:
    """Keep ``/selftest/stream``'s schedule to a few milliseconds (it may ask for minutes)."""
    query = case.query if isinstance(case.query, dict) else None
    if query is None:
        return
    for name, most in (("ticks", 3), ("interval_ms", 5), ("idle_ms", 5)):
        value = query.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > most:
            query[name] = most
    if "ticks" not in query and "interval_ms" not in query:
        query["ticks"] = 2


def run_operation(
    schema_dict: dict[str, Any], method: str, path: str, base_url: str, mode: GenerationMode
) -> None:
    """Schemathesis's cases for one operation, sent to ``base_url`` and checked (in a thread)."""
    schema = schemathesis.openapi.from_dict(schema_dict, config=schemathesis.Config.from_dict(CONFIG))
    operation = schema[path][method]
    http = requests.Session()

    def new_session() -> str:
        response = http.post(f"{base_url}/sessions", timeout=REQUEST_TIMEOUT_S)
        assert response.status_code == 201, response.text
        return response.json()["id"]

    # Negative cases must also be refused (a 4xx).
    run = CHECKS + ([checks.negative_data_rejection] if mode is GenerationMode.NEGATIVE else [])

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode), real=st.booleans())
    def check(case: Any, real: bool) -> None:
        if mode is GenerationMode.NEGATIVE and path.endswith("/events"):
            # The Last-Event-ID header wins over ?last_event_id= (documented): whichever of the
            # two a negative case made invalid, the other may stand in for it.
            header = (case.headers or {}).get("Last-Event-ID")
            assume(not (header is not None and str(header).strip() and "last_event_id" in (case.query or {})))
        ids = case.path_parameters if isinstance(case.path_parameters, dict) else {}
        if real and SESSION_ID.fullmatch(str(ids.get("session_id", ""))):
            # A real session (a new one each time: no example waits on another's query), unless
            # the id is what a negative case made invalid.
            ids["session_id"] = new_session()
        if path == "/selftest/stream":
            clamp_selftest(case)
        case.call_and_validate(base_url=base_url, session=http, checks=run, timeout=REQUEST_TIMEOUT_S)

    try:
        check()
    finally:
        http.close()


@pytest.mark.slow  # schemathesis against every operation
@pytest.mark.parametrize(
    ("method", "path", "mode"), OPERATIONS, ids=[f"{m} {p} {g.value}" for m, p, g in OPERATIONS]
)
async def test_operation_conforms(
    make_client: ClientFactory,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
    method: str,
    path: str,
    mode: GenerationMode,
) -> None:
    caplog.set_level(logging.WARNING)
    # With the session database, so that listing and renaming answer (a 501 without it).
    client = await make_client(**SETTINGS, database_url=f"sqlite+aiosqlite:///{tmp_path / 'agentstream.db'}")
    spec = await live_schema(client)
    base_url = str(client.make_url("/")).rstrip("/")
    await asyncio.to_thread(run_operation, spec, method, path, base_url, mode)
    # Nothing the service could not handle (it logs those at ERROR).
    assert not [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR]
