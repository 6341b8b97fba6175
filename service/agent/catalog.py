"""The named agents a service runs: ``AGENT_AGENTS_FILE``, or the environment as one agent.

A TOML file holds one ``[agents.NAME]`` table per agent::

    [agents.support]
    description = "Answers questions about orders."
    provider = "bedrock"                  # bedrock, openai or emulator
    model = "anthropic.claude-3-haiku-20240307-v1:0"
    system_prompt = "You help customers with their orders."
    tools = ["calculator"]                # built-in tools; left out: all of them
    mcp_servers = ["http://tickets:9000/mcp"]
    require_approval = ["*"]
    client_tools = false

What a table leaves out comes from the environment (``AGENT_PROVIDER``, ``AGENT_MODEL_ID``,
``AGENT_SYSTEM_PROMPT``, ``AGENT_MAX_TURNS``, ``AGENT_MCP_SERVERS``, ...), and so do the
endpoints and credentials unless the agent names its own (``region`` and ``endpoint_url`` for
Bedrock, ``base_url`` and ``api_key`` for an OpenAI-compatible server). The file is read with
pydantic at start: a bad one stops the start with a message naming the agent and the field.
Without a file, the environment's settings are the one agent ``default``, exactly as before.

Agents that name the same upstream share one provider (one connection pool, one client; each
request names its agent's model), and the MCP servers of every agent are one tool set, each
server connected once; each agent's :class:`~service.agent.loop.AgentLoop` offers and runs only its
own tools (:meth:`~service.agent.tools.ToolExecutor.view`).

:meth:`AgentCatalog.reload` (on SIGHUP) reads the file again: a query that runs keeps the
definition it started with, every query started afterwards gets the new one; a file that does not
validate is refused, with an ERROR log line, and the old definitions stay.
"""

from __future__ import annotations

import logging
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from opentelemetry.trace import Tracer
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from service.agent.loop import AgentLoop
from service.agent.mcp import McpTool, McpToolSet
from service.agent.tools import Tool, ToolExecutor
from service.config import Settings
from service.core.agents import AgentInfo
from service.core.model_calls import TurnObserver, ignore
from service.core.sessions import DEFAULT_AGENT
from service.core.traces import NO_TRACER
from service.errors import AgentStreamError, ProviderError, UnknownAgent
from service.providers.base import ModelProvider

log = logging.getLogger(__name__)

AgentName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
Provider = Literal["bedrock", "openai", "emulator"]


class AgentSpec(BaseModel):
    """One ``[agents.NAME]`` table; what it leaves out (None) comes from the environment."""

    model_config = ConfigDict(extra="forbid", strict=True)

    description: str = ""
    provider: Provider | None = None
    model: Annotated[str, Field(min_length=1)] | None = None
    system_prompt: str | None = None
    max_turns: Annotated[int, Field(ge=1, le=100)] | None = None
    max_tokens: Annotated[int, Field(ge=1, le=200_000)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    context_max_tokens: Annotated[int, Field(ge=0)] | None = None
    tools: list[str] | None = None
    mcp_servers: list[Annotated[str, Field(pattern=r"^https?://")]] | None = None
    require_approval: list[str] | None = None
    client_tools: bool = True
    region: str | None = None
    endpoint_url: Annotated[str, Field(pattern=r"^https?://")] | None = None
    base_url: str | None = None
    api_key: str | None = None


class AgentsFile(BaseModel):
    """The whole file: at least one agent."""

    model_config = ConfigDict(extra="forbid", strict=True)

    agents: Annotated[dict[AgentName, AgentSpec], Field(min_length=1)]


class AgentsFileError(AgentStreamError, ValueError):
    """``AGENT_AGENTS_FILE`` cannot be read or does not validate; the message names the agent
    and the field. An :class:`AgentStreamError`, so that ``python -m service`` (and each worker)
    stops on it with that one line rather than a traceback."""


@dataclass(frozen=True)
class Definition:
    """One agent, every field resolved against the environment."""

    name: str
    description: str
    provider: str
    model: str
    system_prompt: str
    max_turns: int
    max_tokens: int
    temperature: float | None
    context_max_tokens: int
    tools: frozenset[str] | None  # built-in tools offered; None: all of them
    mcp_servers: tuple[str, ...]
    require_approval: tuple[str, ...]
    client_tools: bool
    upstream: tuple[str, ...] = field(default=())  # what one shared provider is keyed by
    region: str | None = None
    endpoint_url: str | None = None
    base_url: str = ""
    api_key: str = ""

    def info(self, tool_names: Iterable[str]) -> AgentInfo:
        return AgentInfo(
            self.name, self.description, self.provider, self.model, tuple(tool_names), self.client_tools
        )


def _resolved(name: str, spec: AgentSpec, settings: Settings) -> Definition:
    provider = spec.provider or settings.provider
    model = spec.model or settings.model_id
    base_url = spec.base_url if spec.base_url is not None else settings.openai_base_url
    api_key = spec.api_key if spec.api_key is not None else settings.openai_api_key
    max_tokens = spec.max_tokens or settings.max_tokens
    context = spec.context_max_tokens
    if not context:
        context = settings.model_copy(update={"model_id": model, "max_tokens": max_tokens}).context_limit()
    if provider == "openai":
        upstream: tuple[str, ...] = ("openai", base_url, api_key)
    elif provider == "emulator":
        upstream = ("emulator",)
    else:
        upstream = ("bedrock", spec.region or "", spec.endpoint_url or "")
    return Definition(
        name=name,
        description=spec.description,
        provider=provider,
        model=model,
        system_prompt=spec.system_prompt if spec.system_prompt is not None else settings.system_prompt,
        max_turns=spec.max_turns or settings.max_turns,
        max_tokens=max_tokens,
        temperature=spec.temperature,
        context_max_tokens=context,
        tools=frozenset(spec.tools) if spec.tools is not None else None,
        mcp_servers=tuple(spec.mcp_servers if spec.mcp_servers is not None else settings.mcp_servers),
        require_approval=tuple(
            spec.require_approval if spec.require_approval is not None else settings.tools_require_approval
        ),
        client_tools=spec.client_tools,
        upstream=upstream,
        region=spec.region,
        endpoint_url=spec.endpoint_url,
        base_url=base_url,
        api_key=api_key,
    )


def _where(loc: tuple[int | str, ...]) -> str:
    if len(loc) == 3 and loc[0] == "agents" and loc[2] == "[key]":
        return f"agent name {loc[1]!r}"  # pydantic's place for a dict key that does not validate
    if len(loc) >= 2 and loc[0] == "agents":
        rest = ".".join(str(part) for part in loc[2:]) or "(the table)"
        return f"agent {loc[1]!r}, field {rest!r}"
    return f"field {'.'.join(str(part) for part in loc)!r}"


def load_definitions(settings: Settings, builtin: Iterable[str]) -> dict[str, Definition]:
    """The agents the settings define, by name, in file order; :class:`AgentsFileError` for a
    file that cannot be read or does not validate (unknown built-in tools included)."""
    if not settings.agents_file:
        spec = AgentSpec()
        return {DEFAULT_AGENT: _resolved(DEFAULT_AGENT, spec, settings)}
    path = Path(settings.agents_file)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise AgentsFileError(f"AGENT_AGENTS_FILE {path}: cannot be read: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise AgentsFileError(f"AGENT_AGENTS_FILE {path}: not valid TOML: {exc}") from None
    try:
        parsed = AgentsFile.model_validate(raw)
    except ValidationError as exc:
        problems = [f"{_where(error['loc'])}: {error['msg']}" for error in exc.errors(include_url=False)[:5]]
        raise AgentsFileError(f"AGENT_AGENTS_FILE {path}: {'; '.join(problems)}") from None
    known = sorted(builtin)
    definitions = {}
    for name, spec in parsed.agents.items():
        unknown = sorted(set(spec.tools or ()) - set(known))
        if unknown:
            raise AgentsFileError(
                f"AGENT_AGENTS_FILE {path}: agent {name!r}, field 'tools': no built-in tool named "
                f"{', '.join(unknown)} (there are: {', '.join(known) or 'none'})"
            )
        definitions[name] = _resolved(name, spec, settings)
    return definitions


def needs_emulator(definitions: Iterable[Definition]) -> bool:
    """True when an agent talks to the embedded emulator (on Bedrock's wire or OpenAI's)."""
    return any(
        d.provider == "emulator" or (d.provider == "openai" and d.base_url == "emulator") for d in definitions
    )


def make_provider(
    definition: Definition, settings: Settings, emulator_url: str | None = None
) -> ModelProvider:
    """A provider for the definition's upstream; ``base_url = "emulator"`` means the embedded one."""
    from service.providers.bedrock import BedrockProvider

    common: dict[str, Any] = {
        "model_id": definition.model,
        "max_concurrent_runs": settings.max_concurrent_runs,
        "max_attempts": settings.bedrock_max_attempts,
        "read_timeout": settings.bedrock_read_timeout_s,
    }
    if definition.provider == "emulator":
        assert emulator_url is not None
        return BedrockProvider(
            **common,
            endpoint_url=emulator_url,
            region_name="us-east-1",
            credentials={"aws_access_key_id": "emulator", "aws_secret_access_key": "emulator"},
        )
    if definition.provider == "bedrock":
        return BedrockProvider(**common, endpoint_url=definition.endpoint_url, region_name=definition.region)
    if definition.provider == "openai":
        from service.providers.openai import OpenAIProvider

        base_url = definition.base_url
        if base_url == "emulator":
            # The embedded emulator serves the OpenAI-compatible route under /v1, like OpenAI.
            assert emulator_url is not None
            base_url = f"{emulator_url}/v1"
        return OpenAIProvider(
            base_url=base_url,
            api_key=definition.api_key,
            model_id=definition.model,
            max_concurrent_runs=settings.max_concurrent_runs,
            # The service's one upstream read-timeout setting; its name predates this provider.
            read_timeout=settings.bedrock_read_timeout_s,
        )
    raise ProviderError(
        f"provider {definition.provider} is not available in this version", code="unavailable"
    )


class AgentCatalog:
    """The agents, built: an :class:`AgentLoop` each, on shared providers and tools.

    It is the run manager's ``agents`` (:meth:`resolve`) and the faces' directory
    (:attr:`default`, :meth:`agents`).
    """

    def __init__(
        self,
        settings: Settings,
        executor: ToolExecutor,
        definitions: dict[str, Definition],
        *,
        provider: ModelProvider | None = None,
    ) -> None:
        self.settings = settings
        self.executor = executor
        self.definitions = definitions
        # A provider given by the caller (a test's) serves every agent.
        self._given = provider
        self._providers: dict[tuple[str, ...], ModelProvider] = {}
        self._loops: dict[str, AgentLoop] = {}
        self._emulator_url: str | None = None
        # Every agent's MCP servers, as one tool source of the executor (None while there are none).
        self.mcp_tools: McpToolSet | None = None
        self.tracer: Tracer = NO_TRACER  # the app's (service.telemetry), set before start
        # Told of each model turn of every agent (the app's GenAI metrics), set before start.
        self.turn_observer: TurnObserver = ignore

    @classmethod
    def from_settings(
        cls, settings: Settings, executor: ToolExecutor, provider: ModelProvider | None = None
    ) -> AgentCatalog:
        """The catalog the settings define (:class:`AgentsFileError` for a bad file)."""
        return cls(settings, executor, load_definitions(settings, executor.names), provider=provider)

    # --- what the faces see ----------------------------------------------------------------------

    @property
    def default(self) -> str:
        """The agent of a session made without naming one: ``default`` if the file defines it,
        else its first agent."""
        return DEFAULT_AGENT if DEFAULT_AGENT in self.definitions else next(iter(self.definitions))

    def agents(self) -> list[AgentInfo]:
        return [definition.info(self._tool_names(definition)) for definition in self.definitions.values()]

    def mcp_servers(self) -> list[str]:
        """Every agent's MCP servers, each once, in order."""
        return list(dict.fromkeys(url for d in self.definitions.values() for url in d.mcp_servers))

    # --- what the run manager uses ---------------------------------------------------------------

    def resolve(self, name: str) -> tuple[AgentLoop, int]:
        """The agent a query of a session bound to ``name`` runs with, and its max turns
        (``default`` is always the default agent); :class:`UnknownAgent` when none has that name
        (a reload removed it)."""
        if name == DEFAULT_AGENT and name not in self._loops:
            name = self.default
        loop = self._loops.get(name)
        if loop is None:
            raise UnknownAgent(name, list(self.definitions))
        return loop, self.definitions[name].max_turns

    # --- building ----------------------------------------------------------------------------------

    def _allow(self, definition: Definition) -> Callable[[Tool], bool]:
        servers = frozenset(definition.mcp_servers)
        builtin = definition.tools

        def allow(tool: Tool) -> bool:
            if isinstance(tool, McpTool):
                return tool.source.url in servers
            return builtin is None or tool.name in builtin

        return allow

    def _tool_names(self, definition: Definition) -> list[str]:
        allow = self._allow(definition)
        return [name for name, tool in self.executor.current().items() if allow(tool)]

    def _loop(self, definition: Definition, provider: ModelProvider | None) -> AgentLoop:
        settings = self.settings
        return AgentLoop(
            provider,
            self.executor.view(self._allow(definition)),
            system_prompt=definition.system_prompt,
            max_tokens=definition.max_tokens,
            throttle_retries=settings.throttle_retries,
            backoff_s=settings.throttle_backoff_s,
            backoff_max_s=settings.throttle_backoff_max_s,
            planning=settings.steps_planning,
            require_approval=definition.require_approval,
            context_max_tokens=definition.context_max_tokens,
            name=definition.name,
            model=definition.model,
            temperature=definition.temperature,
            max_turns=definition.max_turns,
            tracer=self.tracer,
            turn_observer=self.turn_observer,
        )

    @property
    def needs_emulator(self) -> bool:
        return self._given is None and needs_emulator(self.definitions.values())

    async def start(self, emulator_url: str | None = None) -> None:
        """Make and start a provider per upstream, and an agent loop per agent."""
        self._emulator_url = emulator_url
        self._loops = await self._build(self.definitions)

    async def _build(self, definitions: dict[str, Definition]) -> dict[str, AgentLoop]:
        loops = {}
        for name, definition in definitions.items():
            loops[name] = self._loop(definition, await self._provider(definition))
        return loops

    async def _provider(self, definition: Definition) -> ModelProvider:
        if self._given is not None:
            return self._given
        provider = self._providers.get(definition.upstream)
        if provider is None:
            provider = make_provider(definition, self.settings, self._emulator_url)
            start = getattr(provider, "start", None)
            if start is not None:
                # Made before serving: a client loads its service model from disk, blocking work
                # that would otherwise stall the loop under the first requests.
                await start()
            self._providers[definition.upstream] = provider
        return provider

    @property
    def providers(self) -> list[ModelProvider]:
        """The providers made, one per upstream (the given one alone when a caller gave one)."""
        return [self._given] if self._given is not None else list(self._providers.values())

    async def connect_mcp(self, urls: Iterable[str] | None = None) -> McpToolSet | None:
        """Connect the MCP servers of ``urls`` (every agent's, by default) not connected yet: one
        tool set for all of them, each server once; the tool set, None while there are none.
        A server that is down only lacks its tools; it is retried in the background."""
        wanted = list(urls if urls is not None else self.mcp_servers())
        if not wanted:
            return self.mcp_tools
        if self.mcp_tools is None:
            self.mcp_tools = McpToolSet(
                wanted, reserved=self._builtin_names(), call_timeout=self.settings.tool_timeout_s
            )
            self.executor.add_source(self.mcp_tools)
            await self.mcp_tools.start()
        else:
            await self.mcp_tools.extend(wanted)
        return self.mcp_tools

    async def disconnect_mcp(self) -> None:
        """Stop offering the MCP servers' tools and close their connections."""
        tools, self.mcp_tools = self.mcp_tools, None
        if tools is not None:
            self.executor.remove_source(tools)
            await tools.stop()

    async def reload(self) -> bool:
        """Read the file again and use it for every query that starts from now on; False (and an
        ERROR log line) when it does not validate, the old definitions staying."""
        try:
            definitions = load_definitions(self.settings, self._builtin_names())
            if needs_emulator(definitions.values()) and self._emulator_url is None and self._given is None:
                raise AgentsFileError(
                    "an agent needs the embedded emulator, which this service did not start"
                )
            loops = await self._build(definitions)
            # A new agent's new MCP servers are connected before any query of it can start.
            await self.connect_mcp(url for d in definitions.values() for url in d.mcp_servers)
        except (AgentsFileError, ProviderError) as exc:
            log.error("the agents file was not reloaded; the agents stay as they were: %s", exc)
            return False
        self.definitions, self._loops = definitions, loops
        log.info("agents reloaded: %s", ", ".join(definitions))
        return True

    def _builtin_names(self) -> list[str]:
        return [name for name, tool in self.executor.current().items() if not isinstance(tool, McpTool)]

    async def close(self) -> None:
        """Close the providers this catalog made."""
        for provider in self._providers.values():
            await provider.close()
        self._providers.clear()
