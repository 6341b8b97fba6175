"""The MCP face's protocol side: the tools, built on the official SDK's low-level ``Server``.

The SDK handles the protocol (``initialize`` negotiation, request validation, ``ping``,
method-not-found, result shapes); this module gives it six tools over the same core the HTTP
and WebSocket transports use, and the ``logging/setLevel`` handler that turns on event
notifications. The HTTP side (:mod:`service.transports.mcp`) hands every request's aiohttp
``Request`` to the handlers as ``ctx.request``; from it they take the context, the caller's
owner id and the MCP session.

Tools (seed 004):

- ``session_create``: a new idle session of the agent named (``agent``; the default one without).
- ``session_message``: start a query, in a new session (of ``agent``) or an existing one
  (``multitask_strategy`` says what it does while one runs); answers at once with
  the session id and the index to poll from (``wait: true`` waits for the answer instead).
- ``session_events``: the events after ``since_index`` and the next index, as
  ``GET /sessions/{id}/events/poll``; unaffected by notifications.
- ``session_status``: status, last event id, usage.
- ``session_cancel``: stop the running query.
- ``session_approve``: approve or deny a tool call that waits for a person.
"""

from __future__ import annotations

import contextlib
import json
import warnings
from collections.abc import Awaitable, Callable, Mapping
from typing import Annotated, Any, Protocol

import mcp_types as types
from aiohttp import web
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError
from opentelemetry.trace import Tracer
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from service import jsonsafe
from service.core.agents import check_bound, chosen
from service.core.events import RunDone, RunError, TextDelta, is_terminal
from service.core.sessions import ACTIVE, RUNNING, Session
from service.core.traces import NO_TRACER
from service.errors import (
    AgentMismatch,
    ApprovalError,
    DatabaseUnavailable,
    Overloaded,
    QuotaExceeded,
    RunInProgress,
    SessionLimitReached,
    SessionNotFound,
    StoreUnavailable,
    UnknownAgent,
)
from service.transports.edge import approvals
from service.transports.edge.auth import owner_of
from service.transports.edge.context import Context, context_of
from service.transports.edge.inputs import AgentName, ApprovalAnswer, MaxTurns, Strategy, Text
from service.transports.edge.quotas import quota_fields
from service.transports.mcp.tracing import TracingMiddleware
from service.transports.stream import session as dialect
from service.transports.stream.follow import ThroughRun
from service.transports.stream.reading import IndexAhead, poll


class Follows(Protocol):
    """What the tools need of an MCP session (``McpSession`` in the HTTP module): the agent
    sessions it follows on its stream, and its log level."""

    id: str
    followed: Mapping[str, int]

    def follow(self, session: Session, after: int) -> None:
        """Send that session's events after ``after`` on the stream."""

    def set_level(self, level: str) -> None:
        """Send events at ``level`` and above."""


SERVER_NAME = "agentstream"
INSTRUCTIONS = (
    "Agent sessions. Call session_message to ask a question (it returns at once with a session id; "
    "pass that id again to continue the conversation). Follow the answer with session_events "
    "(pass next_index back as since_index), or set a logging level and receive each event as a "
    "log notification. Where the service runs several agents, session_create (or session_message "
    "without a session id) takes the agent's name; a session keeps its agent."
)

SessionId = Annotated[str, Field(min_length=1, max_length=128)]


class _Arguments(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MessageArgs(_Arguments):
    """``session_message``'s arguments."""

    session_id: SessionId | None = Field(None, description="Continue this session; omit to start a new one.")
    agent: AgentName | None = Field(
        None,
        description=(
            "The agent of the new session (one of GET /agents; the default one when omitted). With "
            "a session_id it must be that session's agent: a session keeps its agent."
        ),
    )
    content: Text = Field(description="The user's message.")
    max_turns: MaxTurns = Field(None, description="Model turns allowed for this query.")
    wait: bool = Field(
        False,
        description="Answer only when the query has ended, with its final text (default: at once).",
    )
    multitask_strategy: Strategy = Field(
        "reject",
        description=(
            "While a query runs: reject (an error), enqueue (start after it), interrupt (cancel it), "
            "rollback (cancel it and cut its message away)."
        ),
    )


class CreateArgs(_Arguments):
    """``session_create``'s arguments."""

    agent: AgentName | None = Field(
        None, description="The session's agent (one of GET /agents); the default one when omitted."
    )


class EventsArgs(_Arguments):
    """``session_events``'s arguments."""

    session_id: SessionId
    since_index: int = Field(0, ge=0, description="The last event id seen; 0 for the start.")
    limit: int | None = Field(None, ge=1, description="At most this many events.")


class SessionArgs(_Arguments):
    """Arguments of the tools that take only a session id."""

    session_id: SessionId


class ApproveArgs(_Arguments, ApprovalAnswer):
    """``session_approve``'s arguments."""

    model_config = ConfigDict(extra="forbid")

    session_id: SessionId
    approval_id: Annotated[str, Field(min_length=1, max_length=128)]


class ToolFailed(Exception):
    """A tool's own failure: reported to the model as a result with ``isError``."""


def _schema(model: type[BaseModel]) -> dict[str, Any]:
    schema = model.model_json_schema()
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    return schema


TOOLS: dict[str, tuple[type[BaseModel], str]] = {
    "session_create": (
        CreateArgs,
        "Make a new, idle agent session of the agent named (the service's default agent when agent "
        "is omitted); pass its session_id to session_message. A session keeps its agent for life.",
    ),
    "session_message": (
        MessageArgs,
        "Send a message to an agent session (a new one unless session_id is given). The query runs "
        "in the background: the reply names the session and the index to poll from. Its events "
        "arrive as log notifications once a logging level is set.",
    ),
    "session_events": (
        EventsArgs,
        "The session's events after since_index, and next_index to pass as since_index next time.",
    ),
    "session_status": (SessionArgs, "A session's status (idle or running), last event id and token usage."),
    "session_cancel": (SessionArgs, "Stop the query running in a session."),
    "session_approve": (
        ApproveArgs,
        "Approve or deny a tool call that waits for a person (a tool_approval_request event): "
        "approved true or false, a reason, and optionally an edited input for the tool.",
    ),
}


def tool_list() -> list[types.Tool]:
    """The tools, with JSON schemas made from their argument models."""
    return [
        types.Tool(name=name, description=description, input_schema=_schema(model))
        for name, (model, description) in TOOLS.items()
    ]


def _result(payload: dict[str, Any], *, error: bool = False) -> types.CallToolResult:
    text = jsonsafe.dumps(payload)
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structured_content=json.loads(text),
        is_error=error,
    )


def _failure(message: str, **fields: Any) -> types.CallToolResult:
    return _result({"error": message, **fields}, error=True)


_DOMAIN_MESSAGES: dict[type[Exception], str] = {
    SessionNotFound: "Session not found",
    RunInProgress: "a query is already running in this session; wait for it or cancel it",
    Overloaded: "the service is at its limit of concurrent queries; try again shortly",
    SessionLimitReached: "the service holds as many sessions as it may; try again later",
    DatabaseUnavailable: "the session database is unavailable; try again shortly",
    StoreUnavailable: "session storage is unavailable; try again shortly",
}


class Tools:
    """The tools on one request's context, owner and MCP session."""

    def __init__(self, request: web.Request, mcp_session: Follows) -> None:
        self.request = request
        self.context: Context = context_of(request)
        self.owner = owner_of(request)
        self.mcp_session = mcp_session

    async def _session(self, session_id: str) -> Session:
        return await self.context.sessions.get_owned(session_id, self.owner)

    async def session_message(self, args: MessageArgs, progress: Progress) -> dict[str, Any]:
        context = self.context
        if len(args.content) > context.settings.max_message_chars:
            raise ToolFailed(f"content is longer than {context.settings.max_message_chars} characters")
        if args.session_id is None:
            session = await context.sessions.create(
                owner=self.owner, agent=chosen(context.agents, args.agent)
            )
        else:
            session = await self._session(args.session_id)
            check_bound(context.agents, session.agent, args.agent)
        after = await session.log.last_id()
        # Followed before the query starts, so the stream misses none of its events.
        self.mcp_session.follow(session, after)
        sent = await context.multitask.send(
            session, args.content, args.max_turns, None, args.multitask_strategy
        )
        if sent.run is None and not args.wait:
            return {"session_id": session.id, "status": "queued", "queued": sent.queued, "after_id": after}
        run = sent.run or await sent.started
        after = run.first_id - 1
        reply: dict[str, Any] = {
            "session_id": session.id,
            "status": RUNNING,
            "run_id": run.id,
            "after_id": after,
            "next_index": after,
        }
        if args.wait:
            reply.update(await _await_answer(session, after, progress))
            reply["status"] = session.status
        return reply

    async def session_create(self, args: CreateArgs) -> dict[str, Any]:
        context = self.context
        session = await context.sessions.create(owner=self.owner, agent=chosen(context.agents, args.agent))
        return {"session_id": session.id, "agent": session.agent, "status": session.status}

    async def session_events(self, args: EventsArgs) -> dict[str, Any]:
        session = await self._session(args.session_id)
        try:
            body = await poll(self.context, session, args.since_index, args.limit)
        except IndexAhead as exc:
            raise ToolFailed(str(exc)) from None
        self.context.metrics.delivered("mcp").inc(len(body["events"]))
        return {"session_id": session.id, **body}

    async def session_status(self, args: SessionArgs) -> dict[str, Any]:
        session = await self._session(args.session_id)
        log = session.log
        return {
            "session_id": session.id,
            "status": session.status,
            "last_event_id": await log.last_id(),
            "oldest_id": await log.first_id(),
            "usage": dialect.usage_dict(session.usage),
            "messages": len(session.messages),
            "running_query": session.run_message if session.status in ACTIVE else None,
            "followed": session.id in self.mcp_session.followed,
            "pending_approvals": dialect.pending_approvals(session),
        }

    async def session_approve(self, args: ApproveArgs) -> dict[str, Any]:
        session = await self._session(args.session_id)
        try:
            reply = await approvals.answer(self.context, session, args.approval_id, args, "mcp")
        except ApprovalError as exc:
            raise ToolFailed(str(exc)) from None
        return {"session_id": session.id, **reply}

    async def session_cancel(self, args: SessionArgs) -> dict[str, Any]:
        session = await self._session(args.session_id)
        cancelled = await self.context.runs.cancel(session.id)
        return {"session_id": session.id, "cancelled": cancelled, "status": session.status}


Progress = Callable[[float, str | None], Awaitable[None]]


async def _await_answer(session: Session, after: int, progress: Progress) -> dict[str, Any]:
    """Follow the query to its end; its text, and how it ended. Progress counts its events."""
    text: list[str] = []
    seen = 0
    reader = ThroughRun(session.log, after)
    async with contextlib.aclosing(reader.batches()) as batches:
        async for batch in batches:
            seen += len(batch)
            text.extend(entry.event.text for entry in batch if isinstance(entry.event, TextDelta))
            event = batch[-1].event
            if is_terminal(event):
                ended: dict[str, Any] = {"next_index": batch[-1].id, "response": "".join(text)}
                if isinstance(event, RunDone):
                    if reader.skipped:  # part of the text is gone: the run's final answer instead
                        ended["response"] = event.output
                    ended["done"] = dialect.session(event)
                elif isinstance(event, RunError):
                    ended["error"] = dialect.session(event)
                return ended
            await progress(float(seen), f"{seen} events")
    ending = reader.ending
    if ending is not None and ending.reason == "store_unavailable":
        raise ToolFailed(f"{ending.message}; call session_events later to read the answer")
    raise ToolFailed("the session ended before the query finished")


async def call_tool(
    tools: Tools, name: str, arguments: dict[str, Any], progress: Progress
) -> types.CallToolResult:
    """Run one tool; its own failures become ``isError`` results, unknown names a protocol error."""
    entry = TOOLS.get(name)
    if entry is None:
        raise MCPError(code=types.INVALID_PARAMS, message=f"Unknown tool: {name}")
    model = entry[0]
    try:
        args = model.model_validate(arguments)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in error['loc']) or 'arguments'}: {error['msg']}"
            for error in exc.errors()
        )
        return _failure(f"invalid arguments for {name}: {problems}")
    try:
        if isinstance(args, MessageArgs):
            return _result(await tools.session_message(args, progress))
        if isinstance(args, CreateArgs):
            return _result(await tools.session_create(args))
        if isinstance(args, EventsArgs):
            return _result(await tools.session_events(args))
        if isinstance(args, ApproveArgs):
            return _result(await tools.session_approve(args))
        if name == "session_status":
            return _result(await tools.session_status(args))  # type: ignore[arg-type]
        return _result(await tools.session_cancel(args))  # type: ignore[arg-type]
    except ToolFailed as exc:
        return _failure(str(exc))
    except QuotaExceeded as exc:
        return _failure(exc.message, **quota_fields(exc))
    except UnknownAgent as exc:
        return _failure(str(exc), code=exc.code, agents=exc.known)
    except AgentMismatch as exc:
        return _failure(str(exc), code=exc.code, agent=exc.bound)
    except tuple(_DOMAIN_MESSAGES) as exc:
        code = type(exc).__name__
        message = next(text for kind, text in _DOMAIN_MESSAGES.items() if isinstance(exc, kind))
        return _failure(message, code=code)


def build_server(
    session_of: Callable[[web.Request], Follows],
    exchange_of: Callable[[web.Request], Any],
    tracer: Tracer = NO_TRACER,
) -> Server[Any]:
    """The SDK server: tools and logging, each handler reaching the core through ``ctx.request``;
    a span per message on ``tracer`` (:mod:`service.transports.mcp.tracing`) when traces are on."""

    async def list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tool_list())

    async def on_call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        request: web.Request = ctx.request
        exchange = exchange_of(request)

        async def progress(done: float, message: str | None) -> None:
            await exchange.progress(done, None, message)  # a no-op without a progress token

        tools = Tools(request, session_of(request))
        return await call_tool(tools, params.name, params.arguments or {}, progress)

    async def set_level(
        ctx: ServerRequestContext[Any, Any], params: types.SetLevelRequestParams
    ) -> types.EmptyResult:
        session_of(ctx.request).set_level(params.level)
        return types.EmptyResult()

    with warnings.catch_warnings():
        # The SDK flags logging as deprecated for its 2026 protocol revision; this face speaks the
        # handshake revisions, where logging/setLevel is how a client asks for notifications.
        warnings.simplefilter("ignore", MCPDeprecationWarning)
        server = Server(
            SERVER_NAME,
            version=_version(),
            instructions=INSTRUCTIONS,
            on_list_tools=list_tools,
            on_call_tool=on_call_tool,
            on_set_logging_level=set_level,
        )

    def session_id_of(request: web.Request | None) -> str | None:
        return None if request is None else session_of(request).id

    # In place of the SDK's span middleware, which traces on the process's global tracer.
    server.middleware = [] if tracer is NO_TRACER else [TracingMiddleware(tracer, session_id_of)]
    return server


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("agentstream")
    except PackageNotFoundError:
        return "0"
