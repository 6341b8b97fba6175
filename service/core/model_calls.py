"""A model call (one turn of an agent loop) as OpenTelemetry's GenAI client metrics count it:
its provider and model, its duration, how it failed, and the tokens the model reported.

The agent loop tells one :class:`ModelCall` per turn to the ``turn_observer`` the app gives it
(the Prometheus metrics' :meth:`~service.metrics.Metrics.model_call`), so the agent package
knows nothing of the metrics. One is made per turn, at its end, never per token.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from service.core.events import Usage


@dataclass(frozen=True, slots=True)
class ModelCall:
    """One model turn, in the terms of the GenAI conventions' attributes."""

    provider: str  # gen_ai.provider.name: aws.bedrock, openai
    model: str  # gen_ai.request.model
    duration_s: float
    error_type: str = ""  # error.type: "" when the call succeeded
    usage: Usage | None = None  # None when the model reported none (a failed or cancelled turn)
    response_model: str = ""  # gen_ai.response.model: who answered, when the wire says


TurnObserver = Callable[[ModelCall], None]


def ignore(call: ModelCall) -> None:
    """The observer of a loop no one counts."""
