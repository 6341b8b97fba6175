"""Answering a tool approval, the same way from every transport.

``POST /sessions/{id}/approvals/{approval_id}``, the WebSocket ``approve`` message and the MCP
``session_approve`` tool all come here. The answer is checked (the approval exists, an edited input
fits the tool's input schema) and handed to the store, which logs it only if the approval is still
pending, in one step however many instances answer at once; the run that waits reads it from
the session's log (:mod:`service.core.approvals`). The same answer again is accepted (a retried
request); a different one, or one for a query that has ended or an approval that has expired,
is a conflict. A protocol's resume answers a query's approvals together
(:func:`answer_turn`): all of them, each checked before any is logged, or none.
"""

from __future__ import annotations

from typing import Any

import jsonschema
from pydantic import ValidationError

from service.core import traces
from service.core.events import ToolApprovalResponse, client_tool_key
from service.core.sessions import APPROVED, CLOSED, EXPIRED, PENDING, Session
from service.errors import (
    ApprovalConflict,
    ApprovalError,
    ApprovalInputInvalid,
    ApprovalNotFound,
    ApprovalsUnanswered,
)
from service.transports.edge.context import Context
from service.transports.edge.inputs import ApprovalAnswer
from service.transports.edge.middleware import json_error

CLIENT_TOOL_PREFIX = client_tool_key("")


def check_input(context: Context, session: Session, approval_id: str, edited: dict[str, Any]) -> None:
    """Refuse an edited input that the tool's input schema does not accept."""
    request = session.approval_requests.get(approval_id)
    schema = context.tool_schema(request.tool) if request is not None else None
    if not schema:
        return
    validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        errors = sorted(validator(schema).iter_errors(edited), key=lambda error: list(error.absolute_path))
    except jsonschema.SchemaError:
        return  # a tool with a broken schema is the tool's fault; the tool itself checks its input
    if errors:
        where = "/".join(str(part) for part in errors[0].absolute_path) or "input"
        raise ApprovalInputInvalid(
            f"input does not fit {request.tool}'s input schema: {where}: {errors[0].message}"
        )


def _settled(state: str, approval_id: str, approved: bool) -> None:
    """Raise why an answer to an approval no longer pending (``state``) is refused; return when
    it is the answer already taken (a retried request)."""
    if state == CLOSED:
        raise ApprovalConflict("the approval is no longer pending: its query ended before it was answered")
    if state == EXPIRED:
        raise ApprovalConflict(
            "the approval expired before it was answered: it was denied with the reason 'expired'"
        )
    if (state == APPROVED) == approved:
        return
    earlier = "approved" if state == APPROVED else "denied"
    raise ApprovalConflict(f"the approval was already answered: {earlier}")


def _state(session: Session, approval_id: str) -> str | None:
    """The approval's state; None for an id that names no approval (a client tool call's key is
    kept beside the approvals, and is answered with its result, never an approval)."""
    if approval_id.startswith(CLIENT_TOOL_PREFIX):
        return None
    return session.approvals.get(approval_id)


def check(context: Context, session: Session, approval_id: str, body: ApprovalAnswer) -> None:
    """Raise the :class:`ApprovalError` that :func:`answer` would for this answer, logging nothing."""
    state = _state(session, approval_id)
    if state is None:
        raise ApprovalNotFound(f"no approval {approval_id!r} in this session")
    if state != PENDING:
        _settled(state, approval_id, body.approved)
    elif body.approved and body.input is not None:
        check_input(context, session, approval_id, body.input)


async def answer(
    context: Context, session: Session, approval_id: str, body: ApprovalAnswer, by: str
) -> dict[str, Any]:
    """Answer the approval: ``{"approval_id", "approved"}``, or an :class:`ApprovalError`."""
    state = _state(session, approval_id)
    if state is None:
        raise ApprovalNotFound(f"no approval {approval_id!r} in this session")
    edited = body.input if body.approved else None
    if edited is not None and state == PENDING:
        check_input(context, session, approval_id, edited)
    response = ToolApprovalResponse(
        approval_id=approval_id, approved=body.approved, reason=body.reason or "", by=by, input=edited
    )
    request = session.approval_requests.get(approval_id)
    with traces.continued(
        context.tracer,
        request.trace if request is not None else "",
        f"tool_approval_response {request.tool if request is not None else ''}".rstrip(),
        {"agentstream.approval.approved": body.approved, "agentstream.approval.by": by},
    ):
        taken = await context.sessions.answer_approval(session, response)
    if taken == "":
        raise ApprovalNotFound(f"no approval {approval_id!r} in this session")
    if taken is not None:
        _settled(taken, approval_id, body.approved)
    return {"approval_id": approval_id, "approved": body.approved}


async def answer_turn(
    context: Context, session: Session, answers: list[tuple[str, ApprovalAnswer]], by: str
) -> None:
    """Answer the approvals a query waits on all at once (a protocol's resume), or none of them:
    each answer is checked first, and one that leaves some of the turn's approvals unanswered is
    :class:`ApprovalsUnanswered`, since the query could go no further with it than before."""
    named: set[str] = set()
    for approval_id, body in answers:
        if approval_id in named:
            raise ApprovalInputInvalid(f"approval {approval_id!r} is answered twice in one request")
        named.add(approval_id)
        check(context, session, approval_id, body)
    unanswered = [r.approval_id for r in session.pending_approvals() if r.approval_id not in named]
    if unanswered:
        raise ApprovalsUnanswered(unanswered)
    for approval_id, body in answers:
        await answer(context, session, approval_id, body, by)


async def answer_message(
    context: Context, session: Session, approval_id: str, message: dict[str, Any], by: str
) -> dict[str, Any]:
    """:func:`answer` for a message whose ``approved``, ``reason`` and ``input`` sit among other
    fields (a WebSocket ``approve``); a malformed answer is an :class:`ApprovalError` (422)."""
    fields = {name: message[name] for name in ("approved", "reason", "input") if name in message}
    try:
        body = ApprovalAnswer.model_validate(fields)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in error['loc'])}: {error['msg']}" for error in exc.errors()
        )
        raise ApprovalInputInvalid(f"invalid answer: {problems}") from None
    return await answer(context, session, approval_id, body, by)


async def answer_all(
    context: Context, session: Session, answers: list[tuple[str, ApprovalAnswer]], by: str
) -> None:
    """:func:`answer_turn` for a protocol's request: a refusal (404, 409, 422) is the reply, and
    then none of the answers is applied."""
    try:
        await answer_turn(context, session, answers, by)
    except ApprovalsUnanswered as exc:
        raise json_error(exc.status, str(exc), code=exc.code, unanswered=exc.unanswered) from None
    except ApprovalError as exc:
        raise json_error(exc.status, str(exc)) from None
