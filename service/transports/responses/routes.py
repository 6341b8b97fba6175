"""OpenAI's Responses API: ``POST /v1/responses``, ``GET /v1/responses/{id}`` (polled, or streamed
from any sequence number), ``POST /v1/responses/{id}/cancel``, ``DELETE /v1/responses/{id}``.

A response is one query in a session: a request without ``previous_response_id`` makes a session
(a short-lived one with ``store: false``), one with it continues that response's session. The
response's id names both (``resp_`` + a token + the session id), so any instance finds it
without a table of its own: the query is the one whose ``run_started`` carries that id as its
``reply_id``, and its events are read from the session's log like every other face's
(:mod:`service.transports.responses.projector` numbers them). Once the log no longer holds the
query (purged, or the service restarted on the session database), the response is told from the
stored conversation, whose messages carry the response's id.

The client's function ``tools`` are handed back unrun (the response completes with the
``function_call`` items; the next request's ``function_call_output`` items, with
``previous_response_id`` or the whole history, continue). A call of the service's own tools that
needs approval keeps the response ``in_progress``, its ``mcp_approval_request`` item naming the
approval that the session's native routes answer. An input item may name an earlier stored
answer by its id (``item_reference``, as the AI SDK's provider sends it): its text is read from
the conversation that holds it. A streamed or waited-for response that is not ``background`` is
cancelled when its client goes away, as OpenAI's are; a background one runs on.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from service import jsonsafe
from service.core import conversation
from service.core.agents import info_of
from service.core.events import RunError, RunStarted
from service.core.log import LogEntry
from service.core.options import RunOptions
from service.core.runs import Run
from service.core.sessions import Session
from service.errors import SessionNotFound
from service.transports.edge.auth import owner_of
from service.transports.edge.context import Context, context_of
from service.transports.edge.inputs import read_object
from service.transports.edge.middleware import add_error_shape
from service.transports.edge.openai_errors import (
    PREFIX,
    InvalidParam,
    agent_for_model,
    error_body,
    openai_error,
    require_client_tools_taken,
    require_unicode,
    reshaped,
    run_error_status,
)
from service.transports.responses.inbound import (
    MESSAGE_PREFIX,
    Query,
    message_references,
    param_of,
    to_query,
)
from service.transports.responses.models import UNSUPPORTED, ResponseRequest
from service.transports.responses.projector import RESPONSE_PREFIX, ResponseProjection, ResponseStream
from service.transports.responses.stored import belongs, from_conversation
from service.transports.stream.follow import ThroughRun
from service.transports.stream.sse import serve

TRANSPORT = "responses"
# ``resp_``, a token, the session's id: any instance finds the response from its id alone.
RESPONSE_ID = re.compile(r"resp_([0-9a-f]{16})([A-Za-z0-9_-]{1,128})")
# How many of the log's newest entries are read at a time, looking for a response's start.
_WINDOW = 512


def new_response_id(session_id: str) -> str:
    """A new response's id in ``session_id``."""
    return f"{RESPONSE_PREFIX}{secrets.token_hex(8)}{session_id}"


async def read_request(request: web.Request) -> ResponseRequest:
    """The body as a Responses request; a 400 (413 too large) in OpenAI's shape otherwise."""
    data = await read_object(request)  # 413, 400, 422 (reshaped as a 400 by the middleware)
    require_unicode(data)
    for name, reason in UNSUPPORTED.items():
        if data.get(name) is not None:
            raise openai_error(400, reason, "unsupported_parameter", name)
    try:
        return ResponseRequest.model_validate(data)
    except ValidationError as exc:
        problems = _told(exc)
        problem = problems[0]
        if problem["type"] == "extra_forbidden":
            # The name as the client sent it: any string is a JSON key, not only a field's name.
            *where, key = problem["loc"]
            name = f"{param_of(tuple(where))}.{key}" if where else str(key)
            raise openai_error(400, f"Unknown parameter: '{name}'.", "unknown_parameter", name) from None
        summary = "; ".join(f"{param_of(item['loc'])}: {item['msg']}" for item in problems[:5])
        raise openai_error(
            400, f"invalid request: {summary}", "invalid_value", param_of(problem["loc"])
        ) from None


def _told(exc: ValidationError) -> list[ErrorDetails]:
    """The errors a 400 tells, the one its ``param`` names first: of the first parameter in
    error, those that got furthest into its value (the members of a union that do not take the
    value's JSON type fail at once, ``input: Input should be a valid string`` for a list of
    items; the member that does take it names the item and field at fault), then the others'."""
    errors = exc.errors(include_url=False)
    first = errors[0]["loc"][:1]
    own = [error for error in errors if error["loc"][:1] == first]
    deepest = max(len(error["loc"]) for error in own)
    return [error for error in own if len(error["loc"]) == deepest] + [
        error for error in errors if error["loc"][:1] != first
    ]


# --- finding a response -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Found:
    """A response's session, and its query's ``run_started`` entry while the log holds it."""

    response_id: str
    session: Session
    start: LogEntry | None


def _not_found(response_id: str, param: str | None = None) -> web.HTTPException:
    return openai_error(404, f"Response with id '{response_id}' not found.", "not_found", param)


async def _session_of(context: Context, owner: str, response_id: str) -> Session | None:
    """The session a response id names, if it is one and ``owner``'s."""
    match = RESPONSE_ID.fullmatch(response_id)
    if match is None:
        return None
    try:
        return await context.sessions.get_owned(match[2], owner)
    except SessionNotFound:
        return None


async def find(context: Context, request: web.Request, response_id: str, param: str | None = None) -> Found:
    """The caller's response of that id; 404 for an id that is not one, or not the caller's."""
    session = await _session_of(context, owner_of(request), response_id)
    if session is None:
        raise _not_found(response_id, param)
    start = await _started(session, response_id)
    if start is None and not _stored(session.messages, response_id):
        raise _not_found(response_id, param)
    return Found(response_id, session, start)


async def _started(session: Session, response_id: str) -> LogEntry | None:
    """The ``run_started`` of the response's query, read from the newest entries back."""
    log = session.log
    first, high = await log.first_id(), await log.last_id()
    while high >= first:
        low = max(first - 1, high - _WINDOW)
        for entry in reversed(await log.read(low, high - low, strict=False)):
            event = entry.event
            if type(event) is RunStarted and event.reply_id == response_id:
                return entry
        high = low
    return None


def _stored(messages: list[dict[str, Any]], response_id: str) -> bool:
    return any(belongs(identifier, response_id) for _, identifier in conversation.ids(messages))


async def snapshot(found: Found, model: str) -> dict[str, Any]:
    """The response as it stands: folded from its query's events, or told from the conversation."""
    if found.start is None:
        return from_conversation(found.response_id, found.session.id, found.session.messages, model)
    projection = ResponseProjection(found.response_id, found.session.id)
    log = found.session.log
    after = found.start.id - 1
    while not projection.ended:
        entries = await log.read(after, 1024, strict=False)
        if not entries:
            break
        for entry in entries:
            projection.feed(entry.event, entry.ts)
            if projection.ended:
                break
        after = entries[-1].id
    return projection.response()


# --- creating one -------------------------------------------------------------------------------


def _pending(messages: list[dict[str, Any]]) -> dict[str, str]:
    """The calls the conversation's last answer handed back, unanswered: ``call_id`` -> tool-use id."""
    if not messages or messages[-1].get("role") != "assistant":
        return {}
    return {call.id: call.id for call in conversation.calls_of(messages[-1])}


def _latest(messages: list[dict[str, Any]], response_id: str) -> bool:
    """True when nothing in the conversation follows the response's own messages."""
    last = None
    for index, identifier in conversation.ids(messages):
        if belongs(identifier, response_id):
            last = index
    return last is None or last == len(messages) - 1


async def _continued(context: Context, request: web.Request, body: ResponseRequest) -> Session | None:
    """The session ``previous_response_id`` names (its latest response), or None without one."""
    if body.previous_response_id is None:
        return None
    found = await find(context, request, body.previous_response_id, "previous_response_id")
    if not _latest(found.session.messages, body.previous_response_id):
        raise openai_error(
            409,
            f"Response '{body.previous_response_id}' has been continued already: only the latest response "
            "of a conversation can be continued here.",
            "conversation_forked",
            "previous_response_id",
        )
    return found.session


# A later model turn's message carries its response's id and ``-<turn>``.
_LATER_TURN = re.compile(r"(.+)-[0-9]+")


async def _answers(context: Context, request: web.Request, body: ResponseRequest) -> dict[str, str]:
    """The text of each answer the input references, read from the caller's stored conversation
    that holds it (the item's id names its response, so its session); 404 for one not found."""
    texts: dict[str, str] = {}
    sessions: dict[str, Session | None] = {}
    for item_id, param in message_references(body):
        if item_id not in texts:
            text = await _answer(context, owner_of(request), item_id, sessions)
            if text is None:
                raise openai_error(404, f"Item with id '{item_id}' not found.", "not_found", param)
            texts[item_id] = text
    return texts


async def _answer(
    context: Context, owner: str, item_id: str, sessions: dict[str, Session | None]
) -> str | None:
    """The text of the answer ``item_id`` names, or None; ``sessions`` keeps those read already,
    by response id."""
    message_id = RESPONSE_PREFIX + item_id.removeprefix(MESSAGE_PREFIX)
    later = _LATER_TURN.fullmatch(message_id)
    # A session id may itself end in "-<digits>": the whole id is tried as a response's first.
    for response_id in (message_id, later[1] if later else ""):
        if response_id not in sessions:
            sessions[response_id] = await _session_of(context, owner, response_id)
        session = sessions[response_id]
        index = conversation.find(session.messages, message_id) if session is not None else None
        if session is not None and index is not None and session.messages[index].get("role") == "assistant":
            parts = conversation.parts_of(session.messages[index])
            return "".join(part.text for part in parts if isinstance(part, conversation.Text))
    return None


def _echo(context: Context, body: ResponseRequest, query: Query, store: bool) -> dict[str, Any]:
    """What the response shows of its request, from any instance (``run_started.request``)."""
    choice = body.tool_choice
    return {
        "model": body.model,
        "instructions": body.instructions,
        "tools": list(query.tools),
        "tool_choice": choice.model_dump() if choice is not None and not isinstance(choice, str) else choice,
        "metadata": body.metadata or {},
        "max_output_tokens": body.max_output_tokens,
        "previous_response_id": body.previous_response_id,
        "background": bool(body.background),
        "store": store,
    }


async def create(request: web.Request) -> web.StreamResponse:
    """``POST /v1/responses``: run the agent on the input and answer as a response."""
    context = context_of(request)
    settings = context.settings
    body = await read_request(request)
    agent = agent_for_model(context.agents, settings, body.model)
    store = body.store is not False
    if body.background and not store:
        raise openai_error(
            400, "background responses must be stored (store: true)", "invalid_value", "background"
        )
    session = await _continued(context, request, body)
    if session is not None and info_of(context.agents, session.agent) != info_of(context.agents, agent):
        raise openai_error(
            400,
            f"the conversation of previous_response_id is with the agent `{session.agent}`: a conversation "
            "keeps its agent, so continue it with that model",
            "invalid_value",
            "model",
        )
    answers = await _answers(context, request, body)
    try:
        query = to_query(body, _pending(session.messages) if session is not None else None, answers)
    except InvalidParam as exc:
        raise openai_error(400, exc.message, "invalid_value", exc.param) from None
    require_client_tools_taken(context.agents, agent, len(query.client_tools))
    if len(query.text) > settings.max_message_chars:
        raise openai_error(
            400,
            f"the user's message is longer than {settings.max_message_chars} characters",
            "string_above_max_length",
            "input",
        )
    owner = owner_of(request)
    # The stream slot first: a key at its stream quota gets its 429 before any query starts.
    slot = context.stream_slot(TRANSPORT, owner) if body.stream else contextlib.nullcontext()
    async with (
        slot,
        _started_run(context, request, body, query, session, store, agent) as (session, run, response_id),
    ):
        projection = ResponseProjection(response_id, session.id)
        after = run.first_id - 1
        if body.stream:
            return await serve(
                request,
                ResponseStream(projection),
                session.log,
                after,
                transport=TRANSPORT,
                allow_all_methods=True,
            )
        if body.background:
            started = Found(response_id, session, await _first(session, after))
            return _json(await snapshot(started, body.model))
        failure = await _fold(session, after, projection)
        if failure is not None:
            status = run_error_status(failure)
            return web.json_response(error_body(status, failure.error, failure.code), status=status)
        return _json(projection.response())


async def _first(session: Session, after: int) -> LogEntry:
    """The query's ``run_started``, the entry after ``after``."""
    [entry] = await session.log.read(after, 1)
    return entry


@contextlib.asynccontextmanager
async def _started_run(
    context: Context,
    request: web.Request,
    body: ResponseRequest,
    query: Query,
    session: Session | None,
    store: bool,
    agent: str,
) -> AsyncIterator[tuple[Session, Run, str]]:
    """The query started (in a new session unless it continues one), and, when the request
    ends, what becomes of it: a response not ``background`` is cancelled if its client left
    before its end, a short-lived session (``store: false``) is forgotten."""
    owner = owner_of(request)
    made = session is None
    if session is None:
        session = await context.sessions.create(ephemeral=not store, owner=owner, agent=agent)
    response_id = new_response_id(session.id)
    options = RunOptions(
        client_tools=query.client_tools,
        system=query.system,
        max_tokens=body.max_output_tokens,
        resume=query.resume,
        prelude=query.prelude,
        message_id=f"{response_id}-input",
        reply_id=response_id,
        request=_echo(context, body, query, store),
    )
    try:
        run = await context.runs.start(session, query.text, None, options)
    except BaseException:
        if made:
            with contextlib.suppress(SessionNotFound):
                await context.sessions.delete(session.id)
        raise
    try:
        yield session, run, response_id
    except asyncio.CancelledError:
        if not body.background:
            # Shielded: a second cancellation must not leave the run going with nobody to read it.
            await asyncio.shield(_cancel(context, session, run.id))
        raise
    finally:
        if not store:
            await asyncio.shield(context.end_ephemeral(session.id))


async def _cancel(context: Context, session: Session, run_id: str) -> None:
    """Cancel the session's query if it is still the one of ``run_id``."""
    if session.run_id == run_id:
        await context.runs.cancel(session.id)


async def _fold(session: Session, after: int, projection: ResponseProjection) -> RunError | None:
    """Fold the query into ``projection``; the error that ended it, if it failed."""
    reader = ThroughRun(session.log, after)
    async with contextlib.aclosing(reader.batches()) as batches:
        async for batch in batches:
            for entry in batch:
                projection.feed(entry.event, entry.ts)
                if isinstance(entry.event, RunError):
                    return entry.event
    ending = reader.ending
    if ending is not None and ending.clean:
        return None
    return ending.as_error() if ending is not None else RunError(error="the run ended without a result")


def _model_of(context: Context, session: Session) -> str:
    """The ``model`` a response of the session is told under when its request is not known."""
    if not context.settings.agents_file:
        return context.settings.model_id
    info = info_of(context.agents, session.agent)
    return info.name if info is not None else session.agent


def _json(reply: dict[str, Any], status: int = 200) -> web.Response:
    return web.json_response(reply, status=status, dumps=jsonsafe.dumps)


# --- reading, cancelling and deleting one --------------------------------------------------------


def _starting_after(request: web.Request) -> int:
    """``starting_after`` (or ``Last-Event-ID``, as a browser's reconnect sends it): -1 for none."""
    raw = request.query.get("starting_after", request.headers.get("Last-Event-ID"))
    if raw is None or raw == "":
        return -1
    # ASCII digits only: str.isdigit() also takes "²" and other scripts' digits, which int() refuses.
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 18:
        raise openai_error(
            400,
            "starting_after must be a sequence number (an integer from 0)",
            "invalid_value",
            "starting_after",
        )
    return int(raw)


async def retrieve(request: web.Request) -> web.StreamResponse:
    """``GET /v1/responses/{id}``: the response as it stands; with ``stream=true``, its events
    after ``starting_after`` and the rest live, to its end."""
    context = context_of(request)
    stream = request.query.get("stream", "false").lower()
    if stream not in {"true", "false"}:
        raise openai_error(400, "stream must be true or false", "invalid_value", "stream")
    after = _starting_after(request) if stream == "true" else -1
    found = await find(context, request, request.match_info["response_id"])
    if stream == "false":
        return _json(await snapshot(found, _model_of(context, found.session)))
    if found.start is None:
        raise openai_error(
            400,
            "this response's events are no longer kept: GET it without stream",
            "events_purged",
            "stream",
        )
    projection = ResponseProjection(found.response_id, found.session.id)
    async with context.stream_slot(TRANSPORT, owner_of(request)):
        return await serve(
            request,
            ResponseStream(projection, after),
            found.session.log,
            found.start.id - 1,
            transport=TRANSPORT,
        )


async def cancel(request: web.Request) -> web.Response:
    """``POST /v1/responses/{id}/cancel``: stop the response's query if it runs; the response."""
    context = context_of(request)
    found = await find(context, request, request.match_info["response_id"])
    if found.start is not None:
        started = found.start.event
        assert isinstance(started, RunStarted)
        await _cancel(context, found.session, started.run_id)
    return _json(await snapshot(found, _model_of(context, found.session)))


async def delete(request: web.Request) -> web.Response:
    """``DELETE /v1/responses/{id}``: stop it if it runs and forget its conversation (the session
    it and the responses continued from or after it share)."""
    context = context_of(request)
    found = await find(context, request, request.match_info["response_id"])
    session = found.session
    context.multitask.drop(session.id)
    await context.runs.cancel(session.id)
    with contextlib.suppress(SessionNotFound):
        await context.sessions.delete(session.id)
    return _json({"id": found.response_id, "object": "response.deleted", "deleted": True})


def add_routes(app: web.Application) -> None:
    """Register the Responses routes; every error under ``/v1/`` in OpenAI's shape."""
    add_error_shape(app, PREFIX, reshaped)
    app.router.add_post("/v1/responses", create)
    app.router.add_get("/v1/responses/{response_id}", retrieve)
    app.router.add_post("/v1/responses/{response_id}/cancel", cancel)
    app.router.add_delete("/v1/responses/{response_id}", delete)
