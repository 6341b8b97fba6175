"""Traces through the WebSocket and MCP faces, against a real OTLP receiver
(tests/support/traces.py): a WebSocket message that starts work, and an MCP ``tools/call``, each
get a SERVER span continued from the ``traceparent`` in the message's ``_meta`` (the WebSocket:
else the upgrade request's header), and the query the message starts hangs under that span."""

from __future__ import annotations

import secrets
from typing import Any

from aiohttp.test_utils import TestClient

from tests.support.traces import ERROR, INTERNAL, SERVER, Received, Receiver, children, trace_of
from tests.transports.test_mcp import call, connect, mcp_sessions
from tests.transports.test_ws import is_done, receive, until


def traceparent() -> tuple[str, str, str]:
    """A client's trace id, span id, and the ``traceparent`` naming them (sampled)."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


def spans_of_trace(trace_id: str, count: int) -> Any:
    """A condition for :meth:`Receiver.wait_for`: the trace's spans once it has ``count``."""

    def found(spans: list[Received]) -> list[Received] | None:
        ours = trace_of(spans, trace_id)
        return ours if len(ours) >= count else None

    return found


def only(spans: list[Received], name: str) -> Received:
    (span,) = [span for span in spans if span.name == name]
    return span


async def received(receiver: Receiver, name: str) -> Received:
    """The one span named ``name``, once the receiver has it."""
    (span,) = await receiver.wait_for(lambda spans: receiver.named(name))
    return span


async def test_a_websocket_message_continues_the_trace_in_its_meta(
    traced: TestClient, receiver: Receiver
) -> None:
    trace_id, parent_id, header = traceparent()
    async with traced.ws_connect("/ws") as ws:
        await ws.send_json({"type": "create"})
        session_id = (await receive(ws))["session_id"]
        await ws.send_json({"type": "subscribe", "session_id": session_id})
        await until(ws, lambda frame: frame["type"] == "status_change")
        meta = {"traceparent": header, "tracestate": "rojo=00f067aa0ba902b7"}
        await ws.send_json(
            {"type": "message", "session_id": session_id, "content": "What is 17 * 3?", "_meta": meta}
        )
        frames = await until(ws, is_done)
    # The reply and the session's first events come on their own ways (on Redis, either first).
    assert "accepted" in [frame["type"] for frame in frames] and frames[-1]["turns"] == 2

    # The message's span, the query's, two model turns and the calculator: one trace, the client's.
    spans = await receiver.wait_for(spans_of_trace(trace_id, 5))
    message = only(spans, "WebSocket/message")
    assert (message.kind, message.parent_id) == (SERVER, parent_id)
    assert message.attributes == {
        "rpc.system.name": "websocket",
        "rpc.method": "WebSocket/message",
        "network.protocol.name": "websocket",
        "url.path": "/ws",
    }
    (agent,) = children(spans, message)
    assert (agent.name, agent.kind) == ("invoke_agent default", INTERNAL)
    assert agent.attributes["gen_ai.conversation.id"] == session_id
    assert [step.name.split()[0] for step in children(spans, agent)] == ["chat", "execute_tool", "chat"]

    # ``create`` started work too, in a trace of its own (no traceparent anywhere); reads get no span.
    created = await received(receiver, "WebSocket/create")
    assert created.kind == SERVER and created.parent_id == "" and created.trace_id != trace_id
    assert not [span for span in receiver.spans if span.name == "WebSocket/subscribe"]


async def test_a_message_without_a_traceparent_continues_the_sockets(
    traced: TestClient, receiver: Receiver
) -> None:
    trace_id, parent_id, header = traceparent()
    async with traced.ws_connect("/ws", headers={"traceparent": header}) as ws:
        # A ``_meta`` without a traceparent: the upgrade request's header is the parent.
        await ws.send_json({"type": "run", "message": "Hello [emu:tokens=3]", "_meta": {"progress": 1}})
        frames = await until(ws, is_done)
    assert frames[-1]["type"] == "done"
    spans = await receiver.wait_for(spans_of_trace(trace_id, 3))
    run = only(spans, "WebSocket/run")
    assert (run.kind, run.parent_id) == (SERVER, parent_id)
    (agent,) = children(spans, run)
    assert agent.name == "invoke_agent default"
    assert [step.name.split()[0] for step in children(spans, agent)] == ["chat"]


async def test_a_meta_that_is_not_an_object_is_refused(traced: TestClient, receiver: Receiver) -> None:
    async with traced.ws_connect("/ws") as ws:
        for meta in ("00-" + "1" * 32 + "-" + "2" * 16 + "-01", ["traceparent"], 5, None):
            await ws.send_json({"type": "create", "_meta": meta})
            frame = await receive(ws)
            assert frame["type"] == "error" and frame["code"] == "invalid", (meta, frame)
            assert frame["error"] == "_meta must be an object" and frame["request_type"] == "create"
        await ws.send_json({"type": "create", "_meta": {}})
        assert (await receive(ws))["type"] == "created"
    # A refusal is the client's mistake: the span says why, and is not a failure of the service.
    refused = await receiver.wait_for(
        lambda spans: [s for s in spans if s.name == "WebSocket/create" and "error.type" in s.attributes]
    )
    assert refused[0].attributes["error.type"] == "invalid" and refused[0].status != ERROR


async def test_an_mcp_tool_call_continues_the_trace_in_its_meta(
    traced: TestClient, receiver: Receiver
) -> None:
    trace_id, parent_id, header = traceparent()
    async with connect(traced) as mcp:
        result = await mcp.call_tool(
            "session_message", {"content": "What is 17 * 3?", "wait": True}, meta={"traceparent": header}
        )
        (mcp_session,) = mcp_sessions(traced)
    reply: dict[str, Any] = result.structured_content or {}
    assert not result.is_error and reply["done"]["turns"] == 2

    spans = await receiver.wait_for(spans_of_trace(trace_id, 5))
    tool_call = only(spans, "tools/call session_message")
    assert (tool_call.kind, tool_call.parent_id) == (SERVER, parent_id)
    assert tool_call.attributes["mcp.method.name"] == "tools/call"
    assert tool_call.attributes["gen_ai.operation.name"] == "execute_tool"
    assert tool_call.attributes["gen_ai.tool.name"] == "session_message"
    assert tool_call.attributes["mcp.session.id"] == mcp_session.id
    assert tool_call.status != ERROR
    (agent,) = children(spans, tool_call)
    assert agent.name == "invoke_agent default"
    assert agent.attributes["gen_ai.conversation.id"] == reply["session_id"]
    assert [step.name.split()[0] for step in children(spans, agent)] == ["chat", "execute_tool", "chat"]
    # The POST that carried the call is a link: the MCP call's context and its transport's differ.
    (post,) = await receiver.wait_for(
        lambda spans: [
            s for s in spans if s.name == "POST /mcp" and (s.trace_id, s.span_id) in tool_call.links
        ]
    )
    assert post.kind == SERVER


async def test_an_mcp_tool_call_without_meta_hangs_under_its_post(
    traced: TestClient, receiver: Receiver
) -> None:
    async with connect(traced) as mcp:
        session_id = (await call(mcp, "session_message", content="Hello [emu:tokens=3]"))["session_id"]
        failed = await mcp.call_tool("session_status", {"session_id": "nope"})
    assert failed.is_error

    def query(spans: list[Received]) -> list[Received]:
        return [s for s in spans if s.attributes.get("gen_ai.conversation.id") == session_id and s.parent_id]

    (agent,) = await receiver.wait_for(query)
    spans = trace_of(receiver.spans, agent.trace_id)
    tool_call = only(spans, "tools/call session_message")
    assert agent.parent_id == tool_call.span_id and tool_call.links == []
    (post,) = await receiver.wait_for(lambda spans: [s for s in spans if s.span_id == tool_call.parent_id])
    assert (post.name, post.kind, post.parent_id) == ("POST /mcp", SERVER, "")
    # A tool's failure is a result with isError; its span is marked as the conventions say.
    status = await received(receiver, "tools/call session_status")
    assert status.status == ERROR and status.attributes["error.type"] == "tool_error"
