"""MCP tools against real MCP servers: the SDK's own server (MCPServer over Streamable HTTP,
served by uvicorn in a thread on a loopback port), reached by the service's MCP client."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from service.agent.calculator import builtin_tools
from service.agent.mcp import (
    McpToolError,
    McpToolSet,
    McpToolSource,
    McpUnavailable,
    find_mcp_tools,
    offered_name,
)
from service.agent.tools import FunctionTool, Tool, ToolExecutor
from tests.conftest import ClientFactory, services_of, stream_agent
from tests.support._pipes import free_port

pytestmark = pytest.mark.timeout(60)


def build_server(name: str, metas: list[dict[str, Any]] | None = None) -> MCPServer:
    """An MCP server named ``name`` whose tools say which server answered; ``ping`` adds each
    call's ``_meta`` to ``metas``."""
    server: MCPServer = MCPServer(name, log_level="WARNING")

    @server.tool()
    def ping(ctx: Context) -> str:
        """Answer with the server's name."""
        if metas is not None:
            metas.append(dict(ctx.request_context.meta or {}))
        return f"pong from {name}"

    if name == "alpha":

        @server.tool()
        def add(a: int, b: int) -> int:
            """Add two numbers."""
            return a + b

        @server.tool()
        def fail() -> str:
            """Always fails."""
            raise ToolError("the failing tool failed")

        @server.tool()
        async def slow(seconds: float = 2.0) -> str:
            """Answer after a while."""
            await asyncio.sleep(seconds)
            return "slept"

    else:

        @server.tool()
        def multiply(a: int, b: int) -> int:
            """Multiply two numbers."""
            return a * b

        @server.tool(name="math.negate")
        def negate(x: int) -> int:
            """Negate a number."""
            return -x

        @server.tool()
        def calculator() -> str:
            """Clashes with the built-in calculator."""
            return "not the built-in"

    return server


class McpTestServer:
    """One MCP server on a fixed loopback port that a test can start and stop (and restart)."""

    def __init__(self, name: str, port: int | None = None) -> None:
        self.name = name
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.metas: list[dict[str, Any]] = []  # the _meta of each ping call (in the server's thread)
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Serve in a thread; return once the port accepts connections."""
        assert self._server is None, "already running"
        # A fresh app each time: an MCP session manager runs only once.
        config = uvicorn.Config(
            build_server(self.name, self.metas).streamable_http_app(),
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            timeout_graceful_shutdown=1,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name=f"mcp-{self.name}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 15
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                if not self._thread.is_alive():
                    raise RuntimeError(f"MCP server {self.name} did not start") from None
                if time.monotonic() > deadline:
                    raise TimeoutError(f"MCP server {self.name} is not accepting connections") from None
                time.sleep(0.01)  # between connection attempts, not a guess at start-up time

    def stop(self) -> None:
        """Stop serving and wait until the port is closed."""
        if self._server is None:
            return
        self._server.should_exit = True
        assert self._thread is not None
        self._thread.join(timeout=15)
        assert not self._thread.is_alive(), f"MCP server {self.name} did not stop"
        self._server = self._thread = None


@pytest.fixture
def mcp_servers() -> Iterator[list[McpTestServer]]:
    """Started servers are stopped at the end of the test."""
    servers: list[McpTestServer] = []
    yield servers
    for server in servers:
        server.stop()


@pytest.fixture
def alpha(mcp_servers: list[McpTestServer]) -> McpTestServer:
    """The server with add, fail, slow and ping, running."""
    server = McpTestServer("alpha")
    mcp_servers.append(server)
    server.start()
    return server


@pytest.fixture
def beta(mcp_servers: list[McpTestServer]) -> McpTestServer:
    """The server with multiply, math.negate, calculator and ping, running."""
    server = McpTestServer("beta")
    mcp_servers.append(server)
    server.start()
    return server


@pytest.fixture
def down(mcp_servers: list[McpTestServer]) -> McpTestServer:
    """Like alpha, but not started: its port is closed until the test starts it."""
    server = McpTestServer("alpha")
    mcp_servers.append(server)
    return server


async def started_set(urls: Sequence[str], **options: Any) -> tuple[ToolExecutor, McpToolSet]:
    """An executor holding the built-ins and the MCP tools of ``urls``, connected."""
    executor = ToolExecutor(builtin_tools(), timeout=10)
    tools = McpToolSet(urls, reserved=executor.names, **options)
    executor.add_source(tools)
    await tools.start()
    return executor, tools


# ---------------------------------------------------------------------------------------------
# Listing and calling
# ---------------------------------------------------------------------------------------------


async def test_tools_are_listed_beside_the_builtins(alpha: McpTestServer, beta: McpTestServer) -> None:
    executor, tools = await started_set([alpha.url, beta.url])
    try:
        assert executor.names == ["calculator", "ping", "add", "fail", "slow", "multiply", "math_negate"]
        specs = {spec["name"]: spec for spec in executor.specs()}
        assert specs["add"]["description"] == "Add two numbers."
        assert specs["add"]["input_schema"]["type"] == "object"
        assert set(specs["add"]["input_schema"]["properties"]) == {"a", "b"}
        assert specs["ping"]["input_schema"]["type"] == "object"
        config = executor.bedrock_tool_config()
        assert config is not None and len(config["tools"]) == 7
        # Clashes are skipped, not prefixed: the built-in and the first server keep the name.
        assert tools.status() == [
            {"url": alpha.url, "connected": True, "tools": 4, "last_error": None, "skipped": []},
            {
                "url": beta.url,
                "connected": True,
                "tools": 4,
                "last_error": None,
                "skipped": ["ping", "calculator"],
            },
        ]
    finally:
        await tools.stop()


async def test_a_call_reaches_the_right_server(alpha: McpTestServer, beta: McpTestServer) -> None:
    executor, tools = await started_set([alpha.url, beta.url])
    try:
        ping = await executor.run("ping", "t1", {})
        assert (ping.result, ping.is_error) == ("pong from alpha", False)
        assert (await executor.run("add", "t2", {"a": 2, "b": 3})).result == "5"
        assert (await executor.run("multiply", "t3", {"a": 6, "b": 7})).result == "42"
        # A renamed tool is called by its own name on its server.
        assert (await executor.run("math_negate", "t4", {"x": 3})).result == "-3"
        # The built-in keeps its name; beta's "calculator" is not what runs.
        assert (await executor.run("calculator", "t5", {"expression": "1+1"})).result == "2"
        # Calls from many tasks share the one connection.
        outcomes = await asyncio.gather(*(executor.run("add", f"c{i}", {"a": i, "b": i}) for i in range(10)))
        assert [o.result for o in outcomes] == [str(2 * i) for i in range(10)]
    finally:
        await tools.stop()


async def test_a_failing_tool_is_an_error_result(alpha: McpTestServer) -> None:
    executor, tools = await started_set([alpha.url])
    try:
        outcome = await executor.run("fail", "t1", {})
        assert outcome.is_error
        assert "the failing tool failed" in outcome.result
        with pytest.raises(McpToolError, match="the failing tool failed"):
            await tools.sources[0].call_tool("fail", {})
        # Arguments the server's schema refuses are its error too, and the run goes on.
        bad = await executor.run("add", "t2", {"a": "not a number"})
        assert bad.is_error and "add" in bad.result
        assert (await executor.run("add", "t3", {"a": 1, "b": 1})).result == "2"
    finally:
        await tools.stop()


async def test_a_call_has_a_timeout(alpha: McpTestServer) -> None:
    executor, tools = await started_set([alpha.url], call_timeout=0.2)
    try:
        started = time.monotonic()
        outcome = await executor.run("slow", "t1", {"seconds": 5})
        assert outcome.is_error and "timed out" in outcome.result
        assert time.monotonic() - started < 3
        # The connection stays usable.
        assert (await executor.run("add", "t2", {"a": 1, "b": 2})).result == "3"
    finally:
        await tools.stop()


# ---------------------------------------------------------------------------------------------
# A server that is down
# ---------------------------------------------------------------------------------------------


async def test_a_server_down_at_start_comes_back_on_refresh(down: McpTestServer, beta: McpTestServer) -> None:
    # A long backoff, so only refresh() can bring it back during the test.
    executor, tools = await started_set([down.url, beta.url], backoff_initial=60)
    try:
        first, second = tools.status()
        assert first["connected"] is False and first["tools"] == 0
        assert "ConnectError" in first["last_error"]
        assert second["connected"] is True
        # Beta's ping stands in while alpha is down.
        assert "add" not in executor.names
        assert (await executor.run("ping", "t1", {})).result == "pong from beta"
        missing = await executor.run("add", "t2", {"a": 1, "b": 2})
        assert missing.is_error and "Unknown tool 'add'" in missing.result

        await asyncio.to_thread(down.start)
        await tools.refresh()
        first, second = tools.status()
        assert first == {"url": down.url, "connected": True, "tools": 4, "last_error": None, "skipped": []}
        assert second["skipped"] == ["ping", "calculator"]
        assert (await executor.run("add", "t3", {"a": 1, "b": 2})).result == "3"
        # The first server listed gets the shared name back.
        assert (await executor.run("ping", "t4", {})).result == "pong from alpha"
    finally:
        await tools.stop()


async def test_a_server_is_retried_with_backoff_until_it_is_back(down: McpTestServer) -> None:
    executor, tools = await started_set([down.url], backoff_initial=0.05, backoff_max=0.2)
    source = tools.sources[0]
    try:
        assert not source.connected and executor.names == ["calculator"]
        await asyncio.to_thread(down.start)
        await asyncio.wait_for(source.wait_connected(), 20)
        assert (await executor.run("add", "t1", {"a": 2, "b": 2})).result == "4"

        # It goes away: a call fails as an error result, the tools go, and it is retried.
        await asyncio.to_thread(down.stop)
        outcome = await executor.run("add", "t2", {"a": 2, "b": 2})
        assert outcome.is_error
        await tools.refresh()
        assert not source.connected and not source.tools()
        assert executor.names == ["calculator"]
        assert source.status()["last_error"]
        not_connected = await executor.run("add", "t3", {"a": 1, "b": 1})
        assert not_connected.is_error and "Unknown tool" in not_connected.result
        with pytest.raises(McpUnavailable, match="not connected"):
            await source.call_tool("add", {"a": 1, "b": 1})

        await asyncio.to_thread(down.start)
        await asyncio.wait_for(source.wait_connected(), 20)
        assert (await executor.run("add", "t4", {"a": 3, "b": 3})).result == "6"
    finally:
        await tools.stop()


class _RecordingSource(McpToolSource):
    """Records the pauses between connection attempts instead of sleeping."""

    def __init__(self, url: str, attempts: int, **options: Any) -> None:
        super().__init__(url, **options)
        self.pauses: list[float] = []
        self.attempts = attempts
        self.done = asyncio.Event()

    async def _pause(self, seconds: float) -> bool:
        self.pauses.append(seconds)
        if len(self.pauses) >= self.attempts:
            self.done.set()
            await self._wake.wait()  # park here until stop() wakes us, as the real pause does
            return True
        return False


async def test_backoff_doubles_up_to_its_cap(down: McpTestServer) -> None:
    source = _RecordingSource(down.url, attempts=6, backoff_initial=0.5, backoff_max=3)
    await source.start()
    try:
        await asyncio.wait_for(source.done.wait(), 20)
        assert source.pauses == [0.5, 1.0, 2.0, 3.0, 3.0, 3.0]
        assert not source.connected
    finally:
        await source.stop()


async def test_stop_ends_the_background_task(alpha: McpTestServer) -> None:
    executor, tools = await started_set([alpha.url])
    source = tools.sources[0]
    task = source._task
    assert task is not None and source.connected
    executor.remove_source(tools)
    await tools.stop()
    assert task.done() and not source.connected and not source.tools()
    assert executor.names == ["calculator"]
    with pytest.raises(RuntimeError, match="not running"):
        await source.refresh()


# ---------------------------------------------------------------------------------------------
# The executor's changing tool set
# ---------------------------------------------------------------------------------------------


class _ListSource:
    """A tool source whose tools a test sets by hand."""

    def __init__(self) -> None:
        self.offered: list[Tool] = []

    def tools(self) -> Sequence[Tool]:
        return self.offered


def _tool(name: str, answer: str) -> FunctionTool:
    return FunctionTool(name, f"the {name} tool", {"type": "object", "properties": {}}, lambda _: answer)


async def test_the_executor_follows_a_changing_source() -> None:
    source = _ListSource()
    executor = ToolExecutor([_tool("echo", "registered")])
    executor.add_source(source)
    assert executor.names == ["echo"]
    source.offered = [_tool("echo", "from the source"), _tool("extra", "extra"), _tool("bad name!", "x")]
    # Registered tools win a clash and invalid names are not offered.
    assert executor.names == ["echo", "extra"]
    assert (await executor.run("echo", "t1", {})).result == "registered"
    assert (await executor.run("extra", "t2", {})).result == "extra"
    source.offered = []
    gone = await executor.run("extra", "t3", {})
    assert gone.is_error and "Unknown tool 'extra'" in gone.result
    executor.remove_source(source)
    assert executor.sources == ()


def test_offered_names_fit_the_model_interface() -> None:
    assert offered_name("math.negate") == "math_negate"
    assert offered_name("a/b c") == "a_b_c"
    assert offered_name("x" * 100) == "x" * 64


# ---------------------------------------------------------------------------------------------
# End to end: the service over HTTP
# ---------------------------------------------------------------------------------------------


def _tool_results(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [event for event in events if event["type"] == "tool_result"]


async def test_the_model_calls_an_mcp_tool_over_http(
    make_client: ClientFactory, alpha: McpTestServer
) -> None:
    client = await make_client(mcp_servers=[alpha.url], tool_timeout_s=10)
    health = await (await client.get("/healthz")).json()
    assert health["mcp"] == [
        {"url": alpha.url, "connected": True, "tools": 4, "last_error": None, "skipped": []}
    ]

    events = await stream_agent(client, "Ping the server. [emu:tool=ping]")
    (result,) = _tool_results(events)
    assert result["tool"] == "ping" and result["result"] == "pong from alpha"
    assert not result.get("is_error")
    assert events[-1]["type"] == "done"

    events = await stream_agent(client, "Try the failing tool. [emu:tool=fail]")
    (result,) = _tool_results(events)
    assert result["is_error"] is True and "the failing tool failed" in result["result"]
    assert events[-1]["type"] == "done"


@pytest.mark.slow
async def test_the_service_starts_with_a_server_down_and_picks_it_up(
    make_client: ClientFactory, down: McpTestServer
) -> None:
    client = await make_client(mcp_servers=[down.url], tool_timeout_s=10)
    response = await client.get("/healthz")
    assert response.status == 200
    (entry,) = (await response.json())["mcp"]
    assert entry["url"] == down.url and entry["connected"] is False and entry["tools"] == 0
    assert entry["last_error"]

    events = await stream_agent(client, "[emu:tool=ping]")
    (result,) = _tool_results(events)
    assert result["is_error"] is True and "Unknown tool 'ping'" in result["result"]

    await asyncio.to_thread(down.start)
    tools = find_mcp_tools(services_of(client).tools)
    assert tools is not None
    await tools.refresh()
    (entry,) = (await (await client.get("/healthz")).json())["mcp"]
    assert entry["connected"] is True and entry["tools"] == 4 and entry["last_error"] is None

    events = await stream_agent(client, "[emu:tool=ping]")
    (result,) = _tool_results(events)
    assert result["result"] == "pong from alpha" and not result.get("is_error")


async def test_healthz_without_mcp_servers(make_client: ClientFactory) -> None:
    client = await make_client()
    assert (await (await client.get("/healthz")).json())["mcp"] == []


async def test_each_agent_gets_its_own_mcp_servers_and_a_reload_connects_new_ones(
    make_client: ClientFactory, alpha: McpTestServer, beta: McpTestServer, tmp_path: Any
) -> None:
    path = tmp_path / "agents.toml"
    first = f'[agents.pinger]\nmcp_servers = ["{alpha.url}"]\n[agents.plain]\nmcp_servers = []\n'
    path.write_text(first)
    client = await make_client(agents_file=str(path), tool_timeout_s=10)
    services = services_of(client)

    events = await stream_agent(client, "[emu:tool=ping]", agent="pinger")
    (result,) = _tool_results(events)
    assert result["result"] == "pong from alpha"
    events = await stream_agent(client, "[emu:tool=ping]", agent="plain")  # not its server's tool
    (result,) = _tool_results(events)
    assert result["is_error"] is True and "Unknown tool 'ping'" in result["result"]

    # A reload that adds an agent on a server nobody used yet connects it, once.
    path.write_text(first + f'[agents.multiplier]\nmcp_servers = ["{beta.url}"]\n')
    assert await services.catalog.reload()
    events = await stream_agent(
        client, '[emu:tool=multiply] [emu:tool_input={"a": 6, "b": 7}]', agent="multiplier"
    )
    (result,) = _tool_results(events)
    assert result["result"] == "42" and not result.get("is_error")
    health = await (await client.get("/healthz")).json()
    assert [entry["url"] for entry in health["mcp"]] == [alpha.url, beta.url]
