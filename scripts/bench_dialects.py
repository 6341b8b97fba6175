"""Benchmark: one live answer fanned out to many subscribers, in each protocol the service speaks.

    python scripts/bench_dialects.py                          # 200 subscribers, 3 rounds
    python scripts/bench_dialects.py --subscribers 500 --rounds 5 --json
    python scripts/bench_dialects.py --baseline main          # ... and the service as of main, alternating
    python scripts/bench_dialects.py --dialects ai_sdk ag_ui openai --baseline main

The emulator, the service and this client in their own processes (``benchlib.stack``). Per round
and per dialect, one session answers a paced query (``--tokens`` at ``--tps``, after a first-token
wait that lets every subscriber connect: the query's text carries ``[emu:tokens=N] [emu:tps=R]
[emu:ttft=MS]``, the emulator's directives) while ``--subscribers`` clients follow it from its first
event to its end:

- ``session``: ``GET /sessions/{id}/events`` (``Last-Event-ID: 0``), the service's own dialect;
- ``ai_sdk``: ``GET /api/chat/{id}/stream``, the Vercel AI SDK's UI message stream (``useChat``'s
  resume, which replays the running query from its first event, then follows it);
- ``ag_ui``: ``GET /ag-ui/{id}/events``, AG-UI's events, the same way;
- ``responses``: OpenAI's Responses API. The query is a background response (``POST
  /v1/responses`` with ``"background": true``, the same paced query as its ``input``), and every
  subscriber follows it with ``GET /v1/responses/{id}?stream=true`` from its first event
  (``response.created``) to its end: ``response.completed``, after which the service ends the
  body (read to its end, so the finished response that event carries is counted). A background
  response's ``POST`` answers at once; the other fanned-out dialects start their query with the
  AI SDK's ``POST /api/chat``, whose own stream of the answer is one reader more (about
  ``1 / --subscribers`` of their figure);
- ``openai``: ``POST /v1/chat/completions`` with ``"stream": true`` (the model id from
  ``GET /v1/models``). OpenAI's stream cannot be fanned out: each request runs its own query in a
  short-lived session. So this dialect sends ``--subscribers`` such requests at once, each with
  the same paced query (the same directives, so every stream starts after the same first-token
  wait and runs at the same pace as one fanned-out answer), each read to its end. Its figure
  therefore includes running ``--subscribers`` queries (a model call each, the agent loop, the
  log), not only writing the streams: compare it with itself, before and after a change
  (``--baseline``), rather than with the fanned-out dialects. So that the service admits them all
  at once, the stack's ``AGENT_MAX_CONCURRENT_RUNS`` is raised to ``max(256, --subscribers)``
  when this dialect runs (the per-key quotas are already off in every benchmark,
  ``benchlib.procs.NO_QUOTAS``).

Two figures per dialect, both the service's CPU (user + system, ``/proc/<pid>/stat``) over the
round divided by what was delivered:

- ``cpu_us_per_event``: per *log event* delivered to one subscriber. Fanned out: the query's log
  events (its session's last event id) times the subscribers, so that dialects that write a
  different number of frames per event compare on what they carry. ``openai``: the sum over the
  streams of their query's log events, read from each stream: its last ``id:`` line, on the
  finish chunk, is the id of its query's last log event (``done``).
- ``cpu_us_per_text_delta``: per *text delta* delivered (one token: delta merging is off).
  Fanned out: the ``assistant_text`` events in the session's log (read after the round) times the
  subscribers. ``openai``: the chunks whose ``delta`` holds ``content``, counted in every stream
  (the opening chunk, ``{"role": "assistant", "content": ""}``, is not one: it is taken off).

And each dialect's ratio to the session dialect (per log event). Dialects take turns within each
round; medians over rounds.

``--baseline GIT_REF`` also starts the service as of GIT_REF (``baseline``: a temporary ``git
worktree``, the same venv, the same emulator, the same settings) beside this tree's (``current``);
in every round each dialect runs against current, then against baseline. Added per dialect: the
baseline's figures and, for both CPU figures, the *speed ratio* baseline CPU / current CPU, above 1
when the current tree is cheaper (``benchlib.baseline``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib.api import client_session, poll_all, wait_idle  # noqa: E402
from benchlib.baseline import BASELINE, CURRENT, legend, trees, versus  # noqa: E402
from benchlib.procs import Meter, raise_open_file_limit  # noqa: E402
from benchlib.stack import ServiceStack  # noqa: E402

from service.loadtest.sse import MarkCounter  # noqa: E402

ENV = {"AGENT_MAX_SESSIONS": "100000", "AGENT_MERGE_DELTAS_AFTER": "1000000", "AGENT_DATABASE_URL": ""}
# The fanned-out dialects: the route a subscriber follows, its headers, the mark of its end.
DIALECTS = {
    "session": ("/sessions/{id}/events", {"Last-Event-ID": "0"}, b"event: done"),
    "ai_sdk": ("/api/chat/{id}/stream", {}, b"data: [DONE]"),
    "ag_ui": ("/ag-ui/{id}/events", {}, b'"type":"RUN_FINISHED"'),
    # {id} is the response's id here, not the session's.
    "responses": ("/v1/responses/{id}?stream=true", {}, b"event: response.completed"),
}
RESPONSES = "responses"
OPENAI = "openai"
ALL_DIALECTS = [*DIALECTS, OPENAI]
CONTENT = b'"content":'  # in a chat.completion.chunk's delta: text (as compact JSON or not)
ID_LINE = re.compile(rb"(?m)^id: ?(\d+)\r?$")
TAIL = 4096  # the end of an OpenAI stream kept to find its last id: (the finish chunk, [DONE])
CPU_FIGURES = ["cpu_us_per_event", "cpu_us_per_text_delta"]


def query_text(args: argparse.Namespace) -> str:
    """The paced query: the emulator's directives set its tokens, their rate and the first-token wait."""
    return f"go [emu:tokens={args.tokens}] [emu:tps={args.tps}] [emu:ttft={args.ttft_ms}]"


async def follow(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str], end: bytes, to_eof: bool = False
) -> int:
    """Read one stream until its end mark (and on to the end of the body with ``to_eof``); the
    bytes read."""
    read = 0
    seen = False
    async with http.get(url, headers=headers) as response:
        if response.status != 200:
            raise RuntimeError(f"{url}: HTTP {response.status}")
        tail = b""
        async for chunk in response.content.iter_any():
            read += len(chunk)
            seen = seen or end in tail + chunk
            if seen and not to_eof:
                return read
            tail = chunk[-64:]
    if not seen:
        raise RuntimeError(f"{url}: ended without {end!r}")
    return read


async def start_chat(http: aiohttp.ClientSession, url: str, text: str, session_id: str) -> Any:
    """The query started on the AI SDK's route, on a session of the client's choosing (made on
    first use); the route's own stream of it, to read to its end once the subscribers are done."""
    body = {
        "id": session_id,
        "messages": [{"id": "u1", "role": "user", "parts": [{"type": "text", "text": text}]}],
        "trigger": "submit-message",
    }
    starter = await http.post(url + "/api/chat", json=body)
    if starter.status != 200:
        raise RuntimeError(f"POST /api/chat: HTTP {starter.status} {await starter.text()}")
    return starter


async def start_response(http: aiohttp.ClientSession, url: str, text: str, model: str) -> tuple[str, str]:
    """A background response of the query, in a session of its own: its id and its session's."""
    body = {"model": model, "input": text, "background": True}
    async with http.post(url + "/v1/responses", json=body) as response:
        reply = await response.json()
        if response.status != 200:
            raise RuntimeError(f"POST /v1/responses: HTTP {response.status} {reply}")
    return reply["id"], reply["session_id"]


async def model_of(http: aiohttp.ClientSession, url: str) -> str:
    """The model id the service answers as (the OpenAI faces want it in every request)."""
    async with http.get(url + "/v1/models") as response:
        return (await response.json())["data"][0]["id"]


async def one_round(
    args: argparse.Namespace, http: aiohttp.ClientSession, stack: ServiceStack, name: str
) -> dict[str, float]:
    """One fanned-out dialect: a paced query followed by every subscriber."""
    path, headers, end = DIALECTS[name]
    # Out of the measure: the model id a response is asked of.
    model = await model_of(http, stack.url) if name == RESPONSES else ""
    # Chosen by the client on the AI SDK's route; a response makes a session of its own instead.
    session_id = f"bench-{name}-{id(args)}-{asyncio.get_running_loop().time():.0f}"[:120].replace(".", "-")
    starter = None
    with Meter(stack.pid) as meter:
        if name == RESPONSES:
            followed, session_id = await start_response(http, stack.url, query_text(args), model)
        else:
            followed = session_id
            starter = await start_chat(http, stack.url, query_text(args), session_id)
        url = stack.url + path.format(id=followed)
        readers = [
            asyncio.create_task(follow(http, url, headers, end, to_eof=name == RESPONSES))
            for _ in range(args.subscribers)
        ]
        read = await asyncio.gather(*readers)
        if starter is not None:
            await starter.read()
            starter.release()
        last_id = await wait_idle(http, stack.url, session_id)
    events = last_id  # the session holds this one query: its events are ids 1..last_id
    # Read after the round, out of the measure: how many of the events carried text.
    deltas = sum(event["type"] == "assistant_text" for event in await poll_all(http, stack.url, session_id))
    return {
        "cpu_us_per_event": meter.server_cpu / (events * args.subscribers) * 1e6,
        "cpu_us_per_text_delta": meter.server_cpu / max(1, deltas * args.subscribers) * 1e6,
        "bytes_per_event": statistics.mean(read) / events,
        "events": events,
    }


async def openai_stream(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[int, int, int]:
    """One streamed chat completion read to its end: (bytes, text deltas, its query's log events)."""
    read = 0
    deltas = MarkCounter(CONTENT)
    texts = 0
    head = tail = b""
    async with http.post(url + "/v1/chat/completions", json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"POST /v1/chat/completions: HTTP {response.status} {await response.text()}")
        # To the end of the body, not just [DONE]: the service forgets the short-lived session
        # before it ends the response, and that is part of the cost.
        async for chunk in response.content.iter_any():
            read += len(chunk)
            texts += deltas.feed(chunk)
            tail = (tail + chunk)[-TAIL:]
            if len(head) < TAIL:
                head += chunk
    if b"data: [DONE]" not in tail:
        raise RuntimeError(f"POST /v1/chat/completions: the stream ended without [DONE]: {tail[-300:]!r}")
    opening = head.split(b"\n\n", 1)[0].split(b"\r\n\r\n", 1)[0]  # the role chunk, no text
    texts -= opening.count(CONTENT)
    if texts <= 0:
        raise RuntimeError(f"POST /v1/chat/completions: no text delta in the stream: {head[:600]!r}")
    ids = ID_LINE.findall(tail)
    if not ids:
        raise RuntimeError(
            f"POST /v1/chat/completions: no id: line at the end of the stream: {tail[-300:]!r}"
        )
    return read, texts, int(ids[-1])


async def openai_round(
    args: argparse.Namespace, http: aiohttp.ClientSession, stack: ServiceStack
) -> dict[str, float]:
    """``--subscribers`` streamed chat completions at once, each its own paced query."""
    model = await model_of(http, stack.url)
    body = {"model": model, "stream": True, "messages": [{"role": "user", "content": query_text(args)}]}
    with Meter(stack.pid) as meter:
        streams = await asyncio.gather(
            *(openai_stream(http, stack.url, body) for _ in range(args.subscribers))
        )
    events = sum(events for _, _, events in streams)
    deltas = sum(texts for _, texts, _ in streams)
    return {
        "cpu_us_per_event": meter.server_cpu / events * 1e6,
        "cpu_us_per_text_delta": meter.server_cpu / max(1, deltas) * 1e6,
        "bytes_per_event": sum(read for read, _, _ in streams) / events,
        "events": statistics.median(events for _, _, events in streams),
    }


def summarize(rounds: list[dict[str, float]]) -> dict[str, Any]:
    """One dialect's medians over rounds (and each round's CPU per log event)."""
    return {
        "cpu_us_per_event": round(statistics.median(r["cpu_us_per_event"] for r in rounds), 3),
        "cpu_us_per_text_delta": round(statistics.median(r["cpu_us_per_text_delta"] for r in rounds), 3),
        "bytes_per_event": round(statistics.median(r["bytes_per_event"] for r in rounds), 1),
        "events_per_query": statistics.median(r["events"] for r in rounds),
        "rounds": [round(r["cpu_us_per_event"], 3) for r in rounds],
    }


async def run(args: argparse.Namespace, sources: dict[str, Path]) -> dict[str, Any]:
    raise_open_file_limit(args.subscribers * 2 + 1024)
    env = dict(ENV)
    if OPENAI in args.dialects:
        # Every OpenAI stream is a run of its own, all at once: the instance-wide bound must admit them.
        env["AGENT_MAX_CONCURRENT_RUNS"] = str(max(256, args.subscribers))
    results = {tree: {name: [] for name in args.dialects} for tree in sources}
    async with contextlib.AsyncExitStack() as exits:
        stacks = {
            tree: await exits.enter_async_context(ServiceStack(env, source=source))
            for tree, source in sources.items()
        }
        http = await exits.enter_async_context(client_session(total=600))
        for _ in range(args.rounds):
            for name in args.dialects:
                for tree, stack in stacks.items():
                    if name == OPENAI:
                        figures = await openai_round(args, http, stack)
                    else:
                        figures = await one_round(args, http, stack, name)
                    results[tree][name].append(figures)
    summary: dict[str, Any] = {"subscribers": args.subscribers, "tokens": args.tokens, "rounds": args.rounds}
    for name, rounds in results[CURRENT].items():
        summary[name] = summarize(rounds)
    if "session" in summary:
        base = summary["session"]["cpu_us_per_event"]
        for name in args.dialects:
            summary[name]["over_session"] = round(summary[name]["cpu_us_per_event"] / base, 3)
    if BASELINE in results:
        for name, rounds in results[BASELINE].items():
            summary[name][BASELINE] = summarize(rounds)
            summary[name]["vs_baseline"] = versus(summary[name], summary[name][BASELINE], costs=CPU_FIGURES)
        summary[BASELINE] = legend(args.baseline)
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--subscribers", type=int, default=200, help="per round: followers, or OpenAI requests"
    )
    parser.add_argument("--tokens", type=int, default=300)
    parser.add_argument("--tps", type=float, default=100.0)
    parser.add_argument("--ttft-ms", type=int, default=2000, help="time for every subscriber to connect")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dialects", nargs="+", choices=ALL_DIALECTS, default=ALL_DIALECTS)
    parser.add_argument(
        "--baseline", metavar="GIT_REF", help="also run every dialect against the service as of this ref"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if OPENAI in args.dialects and args.subscribers > 10_000:
        parser.error("openai: at most 10,000 --subscribers (AGENT_MAX_CONCURRENT_RUNS's bound)")
    with contextlib.ExitStack() as exits:
        summary = asyncio.run(run(args, trees(exits, args.baseline)))
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    print(
        f"one paced answer ({args.tokens} tokens at {args.tps:g}/s) to {args.subscribers} subscribers per "
        f"dialect (openai: {args.subscribers} streamed completions, a query each); "
        f"medians of {args.rounds} alternating rounds"
    )
    print(
        f"  {'dialect':<10} {'CPU us per event delivered':>28} {'CPU us per text delta':>22} "
        f"{'bytes per event':>16} {'x session':>10}"
    )
    for name in args.dialects:
        row = summary[name]
        print(
            f"  {name:<10} {row['cpu_us_per_event']:>28.3f} {row['cpu_us_per_text_delta']:>22.3f} "
            f"{row['bytes_per_event']:>16.1f} {row.get('over_session', float('nan')):>10.3f}"
        )
    if args.baseline:
        print(f"baseline {args.baseline}, the same rounds (each dialect: current, then baseline):")
        for name in args.dialects:
            row = summary[name][BASELINE]
            print(
                f"  {name:<10} {row['cpu_us_per_event']:>28.3f} {row['cpu_us_per_text_delta']:>22.3f} "
                f"{row['bytes_per_event']:>16.1f}"
            )
        print(
            f"current vs baseline {args.baseline}: speed ratio = baseline CPU / current CPU "
            "(> 1: current cheaper), per log event and per text delta"
        )
        print(
            f"  {'dialect':<10} {'us/event current':>17} {'baseline':>10} {'speed ratio':>12}"
            f" {'us/delta current':>17} {'baseline':>10} {'speed ratio':>12}"
        )
        for name in args.dialects:
            vs = summary[name]["vs_baseline"]
            cells = []
            for figure in CPU_FIGURES:
                ratio = vs[figure]["speed_ratio"]
                cells.append(
                    f"{vs[figure][CURRENT]:>17.3f} {vs[figure][BASELINE]:>10.3f} "
                    + (f"{ratio:>12.3f}" if ratio is not None else f"{'n/a':>12}")
                )
            print(f"  {name:<10} {' '.join(cells)}")


if __name__ == "__main__":
    main()
