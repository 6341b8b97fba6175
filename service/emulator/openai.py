"""Renders a :class:`~service.emulator.steps.Plan` as an OpenAI chat-completions stream.

The emulator's ``POST /v1/chat/completions`` answers from the same wire-neutral plans as the
Bedrock route. :func:`bedrock_request` first rewrites the OpenAI request body into the
ConverseStream shape the script plans from (``tool`` messages become ``toolResult`` blocks,
``tools`` becomes ``toolConfig``, ``max_tokens`` becomes ``inferenceConfig.maxTokens``, the system
message becomes ``system``); :func:`render_plan` then turns the plan's steps into SSE ``data:``
lines, encoded ahead of time so that the streaming loop only writes bytes:

- the first chunk's delta is ``{"role": "assistant", "content": ""}``;
- a text token is ``delta.content``, a reasoning token ``delta.reasoning_content`` (as the
  Bedrock Access Gateway sends it; a reasoning signature has no OpenAI form and is left out);
- a tool use opens with ``delta.tool_calls: [{"index", "id", "type": "function", "function":
  {"name", "arguments": ""}}]``, then one ``{"index", "function": {"arguments": piece}}`` per
  input fragment; ``index`` counts tool calls, not content blocks;
- the stop is a chunk with an empty delta and ``finish_reason`` (``end_turn`` → ``stop``,
  ``tool_use`` → ``tool_calls``, ``max_tokens`` → ``length``, ``content_filtered`` →
  ``content_filter``, other reasons as they are);
- with ``stream_options.include_usage``, a usage chunk with ``choices: []``; then ``data: [DONE]``.

An OpenAI stream has no exception frame. A failure injected mid-stream (``[emu:throttle]``,
``[emu:fail=EXC]``, ``[emu:fail_after=K]``) is written the way the Bedrock Access Gateway writes
one: a last line ``data: {"error": {"message": "An error occurred (<code>) when calling the
ConverseStream operation: <message>"}}``, then the stream ends without ``[DONE]``.

Directives of this route only:

- ``[emu:no_done]``: no ``finish_reason``, no usage chunk, no ``[DONE]``: the stream just ends;
- ``[emu:bad_json]``: one malformed ``data:`` line right after the first token;
- ``[emu:disconnect]``: the connection is cut after ``fail_after`` tokens (default 3; with 0,
  before the first byte of the body).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from service.emulator.directives import DEFAULT_FAIL_AFTER, parse_directives
from service.emulator.steps import (
    EmitReasoning,
    EmitSignature,
    EmitText,
    EmitToolInput,
    HttpError,
    Plan,
    RaiseException,
    ReportUsage,
    StartMessage,
    StartToolUse,
    StopBlock,
    StopMessage,
    is_token,
)

CONTENT_TYPE = "text/event-stream"

# Bedrock's stop reasons in OpenAI's words; a reason not listed is written as it is.
FINISH_REASONS: dict[str, str] = {
    "end_turn": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "content_filtered": "content_filter",
}

_ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    429: "rate_limit_error",
}

# What the failed tool result text starts with on this wire (OpenAI's tool message has no status).
TOOL_ERROR_PREFIX = "Error: "


# --- the request -------------------------------------------------------------------------------


def _text(content: Any) -> str:
    """The text of an OpenAI message's content: a string, or a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [
            part.get("text", "")
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        ]
        return "\n".join(parts)
    return ""


def _tool_use(call: Any) -> dict[str, Any] | None:
    if not isinstance(call, dict):
        return None
    function = call.get("function") if isinstance(call.get("function"), dict) else {}
    arguments = function.get("arguments")
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) and arguments.strip() else {}
    except ValueError:
        parsed = {}
    return {
        "toolUse": {
            "toolUseId": str(call.get("id", "")),
            "name": str(function.get("name", "")),
            "input": parsed if isinstance(parsed, dict) else {},
        }
    }


def _tool_result(message: dict[str, Any]) -> dict[str, Any]:
    text = _text(message.get("content"))
    result: dict[str, Any] = {"toolUseId": str(message.get("tool_call_id", ""))}
    if text.startswith(TOOL_ERROR_PREFIX):
        result["status"] = "error"
        text = text[len(TOOL_ERROR_PREFIX) :]
    result["content"] = [{"text": text}]
    return {"toolResult": result}


def _append(messages: list[dict[str, Any]], role: str, blocks: list[dict[str, Any]]) -> None:
    # ConverseStream wants strict alternation; consecutive tool messages become one user message.
    if not blocks:
        return
    if messages and messages[-1]["role"] == role:
        messages[-1]["content"].extend(blocks)
    else:
        messages.append({"role": role, "content": list(blocks)})


def bedrock_request(body: Any) -> Any:
    """An OpenAI chat-completions request body in the ConverseStream shape the script plans from."""
    if not isinstance(body, dict):
        return body
    raw_messages = body.get("messages")
    if not isinstance(raw_messages, list):
        return {"messages": raw_messages}
    system: list[dict[str, Any]] = []
    messages: list[dict[str, Any]] = []
    for message in raw_messages:
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        if role in ("system", "developer"):
            text = _text(message.get("content"))
            if text:
                system.append({"text": text})
        elif role == "user":
            text = _text(message.get("content"))
            _append(messages, "user", [{"text": text}] if text else [])
        elif role == "assistant":
            text = _text(message.get("content"))
            blocks: list[dict[str, Any]] = [{"text": text}] if text else []
            blocks.extend(use for use in map(_tool_use, message.get("tool_calls") or []) if use)
            _append(messages, "assistant", blocks)
        elif role == "tool":
            _append(messages, "user", [_tool_result(message)])
    converted: dict[str, Any] = {"messages": messages}
    if system:
        converted["system"] = system
    tools = [
        {
            "toolSpec": {
                "name": tool["function"].get("name", ""),
                "description": tool["function"].get("description", ""),
                "inputSchema": {"json": tool["function"].get("parameters") or {}},
            }
        }
        for tool in body.get("tools") or []
        if isinstance(tool, dict) and isinstance(tool.get("function"), dict)
    ]
    if tools:
        converted["toolConfig"] = {"tools": tools}
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if isinstance(max_tokens, int) and not isinstance(max_tokens, bool):
        converted["inferenceConfig"] = {"maxTokens": max_tokens}
    return converted


# --- the answer --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Chunk:
    """One SSE line ready to write, or (``cut``) the point where the connection is dropped."""

    data: bytes
    is_token: bool = False
    cut: bool = False


@dataclass(frozen=True, slots=True)
class Rendering:
    """A plan's chunks, and how the stream ends: ``error_type`` is None for a complete answer."""

    chunks: tuple[Chunk, ...]
    error_type: str | None = None


def _line(payload: dict[str, Any] | str) -> bytes:
    text = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {text}\n\n".encode()


def error_line(exception_type: str, message: str) -> bytes:
    """The in-band error a gateway writes when the model fails mid-stream (no [DONE] follows)."""
    text = f"An error occurred ({exception_type}) when calling the ConverseStream operation: {message}"
    return _line({"error": {"message": text}})


def render_plan(
    plan: Plan, *, completion_id: str, model: str, created: int, include_usage: bool
) -> Rendering:
    """The SSE chunks of a whole plan, in order, with this route's directives applied."""
    directives = parse_directives(plan.user_text)
    no_done = "no_done" in directives
    bad_json = "bad_json" in directives
    cut_after: int | None = None
    if "disconnect" in directives:
        try:
            cut_after = max(0, int(directives.get("fail_after", DEFAULT_FAIL_AFTER)))
        except ValueError:
            cut_after = DEFAULT_FAIL_AFTER

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        return _line(
            {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
            }
        )

    chunks: list[Chunk] = []
    tool_indexes: dict[int, int] = {}  # content block index -> tool call index
    tokens = 0
    error_type: str | None = None
    for step in plan.steps:
        if cut_after is not None and tokens >= cut_after:
            chunks.append(Chunk(b"", cut=True))
            return Rendering(tuple(chunks), "disconnect")
        match step:
            case StartMessage(role=role):
                chunks.append(Chunk(chunk({"role": role, "content": ""})))
            case StartToolUse(index=index, tool_use_id=tool_use_id, name=name):
                position = tool_indexes.setdefault(index, len(tool_indexes))
                call = {
                    "index": position,
                    "id": tool_use_id,
                    "type": "function",
                    "function": {"name": name, "arguments": ""},
                }
                chunks.append(Chunk(chunk({"tool_calls": [call]})))
            case EmitText(text=text):
                chunks.append(Chunk(chunk({"content": text}), is_token=True))
            case EmitReasoning(text=text):
                chunks.append(Chunk(chunk({"reasoning_content": text}), is_token=True))
            case EmitToolInput(index=index, fragment=fragment):
                piece = {"index": tool_indexes.get(index, 0), "function": {"arguments": fragment}}
                chunks.append(Chunk(chunk({"tool_calls": [piece]}), is_token=True))
            case EmitSignature() | StopBlock():
                continue
            case StopMessage(stop_reason=stop_reason):
                if not no_done:
                    chunks.append(Chunk(chunk({}, FINISH_REASONS.get(stop_reason, stop_reason))))
            case ReportUsage(input_tokens=input_tokens, output_tokens=output_tokens):
                if include_usage and not no_done:
                    usage = {
                        "prompt_tokens": input_tokens,
                        "completion_tokens": output_tokens,
                        "total_tokens": input_tokens + output_tokens,
                    }
                    chunks.append(
                        Chunk(
                            _line(
                                {
                                    "id": completion_id,
                                    "object": "chat.completion.chunk",
                                    "created": created,
                                    "model": model,
                                    "choices": [],
                                    "usage": usage,
                                }
                            )
                        )
                    )
            case RaiseException(exception_type=exception_type, message=message):
                chunks.append(Chunk(error_line(exception_type, message)))
                return Rendering(tuple(chunks), exception_type)
            case _:
                raise TypeError(f"unknown plan step: {step!r}")
        if is_token(step):
            tokens += 1
            if bad_json and error_type is None:
                # Cut off mid-object, as a broken proxy would; the rest of the stream follows.
                chunks.append(Chunk(b'data: {"id":"' + completion_id.encode() + b'","choices":[{\n\n'))
                error_type = "bad_json"
    if no_done:
        return Rendering(tuple(chunks), "no_done")
    chunks.append(Chunk(_line("[DONE]")))
    return Rendering(tuple(chunks), error_type)


def error_response(error: HttpError) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and OpenAI-style JSON body of an error answered before any stream."""
    kind = _ERROR_TYPES.get(error.status, "server_error" if error.status >= 500 else "invalid_request_error")
    body = {"error": {"message": error.message, "type": kind, "code": error.error_type}}
    return error.status, {"Content-Type": "application/json"}, json.dumps(body).encode("utf-8")
