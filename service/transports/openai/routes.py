"""The OpenAI Chat Completions face: ``POST /v1/chat/completions``, ``GET /v1/models``.

Any OpenAI client (the ``openai`` packages, chat UIs such as Open WebUI) can talk to the agent:
each request runs one query in a short-lived session, on the conversation it brings, and answers
as one ``chat.completion`` or, with ``stream: true``, as ``chat.completion.chunk``\\ s on SSE
``data:`` lines (each with the log's id as ``id:``) ending in ``data: [DONE]``, the usage chunk
before it when ``stream_options.include_usage`` is set. A request that brings ``tools`` gets the
model's calls to them back as ``tool_calls`` (``finish_reason: tool_calls``), unrun: the service
is then an OpenAI-compatible front for its model (see :mod:`service.core.options`). Nothing here
can answer a tool approval, so a call of the agent's own that needs one is declined at once
(``RunOptions.approvals``) and the model answers without it.

It takes the one path of every route (access, quotas, a session from the store, the run manager,
the log read through a :class:`~service.transports.stream.follow.Follower`, a pure projection in
:mod:`service.transports.openai.projector`). Errors are OpenAI's ``{"error": {"message", "type",
"code", "param"}}``: :func:`~service.transports.edge.openai_errors.reshaped`, which the error middleware applies under
``/v1/``, also reshapes the errors the rest of the service answers there (401 no key, 429 quota,
413 too large, 503 at a limit).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time

from aiohttp import web
from pydantic import ValidationError

from service import jsonsafe
from service.core.events import RunError
from service.core.sessions import Session
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
    served_models,
)
from service.transports.openai.models import ChatCompletionRequest, ChatModel
from service.transports.openai.projector import (
    ChatProjection,
    ChunkStream,
    to_query,
)
from service.transports.stream.follow import ThroughRun
from service.transports.stream.sse import serve

OWNED_BY = "agentstream"
# Where pydantic's location of an error names a union member rather than a field.
_ROLE_TAGS = frozenset({"system", "developer", "user", "assistant", "tool"})
_TYPE_NAMES = frozenset({"str", "int", "bool", "none", "list", "dict", "float"})


def _param(loc: tuple[int | str, ...]) -> str:
    """A pydantic error location as OpenAI names a parameter (``messages.[0].content``)."""
    parts: list[str] = []
    for depth, item in enumerate(loc):
        if isinstance(item, int):
            parts.append(f"[{item}]")
            continue
        if depth == 2 and loc[0] == "messages" and item in _ROLE_TAGS:
            continue  # the message's role, which pydantic adds as the union's member
        if item in _TYPE_NAMES or not item.replace("_", "").isalnum() or item[:1].isupper():
            break  # a member of a union (``str``, ``list[...]``, a model's name): no field
        parts.append(item)
    return ".".join(parts) or "body"


async def read_request(request: web.Request) -> ChatCompletionRequest:
    """The body as a chat completion request; a 400 (413 too large) in OpenAI's shape otherwise."""
    data = await read_object(request)  # 413, 400, 422 (reshaped as a 400 by the middleware)
    require_unicode(data)
    try:
        return ChatCompletionRequest.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        summary = "; ".join(f"{_param(item['loc'])}: {item['msg']}" for item in errors[:5])
        raise openai_error(
            400, f"invalid request: {summary}", "invalid_value", _param(errors[0]["loc"])
        ) from None


def _models(context: Context) -> list[ChatModel]:
    return [
        {"id": name, "object": "model", "created": 0, "owned_by": OWNED_BY}
        for name in served_models(context.agents, context.settings)
    ]


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """``POST /v1/chat/completions``: run the agent on the conversation and answer it."""
    context = context_of(request)
    settings = context.settings
    body = await read_request(request)
    agent = agent_for_model(context.agents, settings, body.model)
    try:
        query = to_query(body)
    except InvalidParam as exc:
        raise openai_error(400, exc.message, "invalid_value", exc.param) from None
    require_client_tools_taken(context.agents, agent, len(query.options.client_tools))
    if len(query.text) > settings.max_message_chars:
        raise openai_error(
            400,
            f"the last message is longer than {settings.max_message_chars} characters",
            "string_above_max_length",
            f"messages.[{len(body.messages) - 1}].content",
        )
    owner = owner_of(request)
    projection = ChatProjection(
        f"chatcmpl-{secrets.token_hex(12)}",
        body.model,
        int(time.time()),
        query.options.client_tool_names,
    )

    async def start() -> Session:
        return await context.start_ephemeral(
            query.text, None, owner, messages=query.messages, options=query.options, agent=agent
        )

    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        # The stream slot first: a key at its stream quota gets its 429 before any query starts.
        async with context.stream_slot("openai", owner):
            session = await start()
            try:
                return await serve(
                    request,
                    ChunkStream(projection, include_usage),
                    session.log,
                    transport="openai",
                    allow_all_methods=True,
                )
            finally:
                # Shielded: a second cancellation must not leave the run going with nobody to read it.
                await asyncio.shield(context.end_ephemeral(session.id))
    session = await start()
    try:
        failure = await _answer(session, projection)
    finally:
        await asyncio.shield(context.end_ephemeral(session.id))
    if failure is not None:
        status = run_error_status(failure)
        return web.json_response(error_body(status, failure.error, failure.code), status=status)
    return web.json_response(projection.completion(), dumps=jsonsafe.dumps)


async def _answer(session: Session, projection: ChatProjection) -> RunError | None:
    """Fold the run into ``projection``; the error that ended it, if it failed."""
    reader = ThroughRun(session.log)
    async with contextlib.aclosing(reader.batches()) as batches:
        async for batch in batches:
            for entry in batch:
                if isinstance(entry.event, RunError):
                    return entry.event
                projection.project(entry.event)
    ending = reader.ending
    if ending is not None and ending.clean:
        if reader.skipped:  # part of the text is gone: the run's final answer instead
            projection.text = [projection.output]
        return None
    return ending.as_error() if ending is not None else RunError(error="the run ended without a result")


async def list_models(request: web.Request) -> web.Response:
    """``GET /v1/models``: the agents, by name (without an agents file, ``AGENT_MODEL_ID``)."""
    return web.json_response({"object": "list", "data": _models(context_of(request))})


async def get_model(request: web.Request) -> web.Response:
    """``GET /v1/models/{model}``: that model, or 404 ``model_not_found``."""
    for model in _models(context_of(request)):
        if model["id"] == request.match_info["model"]:
            return web.json_response(model)
    raise openai_error(
        404, f"The model `{request.match_info['model']}` does not exist.", "model_not_found", "model"
    )


def add_routes(app: web.Application) -> None:
    """Register the OpenAI-compatible routes; every error under ``/v1/`` in OpenAI's shape."""
    add_error_shape(app, PREFIX, reshaped)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{model}", get_model)
