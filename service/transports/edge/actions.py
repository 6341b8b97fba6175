"""A chat UI's actions on a session, the same from every face: send (with a
``multitask_strategy``), edit, regenerate, declare browser-side tools, and answer their calls.

- An edit names an earlier message of the user's: the conversation is cut back to before it and
  the edited text asked; a regenerate names an answer (or takes the last): cut back to before it
  and its question answered again. The cut is the run's first step, logged as
  ``conversation_rewound`` (see :mod:`service.core.conversation`).
- Tools a client declares are offered beside the service's own; one whose name is a service
  tool's is refused (a 422), since the model could not tell them apart, and so is any to a
  session whose agent is defined with ``client_tools = false`` (``client_tools_refused``).
- A client tool's result is taken once, whichever tab or instance sends it
  (:meth:`~service.core.sessions.SessionStore.answer_approval`); one for a call the session does
  not wait on is a 404, one already answered a 409.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from service.core import conversation, traces
from service.core.agents import check_client_tools
from service.core.events import ClientToolResult, client_tool_key
from service.core.multitask import Sent
from service.core.options import RunOptions
from service.core.sessions import CLOSED, EXPIRED, PENDING, Session
from service.errors import ClientToolError, ClientToolNotFound, ClientToolsInvalid, MessageNotFound
from service.transports.edge.context import Context
from service.transports.edge.inputs import ClientTool, MessageRequest, ToolResultRequest, check_length


def client_tool_specs(
    context: Context, tools: Sequence[ClientTool] | None, agent: str | None = None
) -> tuple[dict[str, Any], ...]:
    """The specs the agent offers for a client's tools; a clash with a service tool, or a name
    given twice, is a :class:`ClientToolsInvalid` (422), and so are any tools at all for an
    ``agent`` that takes none (:class:`~service.errors.ClientToolsRefused`)."""
    if agent is not None:
        check_client_tools(context.agents, agent, len(tools or ()))
    specs: dict[str, dict[str, Any]] = {}
    for tool in tools or ():
        if tool.name in specs:
            raise ClientToolsInvalid(f"the client tool {tool.name!r} is declared twice")
        if context.tool_schema(tool.name) is not None:
            raise ClientToolsInvalid(
                f"the client tool {tool.name!r} has the name of one of the service's own tools"
            )
        specs[tool.name] = {
            "name": tool.name,
            "description": tool.description,
            "input_schema": tool.input_schema,
        }
    return tuple(specs.values())


def last_answer(session: Session) -> str:
    """The id of the session's last answer; :class:`MessageNotFound` when it has none."""
    messages = session.messages
    for index in range(len(messages) - 1, 0, -1):
        if conversation.answer_starts(messages, index):
            return conversation.message_id(messages, index)
    raise MessageNotFound("this session holds no answer to regenerate")


def options_for(
    context: Context,
    session: Session,
    *,
    message_id: str | None = None,
    edit: str | None = None,
    regenerate: str | bool | None = None,
    tools: Sequence[ClientTool] | None = None,
    base: RunOptions | None = None,
) -> RunOptions:
    """The run options of a message: its id, the rewind an edit or a regenerate asks for (checked
    against the conversation now, and again once the run holds the session), and its tools."""
    options = base or RunOptions()
    fields: dict[str, Any] = {}
    if regenerate is not None:
        fields.update(rewind_to=last_answer(session) if regenerate is True else regenerate, resume=True)
    elif edit is not None:
        fields.update(rewind_to=edit, message_id=message_id or edit)
    elif message_id is not None:
        fields["message_id"] = message_id
    if tools:
        fields.update(client_tools=client_tool_specs(context, tools, session.agent), client_tools_wait=True)
    return dataclasses.replace(options, **fields) if fields else options


async def send(context: Context, session: Session, body: MessageRequest) -> Sent:
    """Send a native message (HTTP or WebSocket) as its ``multitask_strategy`` says."""
    if body.content is not None:
        check_length(context.settings, body.content, "content")
    options = options_for(
        context, session, message_id=body.id, edit=body.edit, regenerate=body.regenerate, tools=body.tools
    )
    return await context.multitask.send(
        session, body.content or "", body.max_turns, options, body.multitask_strategy
    )


def check_tool_result(session: Session, tool_call_id: str) -> None:
    """Raise why a result for ``tool_call_id`` cannot be taken now, if it cannot."""
    _settled(session.approvals.get(client_tool_key(tool_call_id)), tool_call_id)


def _settled(state: str | None, tool_call_id: str) -> None:
    if state is None or state == "":
        raise ClientToolNotFound(f"no client tool call {tool_call_id!r} in this session")
    if state == PENDING:
        return
    if state == CLOSED:
        raise ClientToolError(f"the call {tool_call_id!r} no longer waits: its query ended first")
    if state == EXPIRED:
        raise ClientToolError(
            f"the call {tool_call_id!r} timed out before its result came: it has an error result"
        )
    raise ClientToolError(f"the call {tool_call_id!r} has its result already")


async def answer_tool_result(
    context: Context, session: Session, tool_call_id: str, body: ToolResultRequest, by: str
) -> dict[str, Any]:
    """Take a client tool's result (see the module docstring)."""
    key = client_tool_key(tool_call_id)
    state = session.approvals.get(key)
    if state is None:
        _settled(None, tool_call_id)
    result = ClientToolResult(tool_use_id=tool_call_id, output=body.output, error=body.error, by=by)
    request = session.approval_requests.get(key)
    with traces.continued(
        context.tracer,
        request.trace if request is not None else "",
        f"client_tool_result {request.tool if request is not None else ''}".rstrip(),
        {"gen_ai.tool.call.id": tool_call_id, "agentstream.tool.failed": body.error is not None},
    ):
        taken = await context.sessions.answer_approval(session, result)
    if taken is not None:
        _settled(taken, tool_call_id)
    return {"tool_call_id": tool_call_id, "accepted": True}


async def answer_tool_results(
    context: Context, session: Session, results: Sequence[tuple[str, ToolResultRequest]], by: str
) -> None:
    """Take the results a protocol's next request carries, all together: each is checked first,
    and results that leave some of the query's pending calls unanswered are a 409 naming them."""
    named = set()
    for tool_call_id, _ in results:
        if tool_call_id in named:
            raise ClientToolError(f"the call {tool_call_id!r} is answered twice in one request")
        named.add(tool_call_id)
        check_tool_result(session, tool_call_id)
    unanswered = [r.tool_use_id for r in session.pending_client_tools() if r.tool_use_id not in named]
    if unanswered:
        raise ClientToolError(
            "every client tool call the query waits on must be answered together; unanswered: "
            + ", ".join(unanswered)
        )
    for tool_call_id, body in results:
        await answer_tool_result(context, session, tool_call_id, body, by)
