"""Sessions: a conversation, its event log and its status.

Every run belongs to a session; ``POST /agent/stream`` uses a short-lived (ephemeral) one, so
there is one path for all. The store is an interface with an in-memory default; a Redis store
fits behind it later.
"""

from __future__ import annotations

import abc
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from service.core.log import EventLog, MemoryEventLog
from service.errors import SessionNotFound

IDLE = "idle"
RUNNING = "running"


@dataclass
class Session:
    """One conversation: its messages (Bedrock's format), its event log and its status."""

    id: str
    log: EventLog
    messages: list[dict[str, Any]] = field(default_factory=list)
    status: str = IDLE
    ephemeral: bool = False
    created_at: float = field(default_factory=time.time)
    last_active: float = field(default_factory=time.monotonic)

    def touch(self) -> None:
        """Note activity, for the idle time-to-live."""
        self.last_active = time.monotonic()


def new_session_id() -> str:
    """A random, URL-safe session id that cannot be guessed."""
    return secrets.token_urlsafe(16)


class SessionStore(abc.ABC):
    """Where sessions live."""

    @abc.abstractmethod
    async def create(self, *, ephemeral: bool = False) -> Session:
        """Make a new, idle session."""

    @abc.abstractmethod
    async def get(self, session_id: str) -> Session:
        """The session with that id; :class:`SessionNotFound` if there is none."""

    @abc.abstractmethod
    async def delete(self, session_id: str) -> None:
        """Forget the session and close its log; :class:`SessionNotFound` if there is none."""

    @abc.abstractmethod
    async def count(self) -> int:
        """How many sessions are held."""


class MemorySessionStore(SessionStore):
    """Sessions in this process's memory, each with a :class:`MemoryEventLog`."""

    def __init__(self, log_factory: Callable[[], EventLog] | None = None) -> None:
        self._log_factory = log_factory or MemoryEventLog
        self._sessions: dict[str, Session] = {}

    async def create(self, *, ephemeral: bool = False) -> Session:
        session = Session(id=new_session_id(), log=self._log_factory(), ephemeral=ephemeral)
        self._sessions[session.id] = session
        return session

    async def get(self, session_id: str) -> Session:
        try:
            return self._sessions[session_id]
        except KeyError:
            raise SessionNotFound(session_id) from None

    async def delete(self, session_id: str) -> None:
        session = self._sessions.pop(session_id, None)
        if session is None:
            raise SessionNotFound(session_id)
        await session.log.close()

    async def count(self) -> int:
        return len(self._sessions)
