"""What the AI SDK's ``DefaultChatTransport`` posts to ``POST /api/chat``, and what the service
reads from it: the last user message (the new query, its id the message's), the approval answers
of tool parts in state ``approval-responded``, or the results of the browser's own tools (tool
parts ``tool-<name>`` in state ``output-available`` / ``output-error``).

The ``tools`` map, ``multitask_strategy`` and ``agent`` are not the SDK's own fields: a front end
adds them with the transport's ``body`` option, and they come on every request it makes.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from service.transports.edge.inputs import (
    AgentName,
    ApprovalAnswer,
    ClientTool,
    Strategy,
    ToolResultRequest,
    query_text,
)

# A message id the service keeps as the client's own (see MessageId in the edge's inputs).
_MESSAGE_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")


class UIMessage(BaseModel):
    """One message of a chat as ``useChat`` keeps it; only the last one is read."""

    model_config = ConfigDict(extra="allow")

    id: str = ""
    role: Literal["system", "user", "assistant"]
    parts: list[dict[str, Any]]
    metadata: Any = None


class ChatTool(BaseModel):
    """A tool the browser runs itself, as a front end declares it: what the model is told."""

    model_config = ConfigDict(extra="ignore")

    description: str = ""
    inputSchema: dict[str, Any] = Field(  # noqa: N815 (the AI SDK's name)
        default_factory=lambda: {"type": "object", "properties": {}},
        description="The JSON schema of the tool's input.",
    )


# The name of a tool the browser runs (that of a client tool: see ClientTool in the edge's inputs).
ToolName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]


class ChatRequest(BaseModel):
    """Body of ``POST /api/chat``: what ``DefaultChatTransport.sendMessages`` sends, with the
    ``body`` a front end gives the transport (``tools``, ``multitask_strategy``, ``agent``)."""

    model_config = ConfigDict(extra="allow")

    id: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_-]+$")
    messages: list[UIMessage] = Field(min_length=1)
    trigger: Literal["submit-message", "regenerate-message"] = "submit-message"
    messageId: str | None = None  # noqa: N815 (the AI SDK's name)
    tools: Annotated[dict[ToolName, ChatTool], Field(max_length=64)] | None = Field(
        None, description="Tools the browser runs itself, by name (`onToolCall` answers their calls)."
    )
    multitask_strategy: Strategy = Field(
        "reject", description="What this message does while a query runs in the chat."
    )
    agent: AgentName | None = Field(
        None,
        description=(
            "The agent of a new chat (one of `GET /agents`; the default one when left out). An "
            "existing chat keeps its agent: naming another is a 409 `agent_mismatch`."
        ),
    )


def _problem(exc: ValidationError, where: str) -> ValueError:
    problem = exc.errors(include_url=False)[0]
    field = ".".join(str(item) for item in (where, *problem["loc"]) if item != "")
    return ValueError(f"{field}: {problem['msg']}")


def client_tools_of(body: ChatRequest) -> list[ClientTool]:
    """The browser's tools the body declares; ``ValueError`` names a bad one's place."""
    tools = []
    for name, tool in (body.tools or {}).items():
        fields = {"name": name, "description": tool.description, "input_schema": tool.inputSchema}
        try:
            tools.append(ClientTool.model_validate(fields))
        except ValidationError as exc:
            raise _problem(exc, f"tools.{name}") from None
    return tools


def new_message_id(messages: list[UIMessage]) -> str | None:
    """The id the new user message keeps: the last message's, where it is one the service can
    keep (else the service makes one)."""
    held = messages[-1].id
    return held if _MESSAGE_ID.fullmatch(held) else None


def query_of(messages: list[UIMessage]) -> str:
    """The new query: the text of the last message, which must be the user's.

    The server's conversation is the truth, so the rest of the history a client sends is not read
    (a ``regenerate-message`` asks the server's copy of the question again). ``ValueError`` says
    what is wrong.
    """
    last = messages[-1]
    if last.role != "user":
        raise ValueError(f"the last message must be the user's, not {last.role!r}")
    text = "".join(
        part["text"]
        for part in last.parts
        if part.get("type") == "text" and isinstance(part.get("text"), str)
    )
    return query_text(text)


def approvals_of(messages: list[UIMessage]) -> list[tuple[str, ApprovalAnswer]]:
    """The approval answers a chat sends (``addToolApprovalResponse``): ``(approval id, answer)``
    for each tool part of the last message, the assistant's, in state ``approval-responded``;
    none when the last message is the user's. ``ValueError`` names a malformed one's place."""
    last = len(messages) - 1
    if messages[last].role != "assistant":
        return []
    answers = []
    for number, part in enumerate(messages[last].parts):
        if part.get("state") != "approval-responded":
            continue
        where = f"{last}.parts.{number}.approval"
        approval = part.get("approval")
        if not (isinstance(approval, dict) and isinstance(approval.get("id"), str)):
            raise ValueError(
                f"{where}: an approval-responded tool part needs approval.id and approval.approved"
            )
        fields = {name: approval[name] for name in ("approved", "reason") if approval.get(name) is not None}
        try:
            answers.append((approval["id"], ApprovalAnswer.model_validate(fields)))
        except ValidationError as exc:
            raise _problem(exc, where) from None
    return answers


# The states of a tool part that carry the browser's result (``addToolOutput``).
_ANSWERED = ("output-available", "output-error")


def tool_results_of(messages: list[UIMessage]) -> list[tuple[str, ToolResultRequest]]:
    """The results of the browser's tools a chat sends (``addToolOutput``, then what
    ``sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithToolCalls`` sends):
    ``(tool call id, result)`` for each browser tool part (``tool-<name>``: the service's own
    tools are ``dynamic-tool``) of the last message's last step in state ``output-available`` or
    ``output-error``; none when the last message is the user's. ``ValueError`` names a malformed
    one's place."""
    last = len(messages) - 1
    if messages[last].role != "assistant":
        return []
    parts = messages[last].parts
    step = max((n for n, part in enumerate(parts) if part.get("type") == "step-start"), default=-1)
    results = []
    for number in range(step + 1, len(parts)):
        part = parts[number]
        kind, state = part.get("type"), part.get("state")
        if not (isinstance(kind, str) and kind.startswith("tool-") and state in _ANSWERED):
            continue
        where = f"{last}.parts.{number}"
        call = part.get("toolCallId")
        if not isinstance(call, str) or not call:
            raise ValueError(f"{where}.toolCallId: a tool part needs its call's id")
        if state == "output-error":
            text = part.get("errorText")
            fields: dict[str, Any] = {"error": text if isinstance(text, str) and text else "the tool failed"}
        else:
            fields = {"output": part.get("output")}
        try:
            results.append((call, ToolResultRequest.model_validate(fields)))
        except ValidationError as exc:
            raise _problem(exc, where) from None
    return results
