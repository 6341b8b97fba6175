"""Reading a ConverseStream request body: its prompt, tool results, tool specs and input size."""

from __future__ import annotations

import json
from typing import Any

# A flat charge per tool spec stands in for the tokens its JSON schema would cost.
TOKENS_PER_TOOL_SPEC = 50


def content_blocks(message: Any) -> list[dict[str, Any]]:
    """The content blocks of one message; none for anything malformed."""
    if not isinstance(message, dict):
        return []
    content = message.get("content")
    if isinstance(content, str):
        # Tolerated for hand-written requests; the real API always sends a list of blocks.
        return [{"text": content}]
    if not isinstance(content, list):
        return []
    return [block for block in content if isinstance(block, dict)]


def _text_of(blocks: list[dict[str, Any]]) -> str:
    return " ".join(b["text"] for b in blocks if isinstance(b.get("text"), str))


def tool_results(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``toolResult`` payloads among ``blocks``."""
    return [b["toolResult"] for b in blocks if isinstance(b.get("toolResult"), dict)]


def tool_result_text(result: dict[str, Any]) -> str:
    """A tool result's content as one line of text (JSON items compactly encoded)."""
    parts: list[str] = []
    for item in result.get("content") or []:
        if not isinstance(item, dict):
            continue
        if isinstance(item.get("text"), str):
            parts.append(item["text"])
        elif "json" in item:
            parts.append(json.dumps(item["json"], separators=(",", ":")))
    return " ".join(parts).strip()


def user_prompt(messages: list[Any]) -> str:
    """Text of the latest user message that carries text (the prompt of the current query)."""
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            text = _text_of(content_blocks(message))
            if text.strip():
                return text
    return ""


def count_input_tokens(body: dict[str, Any]) -> int:
    """A deterministic input-token count: words in every text, plus a flat cost per tool spec."""
    words = 0
    for block in body.get("system") or []:
        if isinstance(block, dict) and isinstance(block.get("text"), str):
            words += len(block["text"].split())
    for message in body.get("messages") or []:
        for block in content_blocks(message):
            if isinstance(block.get("text"), str):
                words += len(block["text"].split())
            elif isinstance(block.get("toolResult"), dict):
                words += len(tool_result_text(block["toolResult"]).split())
            elif isinstance(block.get("toolUse"), dict):
                words += len(json.dumps(block["toolUse"].get("input", {})).split())
    tools = ((body.get("toolConfig") or {}).get("tools")) or []
    return words + TOKENS_PER_TOOL_SPEC * len(tools)


def system_text(body: dict[str, Any]) -> str:
    """The request's system prompt: the texts of its ``system`` blocks, joined by a blank line."""
    blocks = body.get("system")
    if not isinstance(blocks, list):
        return ""
    return "\n\n".join(b["text"] for b in blocks if isinstance(b, dict) and isinstance(b.get("text"), str))


def tool_names(body: dict[str, Any]) -> set[str]:
    """Names of the tools the request offers."""
    names: set[str] = set()
    config = body.get("toolConfig")
    tools = config.get("tools") if isinstance(config, dict) else None
    for tool in tools if isinstance(tools, list) else []:
        spec = tool.get("toolSpec") if isinstance(tool, dict) else None
        if isinstance(spec, dict) and isinstance(spec.get("name"), str):
            names.add(spec["name"])
    return names
