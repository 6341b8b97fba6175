"""The service's exceptions, one base class per layer.

::

    AgentStreamError
     ├── ProviderError          the model upstream failed (before or inside the stream)
     │    └── ModelStreamError  an exception event that arrived inside the stream
     ├── EventsPurged           a reader asked for events the log no longer keeps
     ├── SessionNotFound        no such session (or not the caller's)
     ├── SessionExists          a client-chosen session id is already taken
     ├── RunInProgress          a session already runs a query
     ├── ApprovalError          a tool approval cannot be answered so
     │    ├── ApprovalNotFound     no such approval in the session (404)
     │    ├── ApprovalConflict     answered otherwise already, or its query ended (409)
     │    │    └── ApprovalsUnanswered  a turn's answers leave some of its approvals out (409)
     │    └── ApprovalInputInvalid an edited input that the tool's schema refuses (422)
     ├── ConversationError      a message of the conversation cannot be used so (a 4xx)
     │    ├── MessageNotFound      no message of that id in the session (404)
     │    ├── ClientToolError      a client tool's result that cannot be taken (409)
     │    │    └── ClientToolNotFound  no such call in the session (404)
     │    └── ClientToolsInvalid   client tools that cannot be offered (422)
     │         └── ClientToolsRefused  the session's agent takes no client tools (422)
     ├── Overloaded             the instance runs as many queries as it may
     │    └── StreamLimitReached  it holds as many open streams as it may
     ├── SessionLimitReached    the instance holds as many sessions as it may
     ├── QuotaExceeded          an API key is over one of its quotas (429)
     ├── StoreUnavailable       the shared store (Redis) cannot be reached
     │    └── DatabaseUnavailable  the session database cannot be reached, or missed its deadline
     ├── RunLost                a run's claim on its session expired (another instance ended it)
     ├── UnknownAgent           no agent of that name is defined (422)
     └── AgentMismatch          a session is asked for with an agent other than its own (409)

Transports map these to HTTP statuses; the agent loop turns provider errors into ``error``
events. Nothing here imports a transport or a provider. :func:`describe_exception` is how the
tool executor and the worker sandbox put any exception into one line for the model or the log.
"""

from __future__ import annotations


class AgentStreamError(Exception):
    """Base of every error this service raises on purpose."""


class ProviderError(AgentStreamError):
    """The model provider failed; ``code`` is the upstream error code."""

    def __init__(self, message: str, *, code: str = "provider_error", retryable: bool = False):
        super().__init__(message)
        self.message = message
        self.code = code
        self.retryable = retryable


class ModelStreamError(ProviderError):
    """An exception event inside a model's response stream (throttling, model error, ...)."""


class EventsPurged(AgentStreamError):
    """The events after ``after_id`` are no longer kept; ``oldest_id`` is the first one left."""

    def __init__(self, after_id: int, oldest_id: int):
        super().__init__(f"events after id {after_id} were purged; the oldest kept is {oldest_id}")
        self.after_id = after_id
        self.oldest_id = oldest_id


class SessionNotFound(AgentStreamError):
    """No session with that id."""


class SessionExists(AgentStreamError):
    """A session with the id a client chose exists already."""


class RunInProgress(AgentStreamError):
    """The session already runs a query."""


class ApprovalError(AgentStreamError):
    """A tool approval cannot be answered as asked; ``status`` is the HTTP status that says why,
    ``code`` the WebSocket error code."""

    status = 400
    code = "invalid"


class ApprovalNotFound(ApprovalError):
    """The session has no approval with that id."""

    status = 404
    code = "not_found"


class ApprovalConflict(ApprovalError):
    """The approval was answered otherwise already, or its query ended before it was answered."""

    status = 409
    code = "conflict"


class ApprovalsUnanswered(ApprovalConflict):
    """Answers to some of a turn's approvals sent as the whole turn's (a protocol's resume), with
    others of that turn still pending: ``unanswered`` names them."""

    code = "unanswered"

    def __init__(self, unanswered: list[str]) -> None:
        super().__init__(
            f"every approval the query waits on must be answered together; unanswered: {', '.join(unanswered)}"
        )
        self.unanswered = unanswered


class ApprovalInputInvalid(ApprovalError):
    """An answer of the wrong shape, or an edited input that the tool's input schema refuses."""

    status = 422


class ConversationError(AgentStreamError):
    """A regenerate, an edit or a client tool's result that the conversation cannot take:
    ``status`` is the HTTP status that says why, ``code`` the WebSocket error code."""

    status = 409
    code = "conflict"


class MessageNotFound(ConversationError):
    """The session's conversation holds no message of that id (or not one of the kind asked)."""

    status = 404
    code = "message_not_found"


class ClientToolError(ConversationError):
    """A client tool's result that cannot be taken: its call has its result already, or its query
    ended, or the request leaves some of the calls the query waits on unanswered (409)."""


class ClientToolNotFound(ClientToolError):
    """The session has no client tool call of that id."""

    status = 404
    code = "not_found"


class ClientToolsInvalid(ConversationError):
    """Client tools that cannot be offered: a name given twice, or one of the service's own."""

    status = 422
    code = "invalid_tools"


class ClientToolsRefused(ClientToolsInvalid):
    """Client tools sent to a session whose agent is defined with ``client_tools = false``."""

    code = "client_tools_refused"


class Overloaded(AgentStreamError):
    """The instance already runs as many queries as it is configured for."""


class StreamLimitReached(Overloaded):
    """The instance holds as many open streams as it is configured for (``AGENT_MAX_STREAMS``)."""


class SessionLimitReached(AgentStreamError):
    """The instance holds as many sessions as it is configured for."""


class QuotaExceeded(AgentStreamError):
    """An owner (API key) is over one of its quotas: ``quota`` names it, ``limit`` is its value,
    ``retry_after`` the whole seconds until it may succeed again."""

    def __init__(self, message: str, *, quota: str, limit: int, retry_after: int) -> None:
        super().__init__(message)
        self.message = message
        self.quota = quota
        self.limit = limit
        self.retry_after = retry_after


class StoreUnavailable(AgentStreamError):
    """The shared store (Redis) cannot be reached right now; the request may be retried."""


class DatabaseUnavailable(StoreUnavailable):
    """The session database did not answer (down, or past ``AGENT_DATABASE_DEADLINE_S``); a
    :class:`StoreUnavailable`, so every caller that copes with a store outage copes with it, but
    named apart so that the reply says which part failed."""


class RunLost(AgentStreamError):
    """A run no longer holds its session: its claim expired and the run was declared interrupted."""


def describe_exception(exc: BaseException) -> str:
    """``"Type: message"`` for any exception (the type alone without a message); never raises."""
    try:
        message = str(exc)
    except Exception:  # noqa: BLE001 - a broken __str__ must not break the caller's report
        message = ""
    name = type(exc).__name__
    return f"{name}: {message}" if message else name


class UnknownAgent(AgentStreamError):
    """No agent of that name is defined (a 422 that names the ones there are)."""

    status = 422
    code = "unknown_agent"

    def __init__(self, name: str, known: list[str]) -> None:
        super().__init__(f"unknown agent {name!r}; this service has: {', '.join(known)}")
        self.name = name
        self.known = known


class AgentMismatch(AgentStreamError):
    """A request names an agent for a session made for another: a session keeps its agent for
    life, so the request is refused (a 409 naming the session's agent) rather than answered by an
    agent the client did not ask for."""

    status = 409
    code = "agent_mismatch"

    def __init__(self, name: str, bound: str) -> None:
        super().__init__(
            f"this session is bound to the agent {bound!r}, not {name!r}; a session keeps its agent"
        )
        self.name = name
        self.bound = bound
