"""A log's entry: an event as stored, shared by every reader of the log."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from service.core.events import Event


@dataclass(slots=True)
class LogEntry:
    """An event as stored: its id, the event, its size as the log's bound counts it, and when it came.

    ``encoded`` caches each dialect's wire form of the entry, so an event sent to a thousand
    subscribers is projected and serialised once, not a thousand times.

    Entries are shared by every reader and never changed once made. They are not frozen only
    because a frozen dataclass sets each field through ``object.__setattr__``, and one is made per
    token: frozen, an entry costs several times as much to make (measured: docs/benchmarks.md,
    section Write-through delivery and the per-token work (89119d6)).
    """

    id: int
    event: Event
    size: int
    ts: float = field(default_factory=time.time)
    encoded: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
