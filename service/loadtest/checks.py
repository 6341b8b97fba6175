"""How the load tool judges a query: the contiguity of a stream's ids, and what counts as which error."""

from __future__ import annotations

from collections.abc import Iterable

import aiohttp


class IdCheck:
    """Contiguity of one session stream's event ids.

    ``feed(first, last)`` takes each event's span (``first == last`` but for a merged
    ``assistant_text``, which covers ``first_id``..``id``). Ids must follow on from the last one
    seen: a jump forward counts the skipped ids as lost, ids at or below the last one seen count
    as repeated.
    """

    __slots__ = ("last", "lost", "repeated")

    def __init__(self, after: int = 0) -> None:
        self.last = after
        self.lost = 0
        self.repeated = 0

    def feed(self, first: int, last: int) -> None:
        """Take one event's span of ids."""
        expected = self.last + 1
        if first != expected:
            if first > expected:
                self.lost += first - expected
            else:
                self.repeated += min(last, self.last) - first + 1
        if last > self.last:
            self.last = last


def check_ids(spans: Iterable[int | tuple[int, int]], after: int = 0) -> tuple[int, int]:
    """``(lost, repeated)`` for a stream of ids (or ``(first_id, id)`` spans) read after ``after``."""
    check = IdCheck(after)
    for span in spans:
        if isinstance(span, int):
            check.feed(span, span)
        else:
            check.feed(*span)
    return check.lost, check.repeated


class QueryFailed(Exception):
    """A query that did not end with ``done``; ``kind`` is how it is counted."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


def http_error(status: int, what: str) -> QueryFailed:
    """A refused request, counted by its status and route."""
    return QueryFailed(f"http {status} ({what})")


def error_kind(exc: BaseException) -> str:
    """How an exception is counted among the errors."""
    if isinstance(exc, QueryFailed):
        return exc.kind
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"connect error ({type(exc.os_error).__name__})"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "server disconnected"
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "connection broken mid-body"
    if isinstance(exc, aiohttp.WSServerHandshakeError):
        return f"http {exc.status} (GET /ws)"
    if isinstance(exc, aiohttp.ClientError | OSError):
        return f"connection error ({type(exc).__name__})"
    if isinstance(exc, ValueError | KeyError | TypeError):
        return f"bad response ({type(exc).__name__})"
    return f"client error ({type(exc).__name__}: {exc})"
