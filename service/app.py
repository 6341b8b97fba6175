"""The application factory: settings in, a wired ``aiohttp.web.Application`` out.

Background resources (the embedded emulator, the provider's threads, the loop-lag monitor)
are owned by one ``cleanup_ctx`` generator; ``on_shutdown`` ends every run so that open
streams get their terminal event and close before the server stops.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from service.agent.calculator import builtin_tools
from service.agent.catalog import AgentCatalog
from service.agent.tools import Tool, ToolExecutor
from service.config import Settings, load_settings
from service.core.admission import Admission
from service.core.approvals import ApprovalDesk
from service.core.direct import Coalescing
from service.core.durable import DurableSessionStore
from service.core.log import MemoryEventLog
from service.core.runs import RunManager
from service.core.sessions import MemorySessionStore, SessionStore
from service.errors import StoreUnavailable
from service.logs import quiet_malformed_requests
from service.metrics import Metrics
from service.monitor import LoopLagMonitor
from service.providers.base import ModelProvider
from service.quotas.local import Quotas
from service.quotas.shared import SharedQuotas
from service.telemetry import Telemetry, configure_telemetry
from service.transports import agui, aisdk, mcp, native, openai, openapi, responses, ws
from service.transports.edge import auth
from service.transports.edge.admission import PER_TURN, REQUEST_ADMISSION, admission_middleware
from service.transports.edge.context import CONTEXT, Context, Health
from service.transports.edge.middleware import error_middleware
from service.transports.edge.quotas import QUOTAS, quota_middleware
from service.transports.edge.tracing import tracing_middleware
from service.transports.stream import sse
from service.transports.stream.writes import PINGS

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class Services(Context):
    """The context the transports see, plus what only the app wires: the agent, its tools, the
    provider (and the embedded emulator), and the Redis backend."""

    catalog: AgentCatalog
    tools: ToolExecutor
    provider: ModelProvider | None = None  # the default agent's
    emulator: Any = None
    backend: Any = None  # the Redis backend when AGENT_REDIS_URL is set
    records: Any = None  # the session database when AGENT_DATABASE_URL is not empty
    telemetry: Telemetry = field(default_factory=Telemetry)  # traces (OTEL_*), off by default


SERVICES = web.AppKey("services", Services)


def server_options(settings: Settings) -> dict[str, Any]:
    """aiohttp's request-parser options the settings decide, for ``web.run_app`` (and a test's
    server): a longer request line or header gets aiohttp's 400 instead of being read."""
    return {"max_line_size": settings.max_header_bytes, "max_field_size": settings.max_header_bytes}


async def _expire_sessions(sessions: SessionStore, ttl_s: float) -> None:
    """Drop idle sessions past their time-to-live, checking a few times per TTL."""
    while True:
        await asyncio.sleep(min(60.0, ttl_s / 4))
        expired = await sessions.expire_idle()
        if expired:
            log.info("expired %d idle session(s)", len(expired))


async def _sweep_sessions(sessions: DurableSessionStore) -> None:
    """Delete the sessions past their retention, once at start and then every hour."""
    while True:
        try:
            await sessions.sweep()
        except StoreUnavailable as exc:  # an outage, told on one line: no fault of the code's
            log.warning("the retention sweep failed (%s); it runs again within the hour", exc)
        except Exception:
            log.exception("the retention sweep failed; it runs again within the hour")
        await asyncio.sleep(3600.0)


def _store_probe(services: Services) -> Any:
    """The ``store`` section of ``/healthz``: where sessions live, and how many there are; on
    Redis, counting them is the probe (one round trip, within the time health gives it)."""
    sessions, backend = services.sessions, services.backend

    async def probe(timeout: float) -> Health:
        if backend is None:
            return Health({"kind": "memory", "connected": True, "sessions": await sessions.count()})
        section: dict[str, Any] = {"kind": "redis", "instance_id": backend.instance_id, "connected": False}
        try:
            async with asyncio.timeout(timeout):
                section["sessions"] = await sessions.count()
        except (StoreUnavailable, TimeoutError):
            return Health(section, healthy=False)  # without it no new work can be taken
        section["connected"] = True
        return Health(section)

    return probe


def _database_probe(records: Any) -> Any:
    """The ``database`` section of ``/healthz``: its kind, and whether it answers a round trip in
    time. Without it no session can be created or loaded, so its being down degrades the service."""

    async def probe(timeout: float) -> Health:
        section: dict[str, Any] = {"kind": records.kind, "connected": False}
        try:
            await records.ping(timeout)
        except StoreUnavailable:
            return Health(section, healthy=False)
        section["connected"] = True
        return Health(section)

    return probe


def _mcp_probe(tools: Any) -> Any:
    """The ``mcp`` section of ``/healthz``: each server's state; one being down is no failure."""

    async def probe(timeout: float) -> Health:
        return Health(tools.status())

    return probe


def _track_state(services: Services) -> None:
    """The gauges read at each scrape: runs in flight, and what this instance holds in memory."""
    metrics, runs = services.metrics, services.runs
    store = getattr(services.sessions, "live", services.sessions)  # the live tier under a database
    memory = store if isinstance(store, MemorySessionStore) else None
    if memory is None:
        memory = getattr(store, "local", None)  # Redis: the short-lived ones here
    metrics.track("agentstream_runs_active", "Queries running on this instance.", lambda: runs.active)
    metrics.track(
        "agentstream_asyncio_tasks", "asyncio tasks in this process.", lambda: len(asyncio.all_tasks())
    )
    if memory is not None:
        held = memory

        def log_bytes() -> float:
            return float(sum(getattr(s.log, "size_bytes", 0) for s in held.held()))

        metrics.track(
            "agentstream_sessions_in_memory", "Sessions held in this process.", lambda: len(held.held())
        )
        metrics.track(
            "agentstream_event_log_bytes", "Bytes of the event logs held in this process.", log_bytes
        )


def _make_tools(settings: Settings, tools: Iterable[Tool]) -> ToolExecutor:
    """The built-in tools, the AWS ones and the caller's, behind one executor."""
    from service.agent.aws_tools import aws_tools

    builtins = builtin_tools(
        calculator_timeout_s=settings.calculator_timeout_s,
        calculator_memory_mb=settings.calculator_memory_mb,
        calculator_workers=settings.calculator_workers,
    )
    return ToolExecutor(
        [*builtins, *aws_tools(), *tools],
        timeout=settings.tool_timeout_s,
        max_result_chars=settings.tool_max_output_chars,
    )


def _make_stores(settings: Settings) -> tuple[Any, SessionStore, Any]:
    """Where sessions live: ``(backend, sessions, records)``. In memory, or on Redis when
    ``AGENT_REDIS_URL`` is set; behind the session database when one is configured."""

    coalescing = Coalescing(
        max_window_s=settings.coalesce_max_ms / 1000,
        per_subscriber_s=settings.coalesce_per_subscriber_us / 1e6,
    )

    def memory_store() -> MemorySessionStore:
        return MemorySessionStore(
            lambda: MemoryEventLog(settings.session_events_max_bytes, coalescing),
            max_sessions=settings.max_sessions,
            ttl_s=settings.session_ttl_s,
            max_per_owner=settings.quota("sessions"),
        )

    backend = None
    sessions: SessionStore
    if settings.redis_url:
        from service.store.redis import make_store

        backend, sessions = make_store(settings, memory_store)
        backend.fanout.coalescing = coalescing
    else:
        sessions = memory_store()
    records = None
    if settings.database():
        from service.db import SqlRecords

        records = SqlRecords(
            settings.database(),
            migrate_on_start=settings.database_migrate,
            deadline_s=settings.database_deadline_s,
        )
        sessions = DurableSessionStore(
            sessions,
            records,
            retention_days=settings.session_retention_days,
            wait_s=settings.database_deadline_s,
        )
    return backend, sessions, records


def make_services(
    settings: Settings, tools: Iterable[Tool] = (), provider: ModelProvider | None = None
) -> Services:
    """Every object the app wires, made but not started: the tools, the agent, the stores, the
    metrics, the quotas and the run manager, with the gauges and health probes registered."""
    executor = _make_tools(settings, tools)
    # The agents (AGENT_AGENTS_FILE, or the settings as one); their providers are made at
    # start-up (the embedded emulator must be listening first). A bad file stops the start here.
    catalog = AgentCatalog.from_settings(settings, executor, provider)
    telemetry = configure_telemetry()  # OTEL_EXPORTER_OTLP_ENDPOINT and the like
    catalog.tracer = telemetry.tracer
    backend, sessions, records = _make_stores(settings)
    metrics = Metrics()
    catalog.turn_observer = metrics.model_call
    quotas: Quotas = Quotas.from_settings(settings)
    if backend is not None and settings.authenticated:
        # Each key's or user's quotas hold across every instance on this Redis (see
        # service/quotas/shared.py).
        from service.store.quotas import RedisQuotaCounters

        quotas = SharedQuotas.shared_from_settings(settings, RedisQuotaCounters(backend))
    services = Services(
        settings=settings,
        sessions=sessions,
        runs=RunManager(
            agents=catalog,
            store=sessions,
            observer=metrics,
            gate=quotas,
            default_max_turns=settings.max_turns,
            max_concurrent=settings.max_concurrent_runs,
            approvals=ApprovalDesk(
                sessions,
                timeout_s=settings.approval_timeout_s,
                client_tool_timeout_s=settings.client_tool_timeout_s,
                tracer=telemetry.tracer,
            ),
            tracer=telemetry.tracer,
        ),
        catalog=catalog,
        agents=catalog,
        tools=executor,
        monitor=LoopLagMonitor(on_sample=metrics.loop_lag.observe),
        backend=backend,
        records=records,
        metrics=metrics,
        quotas=quotas,
        tool_schema=lambda name: getattr(executor.current().get(name), "input_schema", None),
        tracer=telemetry.tracer,
        telemetry=telemetry,
    )
    _track_state(services)
    services.health["store"] = _store_probe(services)
    if records is not None:
        services.health["database"] = _database_probe(records)
    return services


async def _start_agents(services: Services, settings: Settings) -> Any:
    """The embedded emulator, when an agent asks for it, started first (the providers are made on
    its URL), then the agents' providers: the emulator, or None."""
    catalog = services.catalog
    emulator = None
    if catalog.needs_emulator:
        from service.emulator import EmbeddedEmulator, EmulatorConfig

        emulator = EmbeddedEmulator(
            EmulatorConfig(
                ttft_ms=settings.emulator_ttft_ms,
                tokens_per_second=settings.emulator_tokens_per_second,
                context_tokens=settings.emulator_context_tokens,
            )
        ).start()
        services.emulator = emulator
    await catalog.start(emulator.url if emulator else None)
    services.provider = catalog.resolve(catalog.default)[0].provider
    return emulator


def _reload_on_hangup(catalog: AgentCatalog) -> Callable[[], None] | None:
    """Reload the agents file on SIGHUP (each worker gets it from the supervisor); the callable
    undoes it. None where this loop cannot take signals (not the main thread)."""
    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Task[bool]] = set()

    def hangup() -> None:
        log.info("SIGHUP: reloading the agents file")
        task = loop.create_task(catalog.reload(), name="agents-reload")
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    try:
        loop.add_signal_handler(signal.SIGHUP, hangup)
    except (RuntimeError, ValueError, NotImplementedError):
        return None

    def undo() -> None:
        loop.remove_signal_handler(signal.SIGHUP)
        for task in tasks:
            task.cancel()

    return undo


def _resources(
    services: Services, settings: Settings, provider: ModelProvider | None
) -> Callable[[web.Application], AsyncIterator[None]]:
    """The ``cleanup_ctx`` generator owning every background resource: started in dependency
    order before serving, stopped in reverse after. The stores are the ones made with the
    services (taken here, as ``create_app`` always has, not re-read from ``services`` later)."""
    catalog, executor = services.catalog, services.tools
    sessions, records, backend, quotas = (
        services.sessions,
        services.records,
        services.backend,
        services.quotas,
    )

    async def resources(app: web.Application) -> AsyncIterator[None]:
        emulator = await _start_agents(services, settings)
        services.monitor.start()
        # Every agent's servers, each connected once (see AgentCatalog.connect_mcp).
        mcp_tools = await catalog.connect_mcp()
        if mcp_tools is not None:
            services.health["mcp"] = _mcp_probe(mcp_tools)
        if records is not None:
            await records.start()  # the migrations, before any request reads a session
        if backend is not None:
            await backend.start(services.runs)
        if isinstance(quotas, SharedQuotas):
            quotas.start()
        reaper = asyncio.create_task(
            _expire_sessions(sessions, settings.session_ttl_s), name="session-reaper"
        )
        sweeper = (
            asyncio.create_task(_sweep_sessions(sessions), name="session-retention")
            if isinstance(sessions, DurableSessionStore)
            else None
        )
        await executor.start()  # the calculator's first worker process (milliseconds)
        reloading = _reload_on_hangup(catalog) if settings.agents_file else None
        try:
            yield
        finally:
            if reloading is not None:
                reloading()
            await catalog.disconnect_mcp()
            await executor.aclose()  # stops the calculator's worker processes
            for task in (reaper, sweeper):
                if task is not None:
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
            if isinstance(quotas, SharedQuotas):
                await quotas.stop()
            if backend is not None:
                await backend.stop()
            if isinstance(sessions, DurableSessionStore):
                await sessions.settle(settings.shutdown_timeout_s)  # query ends not recorded yet
            if records is not None:
                await records.close()
            await services.monitor.stop()
            await catalog.close()
            if provider is not None:
                await provider.close()
            if emulator is not None:
                emulator.stop()
            await services.telemetry.shutdown()  # the last spans (the runs' ends) go out

    return resources


# Every face, in the order aiohttp registers (and matches) their routes.
FACES = (native, aisdk, agui, ws, mcp, openai, responses)
# Their parts of the OpenAPI document (WebSocket and MCP are described in its text).
DOCUMENTED = (native.OPENAPI, aisdk.OPENAPI, agui.OPENAPI, openai.OPENAPI, responses.OPENAPI)


def build_spec(settings: Settings) -> dict[str, Any]:
    """The OpenAPI document of an application with these settings."""
    return openapi.build_spec(settings, DOCUMENTED)


def add_routes(app: web.Application, settings: Settings) -> None:
    """Every route, in one place: the edge's, then each face's, then the document of them."""
    auth.setup(app, settings)
    sse.setup(app)
    for face in FACES:
        face.add_routes(app)
    openapi.add_routes(app, DOCUMENTED)


def create_app(
    settings: Settings | None = None,
    *,
    tools: Iterable[Tool] = (),
    provider: ModelProvider | None = None,
) -> web.Application:
    """Build the application; ``tools`` are offered beside the built-in ones."""
    settings = settings or load_settings()
    quiet_malformed_requests()
    services = make_services(settings, tools, provider)

    # A streaming handler resumes through every middleware it runs under, at each wake-up: the
    # server span's middleware is there only when traces are on.
    tracing = [tracing_middleware] if services.telemetry.enabled else []
    app = web.Application(
        client_max_size=settings.max_request_bytes,
        middlewares=[
            admission_middleware,  # first: a request waiting for its turn does no other work
            *tracing,  # then the server span, holding the whole answer
            error_middleware,
            auth.access_middleware,
            quota_middleware,
        ],
    )
    app[REQUEST_ADMISSION] = Admission(PER_TURN)
    app[SERVICES] = services
    app[PINGS] = {}  # the SSE streams' keep-alive pings, one timer per interval
    app[CONTEXT] = services
    app[QUOTAS] = services.quotas

    async def on_shutdown(app: web.Application) -> None:
        # Every run writes its terminal event, so each open stream sends it and closes; queued
        # messages are dropped first, so none starts while the runs end.
        await services.multitask.shutdown()
        await services.runs.shutdown()

    app.cleanup_ctx.append(_resources(services, settings, provider))
    app.on_shutdown.append(on_shutdown)
    add_routes(app, settings)
    return app
