"""A finished model turn told as a :class:`~service.core.model_calls.ModelCall`, for the loop's
turn observer (the GenAI client metrics)."""

from __future__ import annotations

import asyncio

from service.agent.query import Turn
from service.core.model_calls import ModelCall
from service.core.traces import CANCELLED, provider_name
from service.providers.base import ModelProvider, ModelRequest


def error_type(turn: Turn, stopped: BaseException | None) -> str:
    """How a turn failed, as ``error.type`` names it: the provider's error code, ``cancelled``
    when the query stopped it, an exception's class otherwise; "" when it succeeded."""
    if turn.error is not None:
        return turn.error.code
    if isinstance(stopped, asyncio.CancelledError | GeneratorExit):
        return CANCELLED
    if stopped is not None:
        return type(stopped).__qualname__
    return ""


def model_call(
    provider: ModelProvider,
    request: ModelRequest,
    turn: Turn,
    duration_s: float,
    stopped: BaseException | None,
) -> ModelCall:
    result = turn.result
    return ModelCall(
        provider=provider_name(provider),
        model=request.model or getattr(provider, "model_id", "") or "",
        duration_s=duration_s,
        error_type=error_type(turn, stopped),
        usage=result.usage if result is not None else None,
        response_model=result.response_model if result is not None else "",
    )
