"""The in-process stages of the per-token path, each timed in CPU microseconds per text token.

Every stage runs on this process's event-loop thread and is timed with that thread's CPU clock
(``time.thread_time``), so a helper thread (the socket reader of the write stage) and other
processes (Redis, the emulator) are not counted. Each stage runs ``repeats`` times over the same
tokens; the figure is the median.

- ``decode.bedrock``: the recorded ConverseStream body, one event-stream frame per read, through
  the provider's own read loop (``BedrockProvider._frames``: its frame decoder, and botocore's
  parser for what the decoder leaves to it) to the event dicts botocore would give (what
  ``raw_stream`` yields); a tree before d780f78 is measured on botocore's decoder, which it ran;
- ``parse.bedrock``: those dicts through ``BedrockStreamParser`` to canonical events;
- ``read.bedrock``: the body through the provider's read loop with its parser, as a turn reads
  it: since 89119d6 a text delta goes from its frame to the parser without the event dict (in a
  tree before d780f78, ``decode.bedrock`` plus ``parse.bedrock``);
- ``parse.openai``: the recorded chat-completions body, one SSE event per read, through
  ``SSELineReader``, ``decode_data`` and ``OpenAIStreamParser``;
- ``event``: making the canonical ``TextDelta`` alone (it is part of both parse figures);
- ``log.memory`` / ``log.redis``: appending each event (with a run's claim as fence on Redis)
  while one subscriber follows the log; the next token comes once the subscriber has it, as with
  a paced model, so every token is its own append, wake-up and read;
- ``run.memory`` / ``run.redis``: the same through the run manager (a scripted agent, the
  service's metrics as observer) and the transports' ``Follower``, from the agent's yield to the
  subscriber's batch, the run's start and end included;
- ``project.session`` / ``project.agent`` / ``project.ws``: a fresh log entry to the bytes or text
  each dialect writes (the session SSE block, the agent dialect's block, the WebSocket frame);
- ``write.sse``: each token's SSE block written with the service's ``write_blocks`` into an
  aiohttp ``EventSourceResponse`` on a real loopback connection, a thread reading the other end.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import socket
import statistics
import threading
import time
import types
from collections.abc import AsyncIterator, Awaitable, Callable
from types import SimpleNamespace
from typing import Any

from tokens.record import event_stream_frames, sse_frames

Stage = Callable[[], Awaitable[int]]


async def timed(stage: Stage, repeats: int) -> float:
    """The median CPU µs per token of ``stage`` (which returns how many tokens it handled)."""
    figures = []
    for _ in range(repeats):
        started = time.thread_time()
        count = await stage()
        figures.append((time.thread_time() - started) * 1e6 / count)
    return round(statistics.median(figures), 3)


# -- parse ----------------------------------------------------------------------------------------


def botocore_streams() -> Callable[[Any], Any]:
    """A maker of botocore's EventStream for ConverseStream over a body (something with
    ``stream()``), the service model read once."""
    import botocore.session
    from botocore.eventstream import EventStream
    from botocore.parsers import EventStreamJSONParser

    model = botocore.session.get_session().get_service_model("bedrock-runtime")
    shape = model.operation_model("ConverseStream").output_shape.members["stream"]
    parser = EventStreamJSONParser()
    return lambda body: EventStream(body, shape, parser, "ConverseStream")


def bedrock_decoder(frames: list[bytes]) -> Callable[[], list[dict[str, Any]]]:
    """botocore's decoding of a ConverseStream body (read frame by frame) into event dicts."""
    stream = botocore_streams()

    class Body:
        def stream(self) -> Any:
            return iter(frames)

    return lambda: list(stream(Body()))


class _Body:
    """A response body read as the provider reads it (``readany``), one recorded read at a time."""

    def __init__(self, reads: list[bytes]) -> None:
        self._reads = iter(reads)

    async def readany(self) -> bytes:
        return next(self._reads, b"")


class _Response:
    """What the provider's read loop takes of aiohttp's response: the body, no connection left
    (the whole body is in, so no stall watch is armed)."""

    connection = None

    def __init__(self, reads: list[bytes]) -> None:
        self.content = _Body(reads)


class _BotocoreEvents:
    """The botocore parsing the read loop falls back on (``_parse_event``), synchronous here."""

    def __init__(self) -> None:
        self._stream = botocore_streams()(None)
        self.shape = self._stream._output_shape

    async def _parse_event(self, message: Any) -> Any:
        return self._stream._parse_event(message)


def provider_reader(frames: list[bytes]) -> Callable[[Any], Awaitable[list[Any]]] | None:
    """The tree's Bedrock read loop over ``frames`` (one per read), with or without a parser;
    None for a tree whose provider has no such loop."""
    from service.providers import bedrock_events
    from service.providers.bedrock import BedrockProvider

    events = _BotocoreEvents()
    loop = getattr(BedrockProvider, "_frames", None)
    if loop is None:
        if not hasattr(bedrock_events, "fast_event"):
            return None

        # Trees from d780f78 until 4ccf101 gave the loop its own method ran it inline in
        # ``stream``: each read's frames, the per-token ones decoded here, the rest by botocore,
        # every event to the parser (89119d6 already passed text deltas on without the dict).
        async def loop(_: Any, response: _Response, events: Any, parser: Any) -> AsyncIterator[Any]:
            decoder = bedrock_events.FrameDecoder()
            while data := await response.content.readany():
                for frame in decoder.feed(data):
                    event = bedrock_events.fast_event(frame) or await events._parse_event(frame.message())
                    if event:
                        for item in (event,) if parser is None else parser.feed(event):
                            yield item

    # What the loop reads of its provider: no stall watch, and (from the tree that reads the
    # answer's other events by plan) the plans its client would have made.
    plans = getattr(bedrock_events, "event_plans", None)
    provider = types.SimpleNamespace(_read_timeout=None, _plans=plans(events.shape) if plans else None)

    async def read(parser: Any) -> list[Any]:
        return [item async for item in loop(provider, _Response(frames), events, parser)]

    return read


def parse_stages(streams: dict[str, bytes]) -> dict[str, Stage]:
    """decode.bedrock, parse.bedrock, read.bedrock, parse.openai and event."""
    from service.core.events import TextDelta
    from service.providers.bedrock_stream import BedrockStreamParser
    from service.providers.openai_stream import OpenAIStreamParser, SSELineReader, decode_data

    frames = event_stream_frames(streams["bedrock"])
    botocore_decode = bedrock_decoder(frames)
    dicts = botocore_decode()
    texts = [event.text for item in dicts for event in BedrockStreamParser().feed(item)]
    openai_reads = sse_frames(streams["openai"])
    reader = provider_reader(frames)

    async def decode_bedrock() -> int:
        if reader is None:
            botocore_decode()
        else:
            await reader(None)
        return len(texts)

    async def read_bedrock() -> int:
        parser = BedrockStreamParser()
        count = sum(isinstance(item, TextDelta) for item in await reader(parser))  # type: ignore[misc]
        parser.result()
        return count

    async def parse_bedrock() -> int:
        parser = BedrockStreamParser()
        count = sum(len(parser.feed(item)) for item in dicts)
        parser.result()
        return count

    async def parse_openai() -> int:
        reader, parser, count = SSELineReader(), OpenAIStreamParser(), 0
        for data in openai_reads:
            for line in reader.feed(data):
                chunk = decode_data(line)
                if chunk is not None:
                    count += len(parser.feed(chunk))
        parser.result()
        return count

    async def event() -> int:
        for text in texts:
            TextDelta(text=text, turn=1)
        return len(texts)

    stages = {
        "decode.bedrock": decode_bedrock,
        "parse.bedrock": parse_bedrock,
        "parse.openai": parse_openai,
        "event": event,
    }
    if reader is not None:
        stages["read.bedrock"] = read_bedrock
    return stages


# -- log and run ----------------------------------------------------------------------------------


class Stores:
    """The session stores the log and run stages use: memory, and Redis when given a URL."""

    def __init__(self, redis_url: str | None, prefix: str) -> None:
        self.redis_url = redis_url
        self.prefix = prefix
        self.backend: Any = None
        self.stores: dict[str, Any] = {}

    async def __aenter__(self) -> Stores:
        from service.core.log import MemoryEventLog
        from service.core.sessions import MemorySessionStore

        self.stores["memory"] = MemorySessionStore(lambda: MemoryEventLog(1 << 30))
        if self.redis_url:
            from service.store.redis import RedisBackend, RedisSessionStore

            self.backend = RedisBackend(self.redis_url, prefix=self.prefix, max_bytes=1 << 30)
            await self.backend.start()
            self.stores["redis"] = RedisSessionStore(self.backend, MemorySessionStore())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.backend is not None:
            await self.backend.stop()
            import redis.asyncio as aioredis

            client = aioredis.Redis.from_url(self.redis_url)
            async with client:
                keys = [key async for key in client.scan_iter(match=f"{self.prefix}*", count=500)]
                if keys:
                    await client.unlink(*keys)


class Reader:
    """One subscriber following a log: ``caught_up(id)`` waits until it has read ``id``,
    ``has_texts(n)`` until it has read ``n`` text deltas."""

    def __init__(self, batches: AsyncIterator[list[Any]]) -> None:
        self.last = 0
        self.texts = 0
        self._batches = batches
        self._moved = asyncio.Event()
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for batch in self._batches:
            if batch:
                self.last = batch[-1].id
                self.texts += sum(entry.event.type == "text_delta" for entry in batch)
                moved, self._moved = self._moved, asyncio.Event()
                moved.set()

    async def caught_up(self, entry_id: int) -> None:
        while self.last < entry_id:
            await self._moved.wait()

    async def has_texts(self, count: int) -> None:
        while self.texts < count:
            await self._moved.wait()


def log_and_run_stages(stores: Stores, texts: list[str]) -> dict[str, Stage]:
    """log.<store> and run.<store> for each store."""
    from service.core.events import RunDone, TextDelta
    from service.core.runs import RunManager
    from service.metrics import Metrics

    try:
        from service.transports.stream.follow import Follower, Stop
    except ImportError:  # a --baseline tree from before the transports' folders
        from service.transports.follow import Follower, Stop  # type: ignore[no-redef]

    events = [TextDelta(text=text, turn=1) for text in texts]
    stages: dict[str, Stage] = {}

    def log_stage(store: Any) -> Stage:
        async def stage() -> int:
            session = await store.create()
            fence = await store.claim_run(session, secrets.token_hex(8))
            log = session.log
            after = await log.last_id()
            subscription = log.subscribe(after)
            reader = Reader(subscription)
            await log.wait_subscribers(1)
            for event in events:
                entry = await log.append(event, fence=fence)
                await reader.caught_up(entry.id)
            reader.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader.task
            await subscription.aclose()
            if fence is not None:
                await store.finish_run(session, fence, [])
            await store.delete(session.id)
            return len(events)

        return stage

    def run_stage(store: Any) -> Stage:
        reader_box: list[Reader] = []

        class Agent:
            async def run(
                self, messages: list[Any], user_text: str, max_turns: int, *_: Any, **__: Any
            ) -> AsyncIterator[Any]:
                # (later trees pass run options and an approval hook; a scripted model needs neither)
                reader = reader_box[0]
                for count, event in enumerate(events, 1):
                    yield event
                    # a paced model: the next token comes after this one reached the subscriber
                    await reader.has_texts(count)
                yield RunDone(turns=1, output="")

        runs = RunManager(Agent(), store=store, observer=Metrics())

        async def stage() -> int:
            session = await store.create()
            after = await session.log.last_id()
            # as the SSE session stream follows: a keep-alive timer while it waits
            follower = Follower(session.log, after, stop=Stop.AT_TERMINAL, idle_timeout=15.0)
            async with follower as batches:
                reader_box[:] = [Reader(batches)]
                await session.log.wait_subscribers(1)
                run = await runs.start(session, "budget")
                await run.wait()
                await reader_box[0].task
            if reader_box[0].texts < len(events):
                raise RuntimeError(
                    f"the scripted run delivered {reader_box[0].texts} of {len(events)} tokens"
                )
            await store.delete(session.id)
            return len(events)

        return stage

    for name, store in stores.stores.items():
        stages[f"log.{name}"] = log_stage(store)
        stages[f"run.{name}"] = run_stage(store)
    return stages


# -- project and write ----------------------------------------------------------------------------


def _tree() -> Any:
    """What the project and write stages call, wherever the measured tree keeps it (a
    ``--baseline`` tree may predate the transports' folders)."""
    try:
        from service.transports.native.dialects import agent_block
        from service.transports.stream import session
        from service.transports.stream.writes import write_blocks
    except ImportError:
        from service.transports.sse import write_blocks  # type: ignore[no-redef]

        from service.transports import dialects as session  # type: ignore[no-redef]

        agent_block = getattr(session, "agent_block", None) or (
            lambda event: session.sse_block(session.dumps(session.agent(event)))
        )
    return SimpleNamespace(
        session_sse=session.session_sse,
        session_frame=session.session_frame,
        ws_frame=session.ws_frame,
        agent_block=agent_block,
        write_blocks=write_blocks,
    )


def project_stages(texts: list[str]) -> dict[str, Stage]:
    """project.session, project.agent and project.ws, each on fresh entries (nothing cached)."""
    from service.core.events import TextDelta
    from service.core.log import LogEntry

    dialects = _tree()
    events = [TextDelta(text=text, turn=1) for text in texts]
    now = time.time()

    def fresh() -> list[Any]:
        return [LogEntry(n, event, 1300, now) for n, event in enumerate(events, 1)]

    def stage(project: Callable[[Any], Any]) -> Stage:
        async def run() -> int:
            entries = fresh()
            started = time.thread_time()
            for entry in entries:
                project(entry)
            # building the entries is not this stage's: give their time back
            run.spent = time.thread_time() - started  # type: ignore[attr-defined]
            return len(entries)

        return run

    def agent(entry: Any) -> bytes:
        return dialects.agent_block(entry.event).encode()

    def ws(entry: Any) -> str:
        return dialects.ws_frame("s" * 16, dialects.session_frame(entry)[1])

    return {
        "project.session": stage(dialects.session_sse),
        "project.agent": stage(agent),
        "project.ws": stage(ws),
    }


async def timed_project(stage: Stage, repeats: int) -> float:
    """Like :func:`timed`, counting only the projection (the stage says how long it took)."""
    figures = []
    for _ in range(repeats):
        count = await stage()
        figures.append(stage.spent * 1e6 / count)  # type: ignore[attr-defined]
    return round(statistics.median(figures), 3)


def _drain(sock: socket.socket) -> None:
    with sock:
        while sock.recv(1 << 16):
            pass


def write_stage(texts: list[str]) -> Stage:
    """write.sse: each token's session SSE block through ``write_blocks`` on a real connection."""
    from aiohttp import web
    from aiohttp_sse import sse_response

    from service.core.events import TextDelta
    from service.core.log import LogEntry

    dialects = _tree()
    write_blocks = dialects.write_blocks
    now = time.time()
    blocks = [dialects.session_sse(LogEntry(n, TextDelta(text=t), 1300, now)) for n, t in enumerate(texts, 1)]
    spent: list[float] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        async with sse_response(request) as response:
            started = time.thread_time()
            for block in blocks:
                await write_blocks(request, response, block, 10.0)
            spent.append(time.thread_time() - started)
        return response

    async def stage() -> int:
        app = web.Application()
        app.router.add_get("/", handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        client = socket.create_connection(("127.0.0.1", port))
        client.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        thread = threading.Thread(target=_drain, args=(client,), daemon=True)
        thread.start()
        while not spent:
            await asyncio.sleep(0.01)
        await runner.cleanup()
        await asyncio.to_thread(thread.join)
        stage.spent = spent.pop()  # type: ignore[attr-defined]
        return len(blocks)

    return stage


async def measure(streams: dict[str, bytes], redis_url: str | None, repeats: int) -> dict[str, float]:
    """Every in-process stage: CPU µs per token."""
    results: dict[str, float] = {}
    parse = parse_stages(streams)
    for name, stage in parse.items():
        results[name] = await timed(stage, repeats)
    from service.providers.bedrock_stream import BedrockStreamParser

    dicts = bedrock_decoder(event_stream_frames(streams["bedrock"]))()
    texts = [event.text for item in dicts for event in BedrockStreamParser().feed(item)]
    async with Stores(redis_url, f"bench-tokens-{secrets.token_hex(4)}") as stores:
        for name, stage in log_and_run_stages(stores, texts).items():
            results[name] = await timed(stage, repeats)
    for name, stage in project_stages(texts).items():
        results[name] = await timed_project(stage, repeats)
    results["write.sse"] = await timed_project(write_stage(texts), repeats)
    return results
