"""What the transports need from the rest of the service, in one small typed place.

The app builds a :class:`Context` (its :class:`~service.app.Services` is one) and stores it under
:data:`CONTEXT`; handlers reach it with :func:`context_of`. Through it a transport sees settings,
sessions, runs, metrics and quotas, and the health probes the app registered (the shared store,
the MCP servers whose tools are offered): never the agent, a provider or ``app.py``, so the
transports depend on the core alone and any of them can be read without the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from opentelemetry.trace import Tracer

from service.config import Settings
from service.core.agents import AgentDirectory, OneAgent, chosen
from service.core.multitask import Multitask
from service.core.options import RunOptions
from service.core.runs import RunManager
from service.core.sessions import Session, SessionStore
from service.core.traces import NO_TRACER
from service.errors import SessionNotFound
from service.metrics import Metrics
from service.monitor import LoopLagMonitor
from service.quotas.local import Quotas
from service.transports.edge.auth import owner_of


@dataclass(frozen=True, slots=True)
class Health:
    """One probe's answer: its section of ``/healthz``, and whether the service can take work."""

    section: Any
    healthy: bool = True


# A probe answers within the time ``/healthz`` gives it (seconds), or is taken as unhealthy.
HealthProbe = Callable[[float], Awaitable[Health]]


@dataclass(kw_only=True)
class Context:
    """Everything a transport needs, in one typed place."""

    settings: Settings
    sessions: SessionStore
    runs: RunManager
    monitor: LoopLagMonitor
    metrics: Metrics = field(default_factory=Metrics)
    quotas: Quotas = field(default_factory=Quotas)  # per API key; unlimited unless configured
    # ``/healthz`` sections by name (``store``, ``database``, ``mcp``); the app registers them.
    health: dict[str, HealthProbe] = field(default_factory=dict)
    # The JSON schema of an offered tool's input by its name (None: no such tool), so an
    # approver's edited input is checked before the tool gets it; the app wires the tools'.
    tool_schema: Callable[[str], dict[str, Any] | None] = field(default=lambda name: None)
    # The agents a session may be made for (see service.core.agents).
    agents: AgentDirectory = field(default_factory=OneAgent)
    # Where spans go (service.telemetry; the API's no-op tracer when traces are off).
    tracer: Tracer = NO_TRACER
    # Messages sent while a query runs (``multitask_strategy``), and this instance's queues.
    multitask: Multitask = field(init=False)

    def __post_init__(self) -> None:
        self.multitask = Multitask(self.runs, max_queued=self.settings.max_queued)

    @contextlib.asynccontextmanager
    async def stream_slot(self, transport: str, owner: str | None = None) -> AsyncIterator[None]:
        """Count a streaming connection for as long as the block runs; with ``owner``, it also
        holds one of that owner's stream slots (``AGENT_QUOTA_STREAMS``) and one of the instance's
        (``AGENT_MAX_STREAMS``): entering raises :class:`~service.errors.QuotaExceeded` (a 429) or
        :class:`~service.errors.StreamLimitReached` (a 503) when none is free, so enter before the
        response starts."""
        if owner is not None:
            await self.quotas.open_stream(owner)
        gauge = self.metrics.connections.labels(transport)
        gauge.inc()
        try:
            yield
        finally:
            gauge.dec()
            if owner is not None:
                await self.quotas.close_stream(owner)

    async def start_ephemeral(
        self,
        message: str,
        max_turns: int | None,
        owner: str = "",
        *,
        messages: list[dict[str, Any]] | None = None,
        options: RunOptions | None = None,
        agent: str | None = None,
    ) -> Session:
        """A short-lived session (``POST /agent/stream``, a WebSocket ``run``, a chat completion)
        with its query started; ``messages`` is the conversation it starts from, if any, and
        ``agent`` the agent that answers (:class:`~service.errors.UnknownAgent` for one not
        defined; the default one when None)."""
        session = await self.sessions.create(ephemeral=True, owner=owner, agent=chosen(self.agents, agent))
        if messages:
            session.messages = messages
        try:
            await self.runs.start(session, message, max_turns, options)
        except BaseException:
            await self.sessions.delete(session.id)
            raise
        return session

    async def end_ephemeral(self, session_id: str) -> None:
        """Cancel the short-lived session's query if it still runs (its client left), then forget it."""
        await self.runs.cancel(session_id)
        with contextlib.suppress(SessionNotFound):
            await self.sessions.delete(session_id)

    async def probe(self, timeout: float) -> tuple[dict[str, Any], list[str]]:
        """Every health probe at once, each within ``timeout``: the sections, and the names of the
        unhealthy ones. A probe that does not answer in time is unhealthy, with ``timed_out``."""

        async def one(probe: HealthProbe) -> Health:
            try:
                # A probe keeps to ``timeout`` itself; this is the net under one that does not.
                async with asyncio.timeout(timeout * 1.5):
                    return await probe(timeout)
            except TimeoutError:
                return Health({"connected": False, "timed_out": True}, healthy=False)

        names = list(self.health)
        answers = await asyncio.gather(*(one(self.health[name]) for name in names))
        sections = {name: answer.section for name, answer in zip(names, answers, strict=True)}
        return sections, [name for name, answer in zip(names, answers, strict=True) if not answer.healthy]


CONTEXT = web.AppKey("context", Context)


def context_of(request: web.Request) -> Context:
    """The request's context."""
    return request.app[CONTEXT]


async def session_of(request: web.Request) -> tuple[Context, Session]:
    """The context and the session named in the path; 404 ``Session not found`` otherwise."""
    context = request.app[CONTEXT]
    session = await context.sessions.get_owned(request.match_info["session_id"], owner_of(request))
    return context, session
