"""What a session's log holds, as JSON replies: polling pages (seed 004) and the body of a 410.

Shared by ``GET /sessions/{id}/events/poll``, the MCP ``session_events`` tool, and every route
that resumes by id (its 410 or ``events_purged`` error carries the snapshot to rebuild from).
"""

from __future__ import annotations

from typing import Any

from service import jsonsafe
from service.core.sessions import Session
from service.transports.edge.context import Context
from service.transports.stream.session import pending_approvals, pending_client_tools, session_payload


async def purged_body(context: Context, session: Session, after_id: int, oldest_id: int) -> dict[str, Any]:
    """The 410 body: which ids are gone, and a snapshot to rebuild from."""
    return {
        "error": f"events after id {after_id} were purged; the oldest kept is {oldest_id}",
        "oldest_id": oldest_id,
        "last_id": await session.log.last_id(),
        "snapshot": jsonsafe.jsonable(
            {
                **await context.runs.snapshot(session),
                "pending_approvals": pending_approvals(session),
                "pending_tool_calls": pending_client_tools(session),
            }
        ),
    }


class IndexAhead(ValueError):
    """A polling index past the session's last event id."""


async def poll(context: Context, session: Session, since: int, limit: int | None = None) -> dict[str, Any]:
    """Seed 004's polling: the events after ``since`` (at most ``limit``) and the next index.

    Shared by ``GET /sessions/{id}/events/poll`` and the MCP ``session_events`` tool. A
    ``since`` older than the oldest kept event starts at the oldest kept one, says so
    (``purged``) and adds a snapshot of what was lost.
    """
    limit = min(limit or context.settings.poll_max_events, context.settings.poll_max_events)
    log = session.log
    last = await log.last_id()
    if since > last:
        raise IndexAhead(f"since_index {since} is ahead of the session's last event id {last}")
    oldest = await log.first_id()
    entries = await log.read(since, limit, strict=False)
    body: dict[str, Any] = {
        "events": [session_payload(entry) for entry in entries],
        "next_index": entries[-1].id if entries else since,
        "status": session.status,
        "last_id": last,
        "oldest_id": oldest,
        "purged": since < oldest - 1,
    }
    if body["purged"]:
        body["snapshot"] = jsonsafe.jsonable(await context.runs.snapshot(session))
    return body
