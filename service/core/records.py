"""The durable record of sessions: the interface the core sees of the database.

The event log (memory or Redis Streams) is the short-term, fast tier; a :class:`SessionRecords`
keeps what must outlive it: each session (owner, title, times, status, usage, last event id)
and its conversation, every message with the run that produced it. It is written when a query
starts and when it ends, never per token, so a crash loses at most the query in flight.

Contract of every implementation (:mod:`service.db` with SQLAlchemy is the one the app uses):

- ``created`` stores a new, idle session, bound to its agent for life; ``run_started`` marks it running (the run's id, the
  title from the first message when it has none) and reserves the event ids up to
  ``ids_reserved_until`` for the run; ``reserve_ids`` moves that reservation further (a run that
  reached it); ``run_finished`` stores the messages not yet stored (each with the run's id; with
  ``cut``, the number a rewind kept, those stored from there are replaced first), the usage, the last event id (which also ends the reservation) and the status ``idle``, and
  records how the run ended. Each is one transaction.
- ``load`` returns the session with its whole conversation, or None.
- ``list`` returns the owner's sessions, newest update first, after the ``before`` cursor.
- ``rename``, ``delete`` answer False when there was no such session (of that owner).
- ``sweep`` deletes the sessions not updated since ``before`` (epoch seconds), and no running one.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any

from service.core.events import Usage

TITLE_CHARS = 80
# The agent of a session made without naming one, and of every session made before agents had
# names (kept here, where the record needs it, for service.core.sessions imports the record).
DEFAULT_AGENT = "default"


def title_of(message: str) -> str:
    """A session's title from its first message: one line, at most ``TITLE_CHARS`` characters."""
    line = " ".join(message.split())
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1].rstrip() + "…"


@dataclass
class SessionRecord:
    """A session as stored (``messages`` only when loaded whole)."""

    id: str
    owner: str
    title: str = ""
    created_at: float = 0.0
    updated_at: float = 0.0
    status: str = "idle"
    usage: Usage = field(default_factory=Usage)
    last_event_id: int = 0
    # Ids a run may have handed out that are not stored (its events are not): never given again.
    ids_reserved_until: int = 0
    run_id: str = ""
    messages: list[dict[str, Any]] = field(default_factory=list)
    agent: str = DEFAULT_AGENT

    @property
    def resume_after(self) -> int:
        """The id the live log continues after: the stored last id, or past the reservation of a
        run that never finished (its events, lost, may have had any id up to it)."""
        return max(self.last_event_id, self.ids_reserved_until)

    def summary(self) -> dict[str, Any]:
        """The session as ``GET /sessions`` lists it."""
        return {
            "id": self.id,
            "title": self.title,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "status": self.status,
            "usage": self.usage.model_dump(),
            "last_event_id": self.last_event_id,
            "agent": self.agent,
        }


@dataclass(frozen=True)
class RunEnd:
    """How a run ended, as the record keeps it: ``outcome`` is ``done``, ``cancelled`` or ``error``,
    with the error's code (``interrupted`` for a run its instance never finished)."""

    outcome: str
    error: str = ""


@dataclass(frozen=True)
class Page:
    """One page of an owner's sessions, and the cursor of the next (None on the last page)."""

    sessions: list[SessionRecord]
    next_before: str | None


class SessionRecords(abc.ABC):
    """Where sessions are kept for good (see the module docstring for the contract)."""

    @abc.abstractmethod
    async def start(self) -> None:
        """Connect (and bring the schema up to date)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release the connections."""

    @abc.abstractmethod
    async def created(self, session_id: str, owner: str, now: float, agent: str = DEFAULT_AGENT) -> None: ...

    @abc.abstractmethod
    async def run_started(
        self, session_id: str, run_id: str, message: str, now: float, *, ids_reserved_until: int = 0
    ) -> None: ...

    @abc.abstractmethod
    async def reserve_ids(self, session_id: str, ids_reserved_until: int) -> None: ...

    @abc.abstractmethod
    async def run_finished(
        self,
        session_id: str,
        run_id: str,
        *,
        messages: list[dict[str, Any]],
        usage: Usage,
        last_event_id: int,
        end: RunEnd,
        now: float,
        cut: int | None = None,
    ) -> None: ...

    @abc.abstractmethod
    async def load(self, session_id: str) -> SessionRecord | None: ...

    @abc.abstractmethod
    async def list(self, owner: str, limit: int, before: str | None = None) -> Page: ...

    @abc.abstractmethod
    async def rename(self, session_id: str, owner: str, title: str, now: float) -> bool: ...

    @abc.abstractmethod
    async def delete(self, session_id: str) -> bool: ...

    @abc.abstractmethod
    async def sweep(self, before: float) -> list[str]: ...
