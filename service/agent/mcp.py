"""Tools of remote MCP servers (Streamable HTTP), offered to the model beside the built-ins.

Each URL in ``AGENT_MCP_SERVERS`` gets an :class:`McpToolSource`. One background task per source
owns the connection (the official ``mcp`` SDK's :class:`mcp.Client`, whose transport lives in
anyio task groups that must be entered and left by the same task): it connects, lists the
server's tools, re-lists them every ``refresh_interval`` seconds or when :meth:`refresh` asks,
and when anything fails it drops the server's tools and reconnects with exponential backoff
(``backoff_initial`` doubling up to ``backoff_max``; a successful connection starts it over).
Tool calls are made from the agent's own tasks through that connection, each with a timeout.

A server that is down therefore never stops the service: its tools are missing until it is
back, and :meth:`McpToolSet.status` (shown by ``/healthz``) says what went wrong.

Tool names. Bedrock accepts only ``[A-Za-z0-9_-]{1,64}``, so other characters of an MCP tool's
name become ``_`` (and it is cut to 64 characters); the server is still called with its own name.
Names are **not prefixed**; a clash is resolved by **skipping** the later tool: the service's
built-in tools always win, then the servers in the order ``AGENT_MCP_SERVERS`` lists them. A
skipped tool is logged and listed under ``skipped`` in the server's status. Because a server
that is down offers nothing, a later server's tool of the same name is offered meanwhile and
gives way again when the earlier server is back.

Results. The text blocks of a result are joined with newlines (other blocks are described in
brackets; structured content stands in when there is no block at all). A result flagged
``isError`` raises :class:`McpToolError`, which the executor reports to the model as an error
tool result, as it does for a server that is not connected (:class:`McpUnavailable`) or a
call that times out.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Iterable, Sequence
from typing import Any

import anyio
import mcp_types
from mcp import Client
from mcp.shared.exceptions import MCPError
from opentelemetry import propagate

from service.agent.tools import Tool, ToolExecutor

log = logging.getLogger(__name__)

__all__ = [
    "McpTool",
    "McpToolError",
    "McpToolSet",
    "McpToolSource",
    "McpUnavailable",
    "find_mcp_tools",
    "result_text",
]

DEFAULT_REFRESH_INTERVAL_S = 60.0
DEFAULT_CONNECT_TIMEOUT_S = 10.0
DEFAULT_BACKOFF_INITIAL_S = 0.5
DEFAULT_BACKOFF_MAX_S = 30.0
# How long stop() lets the connection close politely before cancelling its task.
STOP_TIMEOUT_S = 5.0

_MAX_NAME = 64
_UNSAFE_NAME_CHARS = re.compile(r"[^A-Za-z0-9_-]")
_CLIENT_INFO = mcp_types.Implementation(name="agentstream", version="0.1.0")


class McpToolError(RuntimeError):
    """An MCP server answered a tool call with ``isError: true``."""


class McpUnavailable(RuntimeError):
    """The MCP server that owns a tool is not connected right now."""


def offered_name(remote_name: str) -> str:
    """The name the model sees for an MCP tool: Bedrock's alphabet, at most 64 characters."""
    return _UNSAFE_NAME_CHARS.sub("_", remote_name)[:_MAX_NAME]


def result_text(result: mcp_types.CallToolResult) -> str:
    """The text of a tool result: its text blocks joined with newlines, other blocks described."""
    parts: list[str] = []
    for block in result.content:
        if isinstance(block, mcp_types.TextContent):
            parts.append(block.text)
        elif isinstance(block, (mcp_types.ImageContent, mcp_types.AudioContent)):
            parts.append(f"[{block.type}: {block.mime_type}]")
        elif isinstance(block, mcp_types.ResourceLink):
            parts.append(f"[resource: {block.uri}]")
        elif isinstance(block, mcp_types.EmbeddedResource):
            resource = block.resource
            if isinstance(resource, mcp_types.TextResourceContents):
                parts.append(resource.text)
            else:
                parts.append(f"[resource: {resource.uri}]")
    if not parts and result.structured_content is not None:
        return json.dumps(result.structured_content, ensure_ascii=False, allow_nan=False)
    return "\n".join(parts)


def _describe(exc: BaseException) -> str:
    """A one-line reason, digging the first real cause out of anyio's exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    message = str(exc)
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


class McpTool(Tool):
    """One tool of an MCP server, as the tool executor holds it."""

    def __init__(self, source: McpToolSource, spec: mcp_types.Tool) -> None:
        self.source = source
        self.remote_name = spec.name
        self.name = offered_name(spec.name)
        self.description = spec.description or spec.title or f"The {spec.name} tool of {source.url}"
        schema = dict(spec.input_schema or {})
        # The model's tool interface needs an object schema even for a tool that takes nothing.
        schema.setdefault("type", "object")
        self.input_schema = schema

    async def call(self, input: dict[str, Any]) -> str:
        """Call the tool on its own server."""
        return await self.source.call_tool(self.remote_name, input)


class McpToolSource:
    """One MCP server over Streamable HTTP: its connection, its tool list and its health."""

    def __init__(
        self,
        url: str,
        *,
        call_timeout: float = 30.0,
        refresh_interval: float = DEFAULT_REFRESH_INTERVAL_S,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S,
        backoff_initial: float = DEFAULT_BACKOFF_INITIAL_S,
        backoff_max: float = DEFAULT_BACKOFF_MAX_S,
    ) -> None:
        for label, value in (
            ("call_timeout", call_timeout),
            ("refresh_interval", refresh_interval),
            ("connect_timeout", connect_timeout),
            ("backoff_initial", backoff_initial),
            ("backoff_max", backoff_max),
        ):
            if not value > 0:
                raise ValueError(f"{label} must be positive, got {value!r}")
        self.url = url
        self.call_timeout = float(call_timeout)
        self.refresh_interval = float(refresh_interval)
        self.connect_timeout = float(connect_timeout)
        self.backoff_initial = float(backoff_initial)
        self.backoff_max = max(float(backoff_max), self.backoff_initial)
        self.last_error: str | None = None
        self.version = 0  # bumped whenever the tool list changes, so readers can cache by it
        self._tools: tuple[McpTool, ...] = ()
        self._client: Client | None = None
        self._connected = asyncio.Event()
        self._wake = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        # refresh() callers, resolved by the first attempt that *starts* after they asked:
        # _waiting still wait for an attempt to start, _attempt for the one under way to end.
        self._waiting: list[asyncio.Future[None]] = []
        self._attempt: list[asyncio.Future[None]] = []
        self._was_up = False

    # ---- what the service reads ----------------------------------------------------------

    @property
    def connected(self) -> bool:
        """True while the server is connected and its tools are listed."""
        return self._connected.is_set()

    def tools(self) -> Sequence[McpTool]:
        """The server's tools as last listed; empty while it is not connected."""
        return self._tools

    def status(self) -> dict[str, Any]:
        """Health for ``/healthz``: url, connected, tool count and the last error."""
        return {
            "url": self.url,
            "connected": self.connected,
            "tools": len(self._tools),
            "last_error": self.last_error,
        }

    async def wait_connected(self) -> None:
        """Return once the server is connected and its tools are listed."""
        await self._connected.wait()

    # ---- life cycle ------------------------------------------------------------------------

    async def start(self, *, wait: bool = True) -> None:
        """Start the background connection; with ``wait``, return after the first attempt.

        The wait is bounded by ``connect_timeout``: a server that accepts connections but never
        answers must not hold up the service's start.
        """
        if self._task is not None:
            raise RuntimeError(f"MCP source {self.url} is already started")
        self._stopping = False
        first = self._request_attempt()
        self._task = asyncio.create_task(self._run(), name=f"mcp:{self.url}")
        if wait:
            await asyncio.wait([first], timeout=self.connect_timeout)

    async def stop(self) -> None:
        """Close the connection and end the background task (cancelled if it does not end)."""
        self._stopping = True
        self._wake.set()
        task, self._task = self._task, None
        if task is not None:
            # An idle connection closes at once; one stuck mid-request gets cancelled.
            done, _ = await asyncio.wait([task], timeout=STOP_TIMEOUT_S)
            if not done:
                task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self._set_down(None)
        self._resolve([*self._attempt, *self._waiting])
        self._attempt, self._waiting = [], []

    async def refresh(self) -> None:
        """List the tools again now (reconnecting at once, skipping the backoff, when down).

        Returns after an attempt that started after this call has finished, successful or not;
        :attr:`connected`, :meth:`tools` and :attr:`last_error` then tell how it went.
        """
        if self._task is None or self._task.done():
            raise RuntimeError(f"MCP source {self.url} is not running")
        await self._request_attempt()

    def _request_attempt(self) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append(future)
        self._wake.set()
        return future

    # ---- calls -----------------------------------------------------------------------------

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        """Call ``name`` on this server with a timeout; raise when it fails or reports an error."""
        client = self._client
        if client is None:
            reason = f" ({self.last_error})" if self.last_error else ""
            raise McpUnavailable(f"MCP server {self.url} is not connected{reason}")
        try:
            result = await client.call_tool(
                name, arguments, read_timeout_seconds=self.call_timeout, meta=_trace_meta()
            )
        except MCPError as exc:
            if exc.code != mcp_types.REQUEST_TIMEOUT:
                # A protocol-level failure (connection closed, session gone, tool unknown) means
                # the listing may be stale: have the connection's task check the server now.
                self._wake.set()
            raise McpToolError(f"MCP server {self.url}: {exc.message}") from exc
        text = result_text(result)
        if result.is_error:
            raise McpToolError(text or f"the MCP tool {name!r} reported an error")
        return text

    # ---- the connection's own task ---------------------------------------------------------

    async def _run(self) -> None:
        delay = self.backoff_initial
        while not self._stopping:
            self._was_up = False
            try:
                await self._serve()
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # noqa: BLE001 - any failure means "down, retry later"
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    raise
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # stop() cancelled us mid-way: not an outage
                error = _describe(exc)
                # Warn when the server goes down or fails differently, not on every retry.
                level = logging.WARNING if self._was_up or error != self.last_error else logging.DEBUG
                self._set_down(error)
                log.log(level, "MCP server %s is unavailable: %s", self.url, error)
            # Whoever asked before the failed attempt began has had their answer.
            self._resolve(self._attempt)
            self._attempt = []
            if self._stopping:
                break
            if self._was_up:
                # It worked for a while: a fresh outage starts the backoff from the beginning.
                delay = self.backoff_initial
            if not await self._pause(delay):
                delay = min(delay * 2, self.backoff_max)

    async def _serve(self) -> None:
        """Connect, list, and keep re-listing until stopped; an exception means the server is down."""
        self._start_attempt()
        try:
            async with Client(
                self.url,
                cache=None,  # a refresh must reach the server, not a client-side cache
                read_timeout_seconds=self.connect_timeout,
                client_info=_CLIENT_INFO,
            ) as client:
                await self._list(client)
                self._client = client
                self._was_up = True
                self.last_error = None
                self._connected.set()
                self._finish_attempt()
                log.info("MCP server %s connected: %d tool(s)", self.url, len(self._tools))
                while True:
                    await self._pause(self.refresh_interval)
                    if self._stopping:
                        return
                    self._start_attempt()
                    await self._list(client)
                    self._finish_attempt()
        finally:
            # Calls must not reach a closing session; the tools go with it in _set_down.
            self._client = None

    async def _list(self, client: Client) -> None:
        specs: list[mcp_types.Tool] = []
        cursor: str | None = None
        while True:
            page = await client.list_tools(cursor=cursor)
            specs.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
        tools = tuple(McpTool(self, spec) for spec in specs)
        if [(t.remote_name, t.description, t.input_schema) for t in tools] != [
            (t.remote_name, t.description, t.input_schema) for t in self._tools
        ]:
            self.version += 1
        self._tools = tools

    async def _pause(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True when woken early (a refresh or stop asked)."""
        woken = False
        with anyio.move_on_after(seconds):
            await self._wake.wait()
            woken = True
        self._wake.clear()
        return woken

    def _start_attempt(self) -> None:
        # The callers waiting now are served by the attempt starting now; later ones by the next.
        self._wake.clear()
        self._attempt, self._waiting = self._waiting, []

    def _finish_attempt(self) -> None:
        self._resolve(self._attempt)
        self._attempt = []

    def _set_down(self, error: str | None) -> None:
        self._client = None
        self._connected.clear()
        if self._tools:
            self._tools = ()
            self.version += 1
        if error is not None:
            self.last_error = error

    @staticmethod
    def _resolve(futures: Iterable[asyncio.Future[None]]) -> None:
        for future in futures:
            if not future.done():
                future.set_result(None)


class McpToolSet:
    """Every configured MCP server as one tool source for the executor, name clashes resolved."""

    def __init__(self, urls: Iterable[str], *, reserved: Iterable[str] = (), **options: Any) -> None:
        unique = list(dict.fromkeys(url.strip() for url in urls if url.strip()))
        self._options = options
        self.sources = [McpToolSource(url, **options) for url in unique]
        self.reserved = frozenset(reserved)
        self._key: tuple[int, ...] | None = None
        self._offered: list[McpTool] = []
        self._skipped: dict[str, list[str]] = {}

    def tools(self) -> Sequence[Tool]:
        """The tools offered now: built-in names and earlier servers win clashes (see module)."""
        self._resolve_names()
        return self._offered

    def status(self) -> list[dict[str, Any]]:
        """Per server: url, connected, tools (as listed), last_error, and skipped tool names."""
        self._resolve_names()
        return [{**source.status(), "skipped": self._skipped.get(source.url, [])} for source in self.sources]

    async def start(self) -> None:
        """Connect to every server at once; return when each has had its first attempt."""
        await asyncio.gather(*(source.start() for source in self.sources))

    async def stop(self) -> None:
        """Disconnect from every server."""
        await asyncio.gather(*(source.stop() for source in self.sources))

    async def extend(self, urls: Iterable[str]) -> None:
        """Connect to the servers of ``urls`` not in the set yet (an agents file reloaded with new
        ones); return when each new one has had its first attempt. Their tools come after the
        earlier servers' in every clash."""
        known = {source.url for source in self.sources}
        added = [McpToolSource(url, **self._options) for url in dict.fromkeys(urls) if url not in known]
        if added:
            self.sources = [*self.sources, *added]
            self._key = None
            await asyncio.gather(*(source.start() for source in added))

    async def refresh(self) -> None:
        """Re-list every server's tools now (reconnecting those that are down)."""
        await asyncio.gather(*(source.refresh() for source in self.sources))

    def _resolve_names(self) -> None:
        key = tuple(source.version for source in self.sources)
        if key == self._key:
            return
        taken = set(self.reserved)
        offered: list[McpTool] = []
        skipped: dict[str, list[str]] = {}
        for source in self.sources:
            for tool in source.tools():
                if not tool.name or tool.name in taken:
                    skipped.setdefault(source.url, []).append(tool.remote_name)
                    log.warning(
                        "MCP tool %r of %s is not offered: the name %r is already taken",
                        tool.remote_name,
                        source.url,
                        tool.name,
                    )
                    continue
                taken.add(tool.name)
                offered.append(tool)
        self._key, self._offered, self._skipped = key, offered, skipped


def find_mcp_tools(executor: ToolExecutor) -> McpToolSet | None:
    """The MCP tool set an executor holds, if any."""
    for source in executor.sources:
        if isinstance(source, McpToolSet):
            return source
    return None


def _trace_meta() -> mcp_types.RequestParamsMeta | None:
    """The call's trace context (its ``execute_tool`` span's) for the request's ``_meta``, where
    MCP servers look for ``traceparent``; None when traces are off."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return mcp_types.RequestParamsMeta(**carrier) if carrier else None  # type: ignore[typeddict-item]
