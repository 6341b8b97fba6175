"""Tools the model may call and the executor that runs them.

The agent loop hands every ``tool_use`` block to :meth:`ToolExecutor.run` (or a batch of them to
:meth:`ToolExecutor.run_all`). The executor never raises for a tool's failure: unknown tools, bad
input, exceptions, timeouts and oversized results all become a :class:`ToolOutcome` with
``is_error`` set, whose text is what the model is told. Only cancellation propagates, so a
cancelled query stops its tools.

Besides the tools registered once, an executor can hold :class:`ToolSource` objects whose tools
may change while the service runs (MCP servers coming and going). Every lookup takes a fresh
snapshot, so a run in flight keeps working: a tool that vanished between two turns is simply an
unknown tool for the next call. Registered tools win every name clash; among sources, the first
added wins, and a source's tool with a taken or invalid name is not offered.

Every result, of every tool (built-in, AWS, MCP), is cut past ``max_result_chars`` and marked
with how much was left out, so neither the model nor the clients receive an oversized result.

The built-in tools are in :mod:`service.agent.calculator` (:func:`~service.agent.calculator.builtin_tools`).
"""

from __future__ import annotations

import abc
import asyncio
import contextvars
import copy
import inspect
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from service.agent.arithmetic import Number, format_number
from service.errors import describe_exception

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_MAX_RESULT_CHARS",
    "FunctionTool",
    "Tool",
    "ToolExecutor",
    "ToolOutcome",
    "ToolSource",
]

# Bedrock (and Anthropic) reject other tool names, so refuse them when registering rather than
# on the first request to the model.
_TOOL_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


# --------------------------------------------------------------------------------------------
# Tools
# --------------------------------------------------------------------------------------------


class Tool(abc.ABC):
    """A tool the model may call.

    Optional hooks the :class:`ToolExecutor` calls when a tool has them: ``async start()`` (get
    ready when the service starts) and ``async aclose()`` (release worker processes or
    connections when it stops).
    """

    name: str
    description: str
    input_schema: dict[str, Any]  # JSON schema of the input object

    @abc.abstractmethod
    async def call(self, input: dict[str, Any]) -> str:
        """Run the tool on ``input``; raise any exception to report a failure."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {getattr(self, 'name', '?')!r}>"


@runtime_checkable
class ToolSource(Protocol):
    """A set of tools that may change at run time; the executor asks for it on every lookup."""

    def tools(self) -> Sequence[Tool]:
        """The tools offered right now (cheap: called once per model turn and per tool call)."""
        ...


ToolFunc = Callable[[dict[str, Any]], str | Number | Awaitable[str | Number]]


class FunctionTool(Tool):
    """A tool made from a plain sync or async callable taking the input dict."""

    def __init__(
        self,
        name: str,
        description: str,
        input_schema: dict[str, Any],
        func: ToolFunc,
    ) -> None:
        if not callable(func):
            raise TypeError(f"func must be callable, got {type(func).__name__}")
        self.name = name
        self.description = description
        self.input_schema = input_schema
        self.func = func
        self._is_async = inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(
            getattr(func, "__call__", None)  # noqa: B004 - an object whose __call__ is async
        )

    async def call(self, input: dict[str, Any]) -> str:
        """Call the function (in a worker thread when it is sync) and format its result."""
        if self._is_async:
            result = await self.func(input)  # type: ignore[misc]
        else:
            # A blocking function must not stall the event loop that streams to clients.
            result = await asyncio.to_thread(self.func, input)
            # A sync callable may still hand back a coroutine (a lambda around an async def).
            if inspect.isawaitable(result):
                result = await result
        return _result_text(result)


def _result_text(result: Any) -> str:
    """The text of a function's result: strings as they are, numbers like the calculator's."""
    if isinstance(result, str):
        return result
    if isinstance(result, (int, float)) and not isinstance(result, bool):
        return format_number(result)
    raise TypeError(f"tool returned {type(result).__name__}, expected a string or a number")


# --------------------------------------------------------------------------------------------
# Executor
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolOutcome:
    """The result of one tool call, successful or not, as the model will be told it."""

    tool: str
    tool_use_id: str
    input: Any
    result: str
    is_error: bool
    duration_ms: float
    # Why a failed call failed, for its span's error.type: timeout, unknown_tool, invalid_input
    # or tool_error (empty: not known, as for a call the service did not run).
    error_type: str = ""


_JSON_TYPE_NAMES: dict[type, str] = {
    list: "an array",
    tuple: "an array",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "a boolean",
    type(None): "null",
}


# AGENT_TOOL_MAX_OUTPUT_CHARS: longer results (and error messages) are cut to this many characters.
DEFAULT_MAX_RESULT_CHARS = 20_000


class ToolExecutor:
    """Runs the model's tool calls with a timeout, turning every failure into an error outcome.

    Every result is cut to ``max_result_chars`` characters (see :meth:`_truncate`), whichever
    tool produced it. The executor owns its registered tools: :meth:`aclose` closes them.
    """

    def __init__(
        self,
        tools: Iterable[Tool] = (),
        *,
        timeout: float = 30.0,
        max_result_chars: int = DEFAULT_MAX_RESULT_CHARS,
    ) -> None:
        if not timeout > 0:
            raise ValueError(f"timeout must be positive, got {timeout!r}")
        if max_result_chars < 1:
            raise ValueError(f"max_result_chars must be positive, got {max_result_chars!r}")
        self.timeout = float(timeout)
        self.max_result_chars = max_result_chars
        self._tools: dict[str, Tool] = {}
        self._sources: list[ToolSource] = []
        # A view's filter (see view); None offers every tool.
        self._allow: Callable[[Tool], bool] | None = None
        self._owner = True
        for tool in tools:
            self.register(tool)

    def view(self, allow: Callable[[Tool], bool]) -> ToolExecutor:
        """An executor over the same tools and sources that offers, and runs, only those ``allow``
        keeps: one agent's tools among the service's. A call of another tool is an unknown
        tool's error, as if it did not exist. The view owns nothing: starting and closing the
        tools stays this executor's."""
        view = copy.copy(self)
        view._allow, view._owner = allow, False
        return view

    def register(self, tool: Tool) -> None:
        """Add a tool; ValueError if its name is taken or not a valid tool name."""
        name = getattr(tool, "name", None)
        if not isinstance(name, str) or not _TOOL_NAME_RE.match(name):
            raise ValueError(f"invalid tool name {name!r}: use 1-64 letters, digits, '_' or '-'")
        if name in self._tools:
            raise ValueError(f"a tool named {name!r} is already registered")
        self._tools[name] = tool

    def add_source(self, source: ToolSource) -> None:
        """Offer a source's tools (as they are at each lookup) after the registered ones."""
        if source not in self._sources:
            self._sources.append(source)

    def remove_source(self, source: ToolSource) -> None:
        """Stop offering a source's tools; calls already running finish."""
        if source in self._sources:
            self._sources.remove(source)

    async def start(self) -> None:
        """Let the registered tools get ready (the calculator starts its first worker process)."""
        if not self._owner:
            return
        for tool in self._tools.values():
            start = getattr(tool, "start", None)
            if callable(start):
                try:
                    await start()
                except Exception:  # noqa: BLE001 - a tool that cannot warm up starts on first use
                    logger.exception("tool %r failed to start", tool)

    async def aclose(self) -> None:
        """Close the registered tools (the calculator's worker processes); sources are their owners'."""
        if not self._owner:
            return
        for tool in self._tools.values():
            close = getattr(tool, "aclose", None)
            if callable(close):
                try:
                    await close()
                except Exception:  # noqa: BLE001 - one tool's failure must not keep the others open
                    logger.exception("tool %r failed to close", tool)

    @property
    def sources(self) -> tuple[ToolSource, ...]:
        """The dynamic tool sources, in the order they were added."""
        return tuple(self._sources)

    def current(self) -> dict[str, Tool]:
        """A snapshot of every tool offered now, by name: registered ones, then the sources'."""
        tools = dict(self._tools)
        for source in self._sources:
            try:
                offered = source.tools()
            except Exception:  # noqa: BLE001 - a broken source must not break every run
                logger.exception("tool source %r failed to list its tools", source)
                continue
            for tool in offered:
                name = getattr(tool, "name", None)
                # A source cannot raise at registration time, so its bad or clashing names are
                # dropped here; the source itself reports which of its tools it could not offer.
                if isinstance(name, str) and _TOOL_NAME_RE.match(name) and name not in tools:
                    tools[name] = tool
        allow = self._allow
        if allow is not None:
            return {name: tool for name, tool in tools.items() if allow(tool)}
        return tools

    @property
    def names(self) -> list[str]:
        """The offered tools' names: registration order, then the sources' tools."""
        return list(self.current())

    def specs(self) -> list[dict[str, Any]]:
        """Provider-neutral tool descriptions: name, description and input schema."""
        return [
            {"name": t.name, "description": t.description, "input_schema": t.input_schema}
            for t in self.current().values()
        ]

    def bedrock_tool_config(self) -> dict[str, Any] | None:
        """The Bedrock Converse ``toolConfig``, or None when there are no tools."""
        specs = self.specs()
        if not specs:
            # Converse rejects an empty tool list, so the caller must leave toolConfig out.
            return None
        return {
            "tools": [
                {
                    "toolSpec": {
                        "name": spec["name"],
                        "description": spec["description"],
                        "inputSchema": {"json": spec["input_schema"]},
                    }
                }
                for spec in specs
            ]
        }

    async def run(self, tool: str, tool_use_id: str, input: Any) -> ToolOutcome:
        """Run one tool call; never raises except asyncio.CancelledError."""
        started = time.perf_counter()

        def outcome(result: str, is_error: bool, error_type: str = "tool_error") -> ToolOutcome:
            return ToolOutcome(
                tool=tool,
                tool_use_id=tool_use_id,
                input=input,
                result=self._truncate(result),
                is_error=is_error,
                duration_ms=(time.perf_counter() - started) * 1000.0,
                error_type=error_type if is_error else "",
            )

        offered = self.current()
        impl = offered.get(tool)
        if impl is None:
            available = ", ".join(offered) or "(none)"
            return outcome(f"Unknown tool '{tool}'. Available tools: {available}", True, "unknown_tool")
        if not isinstance(input, dict):
            got = _JSON_TYPE_NAMES.get(type(input), type(input).__name__)
            return outcome(f"Tool '{tool}' input must be a JSON object, got {got}", True, "invalid_input")

        task = asyncio.current_task()
        # Compare against the count on entry, not zero: a caller that once swallowed a
        # cancellation leaves the count raised for good, and that must not fail every later call.
        cancelling_before = task.cancelling() if task is not None else 0
        deadline = asyncio.timeout(self.timeout)
        try:
            async with deadline:
                result = await impl.call(input)
            if not isinstance(result, str):
                raise TypeError(f"returned {type(result).__name__}, expected a string")
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure is reported to the model
            self._reraise_if_cancelled(task, cancelling_before)
            if deadline.expired():
                # The tool turned our cancellation into another exception: still a timeout.
                return outcome(self._timeout_message(tool), True, "timeout")
            logger.info("tool %r (%s) failed", tool, tool_use_id, exc_info=True)
            return outcome(f"Tool '{tool}' failed: {describe_exception(exc)}", True)
        self._reraise_if_cancelled(task, cancelling_before)
        return outcome(result, False)

    async def run_all(
        self,
        calls: Sequence[tuple[str, str, Any]],
        contexts: Mapping[str, contextvars.Context | None] | None = None,
    ) -> AsyncIterator[ToolOutcome]:
        """Run all calls concurrently and yield each outcome as it completes; a call whose
        ``tool_use_id`` ``contexts`` names runs in that context (its span current).

        If the consumer stops early (close the iterator, e.g. with ``contextlib.aclosing``) or
        is cancelled, the calls still running are cancelled and awaited before it returns.
        """
        contexts = contexts or {}
        tasks = [asyncio.create_task(self.run(*call), context=contexts.get(call[1])) for call in calls]
        pending: set[asyncio.Task[ToolOutcome]] = set(tasks)
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                # Several may finish in the same loop iteration; keep the request order for them.
                for task in sorted(done, key=tasks.index):
                    yield task.result()
        finally:
            for task in pending:
                task.cancel()
            if pending:
                # Tools get to run their cleanup before the caller moves on.
                await asyncio.gather(*pending, return_exceptions=True)

    def _timeout_message(self, tool: str) -> str:
        return f"Tool '{tool}' timed out after {self.timeout:g} s"

    def _truncate(self, text: str) -> str:
        """Cut a result past ``max_result_chars`` and say how much was left out."""
        if len(text) <= self.max_result_chars:
            return text
        omitted = len(text) - self.max_result_chars
        return text[: self.max_result_chars] + f"\n[truncated: {omitted} of {len(text)} characters omitted]"

    @staticmethod
    def _reraise_if_cancelled(task: asyncio.Task[Any] | None, cancelling_before: int) -> None:
        # A tool that swallows our caller's cancellation (or turns it into another error) must
        # not keep the query running: cancellation always wins over an outcome.
        if task is not None and task.cancelling() > cancelling_before:
            raise asyncio.CancelledError()
