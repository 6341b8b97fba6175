"""Ask the agent a question over ``POST /agent/stream`` and print its work as it happens.

    python scripts/stream_client.py "What is the square root of 144?"
    python scripts/stream_client.py --url http://127.0.0.1:8080 --max-turns 5 "Tell me a story"

Tokens are printed as they arrive, tool calls and results as they happen, then the totals.
Only the standard library is used, so it runs anywhere Python 3.11 does.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

# The checkout's SSE reader: standard library only, like this script.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from service.loadtest.sse import iter_events  # noqa: E402


def events(url: str, message: str, max_turns: int | None, api_key: str | None) -> Iterator[dict[str, Any]]:
    """POST the question and yield each ``data:`` payload of the SSE reply."""
    body: dict[str, Any] = {"message": message}
    if max_turns is not None:
        body["max_turns"] = max_turns
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(
        url.rstrip("/") + "/agent/stream", data=json.dumps(body).encode(), headers=headers, method="POST"
    )
    with urllib.request.urlopen(request) as response:
        for _, _, data in iter_events(response):
            yield json.loads(data)


def show(event: dict[str, Any], out: TextIO) -> None:
    """Print one event the way a person wants to read it."""
    kind = event.get("type")
    if kind == "text_delta":
        out.write(event["text"])
    elif kind == "tool_use_start":
        out.write(f"\n[tool {event['tool']} ({event['id']})] input: ")
    elif kind == "tool_input_delta":
        out.write(event["delta"])
    elif kind == "tool_executing":
        out.write(f"\n[running {event['tool']}...]")
    elif kind == "tool_result":
        mark = "failed" if event.get("is_error") else "->"
        out.write(f"\n[{event['tool']} {mark} {event['result']}]\n")
    elif kind == "done":
        usage = event.get("usage", {})
        notes = [name for name in ("truncated", "max_turns_reached", "cancelled") if event.get(name)]
        out.write(
            f"\n\n-- done in {event['turns']} turn(s), {len(event.get('tool_calls', []))} tool call(s), "
            f"{usage.get('input_tokens', 0)} in / {usage.get('output_tokens', 0)} out tokens"
            + (f" ({', '.join(notes)})" if notes else "")
            + "\n"
        )
    elif kind == "error":
        out.write(f"\n\n-- error after {event.get('turns', 0)} turn(s): {event['error']}\n")
    out.flush()


def main(argv: list[str] | None = None) -> int:
    """Command line entry point; exit status 1 when the run ended in an error."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("message", help="the question")
    parser.add_argument("--url", default="http://127.0.0.1:8080", help="where the service listens")
    parser.add_argument("--max-turns", type=int, default=None)
    parser.add_argument("--api-key", default=None, help="sent as a Bearer token when the service wants one")
    args = parser.parse_args(argv)
    last = None
    try:
        for event in events(args.url, args.message, args.max_turns, args.api_key):
            show(event, sys.stdout)
            last = event
    except urllib.error.HTTPError as error:
        print(f"HTTP {error.code}: {error.read().decode(errors='replace')}", file=sys.stderr)
        return 1
    except urllib.error.URLError as error:
        print(f"cannot reach {args.url}: {error.reason}", file=sys.stderr)
        return 1
    return 0 if last is not None and last.get("type") == "done" else 1


if __name__ == "__main__":
    raise SystemExit(main())
