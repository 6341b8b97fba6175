"""Per-request records of the emulator, shared safely between its loop and other threads.

The emulator's event loop creates and updates records; tests and benchmarks read snapshots
or block until a record reaches some state. Every access goes through one
``threading.Condition`` because readers usually live on another thread (or another loop).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

Outcome = Literal["running", "completed", "client_closed", "error"]

DEFAULT_MAX_RECORDS = 10_000


@dataclass(slots=True)
class RequestRecord:
    """What happened to one request; times are ``time.monotonic()`` seconds."""

    index: int
    model_id: str
    user_text: str
    started_at: float
    first_token_at: float | None = None
    finished_at: float | None = None
    outcome: Outcome = "running"
    deltas_sent: int = 0
    status: int = 200
    stop_reason: str | None = None
    error_type: str | None = None
    # What the request asked of the model: its system prompt (the texts of ``system`` joined by a
    # blank line) and the names of the tools it offered, sorted. Tests check by them which agent
    # a request came from.
    system: str = ""
    tools: tuple[str, ...] = ()
    traceparent: str = ""  # the W3C trace context the request carried, if any
    # When each token left the model (``time.monotonic()``, the moment its pacer released it),
    # kept only with ``EmulatorConfig.record_token_times``: a benchmark measures latency from it.
    token_times: list[float] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The record as a JSON-ready dict."""
        return dataclasses.asdict(self)


class RecordStore:
    """A bounded, thread-safe log of :class:`RequestRecord`, newest last."""

    def __init__(self, max_records: int = DEFAULT_MAX_RECORDS) -> None:
        self._records: deque[RequestRecord] = deque(maxlen=max_records)
        self._condition = threading.Condition()
        self._next_index = 0

    def open(
        self,
        model_id: str,
        user_text: str,
        *,
        system: str = "",
        tools: tuple[str, ...] = (),
        traceparent: str = "",
    ) -> RequestRecord:
        """Create and keep a record for a request that starts now."""
        with self._condition:
            record = RequestRecord(
                index=self._next_index,
                model_id=model_id,
                user_text=user_text,
                started_at=time.monotonic(),
                system=system,
                tools=tools,
                traceparent=traceparent,
            )
            self._next_index += 1
            self._records.append(record)
            self._condition.notify_all()
            return record

    def update(self, record: RequestRecord, **changes: Any) -> None:
        """Change fields of ``record`` and wake every waiter."""
        with self._condition:
            for name, value in changes.items():
                setattr(record, name, value)
            self._condition.notify_all()

    def token_produced(self, record: RequestRecord, at: float) -> None:
        """Note that one more of ``record``'s tokens left the model at ``at``."""
        with self._condition:
            record.token_times.append(at)

    def finish(self, record: RequestRecord, outcome: Outcome, **changes: Any) -> None:
        """Close ``record`` with ``outcome``, unless it is already closed."""
        with self._condition:
            # The first verdict stands: a cancellation after completion must not rewrite it.
            if record.outcome != "running":
                return
            for name, value in changes.items():
                setattr(record, name, value)
            record.outcome = outcome
            record.finished_at = time.monotonic()
            self._condition.notify_all()

    def snapshot(self) -> list[RequestRecord]:
        """Copies of all kept records, oldest first."""
        with self._condition:
            return [_copy(record) for record in self._records]

    def wait_for(self, predicate: Callable[[RequestRecord], bool], timeout: float = 5.0) -> RequestRecord:
        """Block until some record satisfies ``predicate``; return a copy of the newest such."""

        def find() -> RequestRecord | None:
            for record in reversed(self._records):
                if predicate(record):
                    return record
            return None

        with self._condition:
            found = self._condition.wait_for(find, timeout)
            if found is None:
                raise TimeoutError(f"no emulator record matched within {timeout}s")
            return _copy(found)


def _copy(record: RequestRecord) -> RequestRecord:
    """A copy of ``record`` that the store's later changes leave alone."""
    return dataclasses.replace(record, token_times=list(record.token_times))
