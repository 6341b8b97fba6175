"""The AG-UI face's part of ``GET /openapi.json``: ``/ag-ui`` (and ``/ag-ui/{agent}``) and its
events again.

The schemas are ``ag-ui-protocol``'s own ``RunAgentInput`` and event union, named ``AgUi...`` so
that they cannot meet the service's own.
"""

from __future__ import annotations

import functools
from typing import Any

from ag_ui.core import Event as AgUiEvent
from ag_ui.core import RunAgentInput
from pydantic import TypeAdapter

from service.config import Settings
from service.transports.edge.openapi import (
    CLIENT_ID,
    JSON,
    LAST_EVENT_ID,
    Fragment,
    Parts,
    ref,
    resume_errors,
    sse,
    start_errors,
)

AG_UI_REF = "#/components/schemas/AgUi{model}"


@functools.cache
def _generated() -> dict[str, Any]:
    inputs: list[tuple[int, Any, TypeAdapter[Any]]] = [
        (0, "validation", TypeAdapter(RunAgentInput)),
        (1, "serialization", TypeAdapter(AgUiEvent)),
    ]
    tops, definitions = TypeAdapter.json_schemas(inputs, ref_template=AG_UI_REF)
    found = {f"AgUi{name}": schema for name, schema in definitions.get("$defs", {}).items()}
    found["AgUiEvent"] = tops[(1, "serialization")]
    return found


def schemas() -> dict[str, Any]:
    """The schemas these operations name, to add to ``components.schemas``."""
    return dict(_generated())


def _run(parts: Parts) -> dict[str, Any]:
    return {
        "operationId": "agUiRun",
        "summary": "Run the agent (AG-UI)",
        "description": (
            "A `RunAgentInput`; `threadId` names the caller's session (1 to 128 of "
            "`A-Za-z0-9_-`), made on first use (of the default agent). Either the last message "
            "is the user's and is the new query (its `id`, 1 to 128 characters, is kept as the "
            "message's; an id the thread holds already edits that message: the "
            "conversation is cut back to before it), or the last messages are "
            "`role: tool` results of the client tool calls the thread's query waits on "
            "(all of them: 409 naming those left out, 404 an unknown call, 409 one "
            "answered already), and the run streams the rest of that query; or "
            "`resume` answers its approval interrupts. `tools` are the client's own "
            "tools (`parameters` their input schema; 422 for a service tool's name or "
            "one given twice, or for any when the thread's agent takes none: "
            "`client_tools_refused`): a call of one ends the run with `RUN_FINISHED` "
            "`outcome: {type: success, pendingToolCallIds}` while the query waits. "
            "`forwardedProps.multitask_strategy` (`reject`, the default: 409 while a "
            "query runs; `enqueue`: 429 past `AGENT_MAX_QUEUED`; `interrupt`; "
            "`rollback`) says what it does while a query runs. `context` and `state` "
            "are accepted and not read. Message ids are stable across runs: each "
            "`MESSAGES_SNAPSHOT` names the messages as the stream did. Each event has "
            "the log's id as `id:`."
        ),
        "requestBody": {"required": True, "content": {JSON: {"schema": ref("AgUiRunAgentInput")}}},
        "responses": {
            "200": sse("The run's AG-UI events.", "AgUiEvent"),
            **start_errors(parts.common),
        },
    }


def paths(settings: Settings, parts: Parts) -> dict[str, Any]:
    """AG-UI's operations, by path."""
    nothing_runs = {"description": "No query runs in the session: nothing to resume."}
    by_agent = {
        **_run(parts),
        "operationId": "agUiRunAgent",
        "summary": "Run a named agent (AG-UI)",
        "description": (
            "As `POST /ag-ui`, with the thread made on first use for the agent the path names "
            "(one of `GET /agents`: an `HttpAgent` per agent URL). An unknown agent is a 422 "
            "`unknown_agent` listing the agents there are; a thread made for another agent is a "
            "409 `agent_mismatch` (a thread keeps its agent; `POST /ag-ui` continues it with it)."
        ),
    }
    return {
        "/ag-ui": {"post": _run(parts)},
        "/ag-ui/{agent}": {
            "parameters": [
                {
                    "name": "agent",
                    "in": "path",
                    "required": True,
                    "description": "An agent's name (`GET /agents`).",
                    "schema": {"type": "string", "minLength": 1, "maxLength": 64},
                }
            ],
            "post": by_agent,
        },
        "/ag-ui/{session_id}/events": {
            "parameters": [CLIENT_ID],
            "get": {
                "operationId": "agUiEvents",
                "summary": "Resume a thread's running query (AG-UI events)",
                "description": "The running query's events from its first (or after `Last-Event-ID`); 204 when none runs.",
                "parameters": [LAST_EVENT_ID],
                "responses": {
                    "200": sse("The running query's AG-UI events.", "AgUiEvent"),
                    "204": nothing_runs,
                    **resume_errors(parts.common),
                },
            },
        },
    }


FRAGMENT = Fragment(paths, schemas=schemas)
