"""What the AI SDK's ``DefaultChatTransport`` posts to ``POST /api/chat``, and what the service
reads from it: the last user message's text (the new query) or the approval answers of tool parts
in state ``approval-responded``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from service.transports.edge.inputs import ApprovalAnswer, query_text


class UIMessage(BaseModel):
    """One message of a chat as ``useChat`` keeps it; only the last user message is read."""

    model_config = ConfigDict(extra="allow")

    id: str = ""
    role: Literal["system", "user", "assistant"]
    parts: list[dict[str, Any]]
    metadata: Any = None


class ChatRequest(BaseModel):
    """Body of ``POST /api/chat``: what ``DefaultChatTransport.sendMessages`` sends."""

    model_config = ConfigDict(extra="allow")

    id: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_-]+$")
    messages: list[UIMessage] = Field(min_length=1)
    trigger: Literal["submit-message", "regenerate-message"] = "submit-message"
    messageId: str | None = None  # noqa: N815 (the AI SDK's name)


def query_of(messages: list[UIMessage]) -> str:
    """The new query: the text of the last message, which must be the user's.

    The server's conversation is the truth, so the rest of the history a client sends is not read
    (a ``regenerate-message`` asks the last user message again). ``ValueError`` says what is wrong.
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
            problem = exc.errors(include_url=False)[0]
            field = ".".join(str(item) for item in problem["loc"])
            raise ValueError(f"{where}.{field}: {problem['msg']}") from None
    return answers
