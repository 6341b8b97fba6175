"""The live scenario's client: processes of subscribers that time every token from its production.

``bench_peers.py --viewers SPEC`` (a JSON object) runs one client process: it pins itself to
``SPEC["cpu"]``, opens ``SPEC["n"]`` subscriptions, says ``{"ready": ...}`` on stdout once every
one is in, reads until each has seen the end (``{"ended": ...}``), then reads one line from
stdin, the path of a JSON file with the answer's tokens (``ends``: the running length of their
text, as the wire spells it; ``times``: when each was produced, ``time.monotonic()``), and prints
its figures (``{"result": ...}``). :class:`ViewerProcs` is the parent's side of that exchange.

The reading pattern is fixed, so that figures taken before and after a change of the service
compare. One loop over ``epoll`` (no asyncio, no HTTP client library: a reader must cost far less
than a server's delivery, and thousands share a core): for each socket it reports readable, one
``recv_into`` of up to 256 KiB into the process's one buffer, the bytes copied out, the clock
taken once, the bytes (after the unfinished tail of the previous read) scanned with one regular
expression for the dialect's text parts, their lengths added up; when the length grew, a note
(clock, length). A text part merged from several tokens counts for each of them by its length.
Afterwards token k counts as received by a subscriber at the first note whose length reaches the
running length of tokens 0..k, and its latency is that note's clock minus token k's production
time: every token of every subscriber, not a sample.
A saturated client reads later and in larger pieces, which shows as its CPU near 100%.

Dialects: ``sse`` (``GET /sessions/{id}/events``, the peers' ``/live`` too: ``assistant_text``
events, ending at ``event: done``), ``ws`` (``GET /ws``, a ``subscribe`` message, then the same
events as WebSocket text frames until ``"type":"done"``) and ``aisdk`` (``GET
/api/chat/{id}/stream``, the AI SDK's resume: ``text-delta`` parts until ``finish``). WebSocket
frames from the server are not masked and the handshake offers no compression, so the text parts
can be found in the raw bytes as in SSE.
"""

from __future__ import annotations

import array
import asyncio
import base64
import json
import os
import re
import select
import socket
import sys
import time
from pathlib import Path
from typing import Any

# A JSON string's text, its loop unrolled: the regex engine takes the runs between escapes whole
# (an alternation per character cost a reader 6 µs a read on a 300-byte text).
TEXT = rb'"([^"\\]*(?:\\.[^"\\]*)*)"'
DIALECTS: dict[str, dict[str, Any]] = {
    "sse": {
        "text": rb'"type":"assistant_text","text":' + TEXT,
        "end": b"event: done",
        "ready": b"HTTP/1.1 200",
    },
    "ws": {
        "text": rb'"type":"assistant_text","text":' + TEXT,
        "end": b'"type":"done"',
        "ready": b'"subscribed"',
    },
    "aisdk": {
        "text": rb'"type":"text-delta","id":"[^"]*","delta":' + TEXT,
        "end": b'"type":"finish"',
        "ready": b"HTTP/1.1 200",
    },
}
# A text event's ``ts`` (the session dialect, over SSE or WebSocket), and the wall clock's lead
# on the monotonic one in this process, to compare the two.
TEXT_TS = re.compile(rb'"type":"assistant_text","text":"(?:[^"\\]|\\.)*"[^}]*?"ts":([0-9.]+)')
WALL_OFFSET = time.time() - time.monotonic()
# A text part is never longer than this (merged, a whole answer is a few KB): the unread tail
# kept between reads is cut to it.
MAX_TAIL = 1 << 17
READ_SIZE = 1 << 18
HIST_BUCKET_S = 1e-4  # the latency histogram's resolution: 0.1 ms
HIST_BUCKETS = 1_200_000  # up to 120 s; later ones count in the last bucket


def ws_text_frame(payload: bytes) -> bytes:
    """A masked client-to-server WebSocket text frame (a client must mask; RFC 6455 5.3)."""
    mask = os.urandom(4)
    size = len(payload)
    head = bytes([0x81, 0x80 | size]) if size < 126 else bytes([0x81, 0xFE]) + size.to_bytes(2, "big")
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


class Viewer:
    """One subscriber: when its text grew, and when it saw the end (fed by :func:`watch`)."""

    __slots__ = (
        "spec",
        "pattern",
        "ready_mark",
        "end_mark",
        "sock",
        "ready",
        "failed",
        "upgraded",
        "tail",
        "length",
        "parts",
        "clocks",
        "lengths",
        "ended",
        "after_ts",
    )

    def __init__(self, spec: dict[str, Any], pattern: re.Pattern[bytes], dialect: dict[str, Any]) -> None:
        self.spec = spec
        self.pattern = pattern
        self.ready_mark: bytes = dialect["ready"]
        self.end_mark: bytes = dialect["end"]
        self.sock: socket.socket | None = None
        self.ready = False
        self.failed = ""
        self.upgraded = spec["dialect"] != "ws"
        self.tail = b""
        self.length = 0
        self.parts = 0
        self.clocks = array.array("d")
        self.lengths = array.array("q")
        self.ended = 0.0
        # For three subscribers a process in the session dialect: each text event's read time
        # minus its ``ts`` (when the service logged it), the measure before production times.
        self.after_ts: list[float] | None = None

    def request(self) -> bytes:
        """The request that opens the subscription (the upgrade, for a WebSocket)."""
        host = f"{self.spec['host']}:{self.spec['port']}"
        if self.spec["dialect"] == "ws":
            key = base64.b64encode(os.urandom(16)).decode()
            head = (
                f"GET {self.spec['path']} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
            )
        else:
            head = f"GET {self.spec['path']} HTTP/1.1\r\nHost: {host}\r\nAccept: text/event-stream\r\n\r\n"
        return head.encode()

    def feed(self, data: bytes, now: float) -> None:
        """What one read returned, at ``now``."""
        buffer = self.tail + data if self.tail else data
        if not self.ready:
            self._setting_up(buffer)
        end = 0
        grew = 0
        for match in self.pattern.finditer(buffer):
            grew += len(match.group(1))
            end = match.end()
            self.parts += 1
        if grew and self.after_ts is not None:
            wall = now + WALL_OFFSET
            self.after_ts += [wall - float(ts) for ts in TEXT_TS.findall(buffer)]
        if grew:
            self.length += grew
            self.clocks.append(now)
            self.lengths.append(self.length)
        if not self.ended and self.end_mark in buffer:
            self.ended = now
        self.tail = buffer[max(end, len(buffer) - MAX_TAIL) :]

    def _setting_up(self, buffer: bytes) -> None:
        status = buffer.split(b"\r\n", 1)[0] if b"\r\n" in buffer else b""
        if not self.upgraded:
            if b" 101 " in status:
                self.upgraded = True
                subscribe = {"type": "subscribe", "session_id": self.spec["session_id"]}
                if self.sock is not None:
                    self.sock.send(ws_text_frame(json.dumps(subscribe).encode()))
            elif status:
                self.failed = status.decode(errors="replace")
            return
        if self.ready_mark in buffer:
            self.ready = True
        elif self.spec["dialect"] != "ws" and status:
            self.failed = status.decode(errors="replace")


def say(message: dict[str, Any]) -> None:
    """One line of JSON to the parent."""
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


class Loop:
    """The epoll loop that feeds the viewers."""

    def __init__(self, pause: float = 0.0) -> None:
        # A pause before each epoll_wait lets the sockets written meanwhile be read in one round:
        # a reader woken for every write costs the writer a wake-up and itself a system call and
        # a context switch per read (on loopback both land on this machine's cores).
        self.pause = pause
        self.poller = select.epoll()
        self.viewers: dict[int, Viewer] = {}
        self.ended = 0  # viewers that saw the end
        self.gone = 0  # viewers closed by the server before the end

    def add(self, viewer: Viewer, host: str, port: int) -> None:
        """Connect ``viewer`` and send its request."""
        sock = socket.create_connection((host, port))
        viewer.sock = sock
        sock.sendall(viewer.request())
        sock.setblocking(False)
        self.viewers[sock.fileno()] = viewer
        self.poller.register(sock.fileno(), select.EPOLLIN)

    def run(self, done: Any, deadline: float) -> None:
        """Read until ``done()`` or ``deadline`` (``time.monotonic()``)."""
        viewers, poller, clock = self.viewers, self.poller, time.monotonic
        # One buffer read into and copied out of: ``recv(READ_SIZE)`` would allocate 256 KiB a
        # read, which glibc serves with an mmap, an mremap and a munmap (three system calls and
        # page faults a read, about 12 µs, more than the read itself).
        buffer = bytearray(READ_SIZE)
        view = memoryview(buffer)
        pause = self.pause
        while not done() and clock() < deadline:
            if pause:
                time.sleep(pause)
            for fd, _ in poller.poll(0.05):
                viewer = viewers[fd]
                try:
                    size = viewer.sock.recv_into(buffer)  # type: ignore[union-attr]
                except BlockingIOError:
                    continue
                except OSError:
                    size = 0
                if size:
                    was = viewer.ended
                    viewer.feed(view[:size].tobytes(), clock())
                    if viewer.ended and not was:
                        self.ended += 1
                else:  # the server closed it
                    poller.unregister(fd)
                    if not viewer.ended:
                        self.gone += 1
                    if not viewer.ready and not viewer.failed:
                        viewer.failed = "closed"

    def close(self) -> None:
        """Close every connection."""
        for viewer in self.viewers.values():
            if viewer.sock is not None:
                viewer.sock.close()
        self.poller.close()


def watch(spec: dict[str, Any]) -> list[Viewer]:
    """Open the subscriptions (``batch`` at a time: listen backlogs are finite), say ready, read
    until every one ended (or was closed) or ``timeout`` passed, close them."""
    dialect = DIALECTS[spec["dialect"]]
    pattern = re.compile(dialect["text"])
    loop = Loop(spec.get("pause_s", 0.0))
    viewers: list[Viewer] = []
    try:
        for start in range(0, spec["n"], spec["batch"]):
            batch = [Viewer(spec, pattern, dialect) for _ in range(min(spec["batch"], spec["n"] - start))]
            for viewer in batch:
                loop.add(viewer, spec["host"], spec["port"])
            viewers += batch
            loop.run(lambda batch=batch: all(v.ready or v.failed for v in batch), time.monotonic() + 60)
            failed = [v.failed or "no answer in 60 s" for v in batch if not v.ready]
            if failed:
                raise RuntimeError(f"{len(failed)} subscriptions failed: {failed[0]}")
        if spec["dialect"] != "aisdk":  # the first, middle and last to connect: early and late writes
            for index in {0, len(viewers) // 2, len(viewers) - 1}:
                viewers[index].after_ts = []
        say({"ready": len(viewers), "at": time.monotonic()})
        loop.run(lambda: loop.ended + loop.gone >= len(viewers), time.monotonic() + spec["timeout"])
    finally:
        loop.close()
    return viewers


def figures(viewers: list[Viewer], ends: list[int], times: list[float]) -> dict[str, Any]:
    """Every token's latency at every subscriber (a histogram), and what each received."""
    hist = [0] * HIST_BUCKETS
    top = HIST_BUCKETS - 1
    worst = 0.0
    delivered = complete = ended = 0
    tokens = len(ends)
    end_clocks = []
    for viewer in viewers:
        k = 0
        for clock, length in zip(viewer.clocks, viewer.lengths, strict=True):
            while k < tokens and ends[k] <= length:
                latency = clock - times[k]
                worst = max(worst, latency)
                hist[min(top, max(0, int(latency / HIST_BUCKET_S)))] += 1
                k += 1
        delivered += k
        if viewer.ended:
            ended += 1
            end_clocks.append(viewer.ended)
        if k == tokens and viewer.length == (ends[-1] if ends else 0) and viewer.ended:
            complete += 1
    return {
        "subscribers": len(viewers),
        "tokens_delivered": delivered,
        "complete": complete,
        "ended": ended,
        "last_end": max(end_clocks) if end_clocks else None,
        "text_parts": sum(v.parts for v in viewers),
        "max_s": worst,
        "hist": {str(i): c for i, c in enumerate(hist) if c},
        "after_ts_s": [x for v in viewers if v.after_ts is not None for x in v.after_ts],
    }


def viewers_main(raw: str) -> None:
    """The client process (``bench_peers.py --viewers SPEC``)."""
    spec = json.loads(raw)
    if spec.get("cpu") is not None:
        os.sched_setaffinity(0, {spec["cpu"]})
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):
        pass
    viewers = watch(spec)
    say({"ended": sum(1 for v in viewers if v.ended), "at": time.monotonic()})
    answer = json.loads(Path(sys.stdin.readline().strip()).read_text())
    say({"result": figures(viewers, answer["ends"], answer["times"])})


def percentile_of(hist: dict[int, int], q: float) -> float | None:
    """The q-quantile (nearest rank) of a merged histogram, in ms."""
    total = sum(hist.values())
    if not total:
        return None
    rank = min(total - 1, int(q * total))
    seen = 0
    for bucket in sorted(hist):
        seen += hist[bucket]
        if seen > rank:
            return (bucket + 0.5) * HIST_BUCKET_S * 1000
    return None


class ViewerProcs:
    """The parent's side: ``len(counts)`` client processes, the i-th with ``counts[i]`` subscribers
    of ``spec`` (host, port, path, dialect, session_id, cpu, timeout)."""

    def __init__(self, spec: dict[str, Any], counts: list[int], script: Path, batch: int = 250) -> None:
        self.specs = [{**spec, "n": n, "batch": batch} for n in counts if n]
        self.script = script
        self.children: list[asyncio.subprocess.Process] = []

    @property
    def pids(self) -> list[int]:
        """The client processes' ids."""
        return [child.pid for child in self.children]

    async def __aenter__(self) -> ViewerProcs:
        for spec in self.specs:
            self.children.append(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    str(self.script),
                    "--viewers",
                    json.dumps(spec),
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    limit=1 << 26,  # a result line holds a latency histogram
                )
            )
        return self

    async def __aexit__(self, *exc: object) -> None:
        for child in self.children:
            if child.returncode is None:
                child.kill()
            await child.wait()

    async def _each(self, key: str, timeout: float) -> list[Any]:
        async def one(child: asyncio.subprocess.Process) -> Any:
            assert child.stdout is not None
            line = await child.stdout.readline()
            if not line:
                raise RuntimeError(f"a client process exited (code {await child.wait()}) before {key!r}")
            return json.loads(line)[key]

        return await asyncio.wait_for(asyncio.gather(*(one(c) for c in self.children)), timeout)

    async def ready(self, timeout: float) -> list[int]:
        """Wait until every process has its subscribers in; how many each has."""
        return await self._each("ready", timeout)

    async def ended(self, timeout: float) -> list[int]:
        """Wait until every process has read to the end (or given up); how many ended in each."""
        return await self._each("ended", timeout)

    async def results(self, answer_path: str, timeout: float = 300.0) -> list[dict[str, Any]]:
        """Hand every process the answer's tokens; their figures."""
        for child in self.children:
            assert child.stdin is not None
            child.stdin.write(answer_path.encode() + b"\n")
            await child.stdin.drain()
        return await self._each("result", timeout)
