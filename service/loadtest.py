"""``agentstream-load`` (``python scripts/loadtest.py``): drive many concurrent clients at a service.

    agentstream-load --clients 100 --count 1000 --mode sse
    agentstream-load --url https://agents.example --api-key KEY --clients 500 --duration 60 --ramp-up 10 --mode mixed
    agentstream-load --mode ws --clients 50 --duration 30 --json > result.json
    agentstream-load --clients 200 --count 2000 --plot latency.png     # pip install 'agentstream[plot]'
    agentstream-load --selftest --selftest-idle-ms 65000                 # does the path buffer, compress, cut?

Modes: ``sse`` (a session per client: ``POST /sessions``, then per query ``POST /sessions/{id}/messages``
and ``GET /sessions/{id}/events`` from the ``after_id`` it returned, read until ``done``/``error``),
``ws`` (one ``GET /ws`` socket per client: ``subscribe`` from id 0, then a ``message`` per query,
frames until ``done``/``error``), ``agent`` (``POST /agent/stream`` per query) and ``mixed`` (the
clients take the three in turn). A client moves to a fresh session every ``--queries-per-session``
queries and deletes the ones it made.

Per query it measures the time to the first text event (TTFT), the gaps between text events and
the time to ``done`` (end to end), from the moment the query is sent; it counts errors by kind
(HTTP status, connection errors, timeouts, ``error`` events by ``code``) and, on the session
streams, event ids lost or repeated (ids must be contiguous; a merged ``assistant_text`` covers
``first_id``..``id``; ``heartbeat`` events have none). The exit status is 0 for a clean run, 1 if
anything failed or an id was lost or repeated.

The answer's pacing is the service's: on the embedded emulator ``AGENT_EMULATOR_TTFT_MS`` and
``AGENT_EMULATOR_TOKENS_PER_SECOND``, or directives in ``--message`` (``[emu:tokens=N]``,
``[emu:ttft=MS]``, ``[emu:tps=N]``).

Before a load run (unless ``--no-selftest``), and alone with ``--selftest``, it reads
``GET /selftest/stream``: timestamped ticks then an idle pause, and says whether something
between it and the service buffers the stream, compresses it or cuts idle streams.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import aiohttp

DEFAULT_URL = "http://127.0.0.1:8080"
DEFAULT_MESSAGE = "Tell me a story [emu:tokens=100]"
MODES = ("sse", "ws", "agent")
JSON_HEADERS = {"Content-Type": "application/json"}

now = time.perf_counter


# -- ids ---------------------------------------------------------------------------------------


class IdCheck:
    """Contiguity of one session stream's event ids.

    ``feed(first, last)`` takes each event's span (``first == last`` but for a merged
    ``assistant_text``, which covers ``first_id``..``id``). Ids must follow on from the last one
    seen: a jump forward counts the skipped ids as lost, ids at or below the last one seen count
    as repeated.
    """

    __slots__ = ("last", "lost", "repeated")

    def __init__(self, after: int = 0) -> None:
        self.last = after
        self.lost = 0
        self.repeated = 0

    def feed(self, first: int, last: int) -> None:
        expected = self.last + 1
        if first != expected:
            if first > expected:
                self.lost += first - expected
            else:
                self.repeated += min(last, self.last) - first + 1
        if last > self.last:
            self.last = last


def check_ids(spans: Iterable[int | tuple[int, int]], after: int = 0) -> tuple[int, int]:
    """``(lost, repeated)`` for a stream of ids (or ``(first_id, id)`` spans) read after ``after``."""
    check = IdCheck(after)
    for span in spans:
        if isinstance(span, int):
            check.feed(span, span)
        else:
            check.feed(*span)
    return check.lost, check.repeated


# -- SSE ---------------------------------------------------------------------------------------


class SSEParser:
    """Incremental ``text/event-stream`` parser: ``feed(bytes)`` returns the completed events.

    Each event is ``(event name, id or None, data)``; comments and events without data are
    dropped, and an event's id is its own (not carried over), so a ``heartbeat`` has none.
    """

    __slots__ = ("_tail", "_event", "_id", "_data")

    def __init__(self) -> None:
        self._tail = b""
        self._event = ""
        self._id: str | None = None
        self._data: str | None = None

    def feed(self, chunk: bytes) -> list[tuple[str, str | None, str]]:
        if self._tail:
            chunk = self._tail + chunk
        lines = chunk.splitlines(keepends=True)
        # An unfinished line (or a lone CR that may be half of CRLF) waits for the next chunk.
        if lines and not lines[-1].endswith(b"\n"):
            self._tail = lines.pop()
        else:
            self._tail = b""
        return self._lines(lines)

    def close(self) -> list[tuple[str, str | None, str]]:
        """The end of the stream: what the last chunk left unfinished."""
        tail, self._tail = self._tail, b""
        return self._lines([tail, b"\n"] if tail else [])

    def _lines(self, lines: list[bytes]) -> list[tuple[str, str | None, str]]:
        events: list[tuple[str, str | None, str]] = []
        for raw in lines:
            line = raw.rstrip(b"\r\n")
            if not line:
                if self._data is not None:
                    events.append((self._event or "message", self._id, self._data))
                self._event, self._id, self._data = "", None, None
                continue
            if line[0] == 58:  # ":" a comment (keep-alive)
                continue
            name, _, value = line.partition(b":")
            if value[:1] == b" ":
                value = value[1:]
            if name == b"data":
                text = value.decode()
                self._data = text if self._data is None else f"{self._data}\n{text}"
            elif name == b"event":
                self._event = value.decode()
            elif name == b"id":
                self._id = value.decode()
        return events


# -- measurements ------------------------------------------------------------------------------


class QueryFailed(Exception):
    """A query that did not end with ``done``; ``kind`` is how it is counted."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


def _http_error(status: int, what: str) -> QueryFailed:
    return QueryFailed(f"http {status} ({what})")


def error_kind(exc: BaseException) -> str:
    """How an exception is counted among the errors."""
    if isinstance(exc, QueryFailed):
        return exc.kind
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"connect error ({type(exc.os_error).__name__})"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "server disconnected"
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "connection broken mid-body"
    if isinstance(exc, aiohttp.WSServerHandshakeError):
        return f"http {exc.status} (GET /ws)"
    if isinstance(exc, aiohttp.ClientError | OSError):
        return f"connection error ({type(exc).__name__})"
    if isinstance(exc, ValueError | KeyError | TypeError):
        return f"bad response ({type(exc).__name__})"
    return f"client error ({type(exc).__name__}: {exc})"


class Stats:
    """Everything measured during a run; the hot path only appends floats and bumps counters."""

    def __init__(self) -> None:
        self.start = now()
        self.started = 0
        self.finished = 0
        self.ok = 0
        self.events = 0
        self.heartbeats = 0
        self.lost = 0
        self.repeated = 0
        self.ttft: list[float] = []
        self.gaps: list[float] = []
        self.e2e: list[float] = []
        self.errors: Counter[str] = Counter()
        self.by_mode: dict[str, Counter[str]] = {}
        self.timeline: list[tuple[float, float | None, float | None, bool]] = []
        self.event_bins: list[int] = []  # events received in each second of the run

    def count_events(self, n: int, at: float) -> None:
        self.events += n
        second = int(at - self.start)
        bins = self.event_bins
        if second >= len(bins):
            bins.extend([0] * (second + 1 - len(bins)))
        bins[second] += n


class Probe:
    """One query's timings."""

    __slots__ = ("stats", "t0", "ttft", "last_text", "end")

    def __init__(self, stats: Stats) -> None:
        self.stats = stats
        self.t0 = now()
        self.ttft: float | None = None
        self.last_text: float | None = None
        self.end: float | None = None  # when `done` arrived

    def text(self, at: float) -> None:
        if self.last_text is None:
            self.ttft = at - self.t0
        else:
            self.stats.gaps.append(at - self.last_text)
        self.last_text = at


# -- the run -----------------------------------------------------------------------------------


@dataclass
class Config:
    """What a run does (the command line, parsed)."""

    url: str = DEFAULT_URL
    api_key: str | None = None
    mode: str = "sse"
    clients: int = 10
    count: int | None = None
    duration: float | None = None
    ramp_up: float = 0.0
    message: str = DEFAULT_MESSAGE
    timeout: float = 120.0
    queries_per_session: int = 10
    selftest: bool = True
    selftest_only: bool = False
    selftest_ticks: int = 20
    selftest_interval_ms: int = 50
    selftest_idle_ms: int = 2000
    progress: bool = True
    json: bool = False
    plot: str | None = None


class Run:
    """Shared state of the clients: the HTTP session, the budget of queries, the stats."""

    def __init__(self, config: Config, http: aiohttp.ClientSession) -> None:
        self.config = config
        self.http = http
        self.base = config.url.rstrip("/")
        self.stats = Stats()
        self.remaining = config.count
        self.deadline = None if config.duration is None else self.stats.start + config.duration
        self.active = 0
        self.query_body = json.dumps({"content": config.message}).encode()
        self.agent_body = json.dumps({"message": config.message}).encode()

    def take(self) -> bool:
        """Whether a client may start another query (and if so, count it as started)."""
        if self.deadline is not None:
            if now() >= self.deadline:
                return False
        elif self.remaining is not None:
            if self.remaining <= 0:
                return False
            self.remaining -= 1
        self.stats.started += 1
        return True

    def record(self, mode: str, probe: Probe, failure: BaseException | None, ids: IdCheck | None) -> None:
        stats = self.stats
        end = probe.end or now()
        stats.finished += 1
        modes = stats.by_mode.setdefault(mode, Counter())
        e2e = None
        if failure is None:
            stats.ok += 1
            modes["ok"] += 1
            e2e = end - probe.t0
            stats.e2e.append(e2e)
        else:
            modes["failed"] += 1
            stats.errors[error_kind(failure)] += 1
        if probe.ttft is not None:
            stats.ttft.append(probe.ttft)
        if ids is not None:
            stats.lost += ids.lost
            stats.repeated += ids.repeated
            ids.lost = ids.repeated = 0
        stats.timeline.append((probe.t0 - stats.start, probe.ttft, e2e, failure is None))

    # -- sessions ------------------------------------------------------------------------------

    async def create_session(self) -> str:
        async with self.http.post(self.base + "/sessions", data=b"{}", headers=JSON_HEADERS) as response:
            if response.status != 201:
                raise _http_error(response.status, "POST /sessions")
            return (await response.json())["id"]

    async def delete_session(self, session_id: str) -> None:
        try:
            async with asyncio.timeout(10):
                async with self.http.delete(f"{self.base}/sessions/{session_id}"):
                    pass
        except (aiohttp.ClientError, OSError, TimeoutError):
            pass  # it expires on its own

    # -- the three kinds of client -------------------------------------------------------------

    async def sse_client(self) -> None:
        session_id: str | None = None
        used = 0
        stats = self.stats
        try:
            while self.take():
                if session_id is not None and used >= self.config.queries_per_session:
                    await self.delete_session(session_id)
                    session_id = None
                probe: Probe | None = None
                ids: IdCheck | None = None
                self.active += 1
                try:
                    async with asyncio.timeout(self.config.timeout):
                        if session_id is None:
                            session_id, used = await self.create_session(), 0
                        used += 1
                        probe = Probe(stats)
                        where = f"{self.base}/sessions/{session_id}"
                        async with self.http.post(
                            where + "/messages", data=self.query_body, headers=JSON_HEADERS
                        ) as response:
                            if response.status != 202:
                                raise _http_error(response.status, "POST /sessions/{id}/messages")
                            after = int((await response.json())["after_id"])
                        ids = IdCheck(after)
                        async with self.http.get(
                            where + "/events", headers={"Last-Event-ID": str(after)}
                        ) as response:
                            if response.status != 200:
                                raise _http_error(response.status, "GET /sessions/{id}/events")
                            await self._read_session_sse(response, probe, ids)
                    failure = None
                except Exception as exc:
                    failure = exc
                    if session_id is not None:  # start over on a fresh session
                        await self.delete_session(session_id)
                        session_id = None
                finally:
                    self.active -= 1
                self.record("sse", probe or Probe(stats), failure, ids)
        finally:
            if session_id is not None:
                await self.delete_session(session_id)

    async def _read_session_sse(self, response: aiohttp.ClientResponse, probe: Probe, ids: IdCheck) -> None:
        stats = self.stats
        parser = SSEParser()
        async for chunk in response.content.iter_any():
            at = now()
            events = parser.feed(chunk)
            if not events:
                continue
            counted = 0
            for name, event_id, data in events:
                if name == "heartbeat":
                    stats.heartbeats += 1
                    continue
                counted += 1
                if event_id is not None:
                    last = int(event_id)
                    first = last
                    if name == "assistant_text" and '"first_id"' in data:
                        first = int(json.loads(data)["first_id"])
                    ids.feed(first, last)
                if name == "assistant_text":
                    probe.text(at)
                elif name == "done":
                    stats.count_events(counted, at)
                    probe.end = at
                    return
                elif name == "error":
                    stats.count_events(counted, at)
                    raise QueryFailed(f"error event ({json.loads(data).get('code')})")
            stats.count_events(counted, at)
        raise QueryFailed("stream ended before done")

    async def agent_client(self) -> None:
        stats = self.stats
        while self.take():
            probe = Probe(stats)
            self.active += 1
            try:
                async with asyncio.timeout(self.config.timeout):
                    async with self.http.post(
                        self.base + "/agent/stream", data=self.agent_body, headers=JSON_HEADERS
                    ) as response:
                        if response.status != 200:
                            raise _http_error(response.status, "POST /agent/stream")
                        await self._read_agent_sse(response, probe)
                failure = None
            except Exception as exc:
                failure = exc
            finally:
                self.active -= 1
            self.record("agent", probe, failure, None)

    async def _read_agent_sse(self, response: aiohttp.ClientResponse, probe: Probe) -> None:
        stats = self.stats
        parser = SSEParser()
        async for chunk in response.content.iter_any():
            at = now()
            events = parser.feed(chunk)
            if not events:
                continue
            stats.count_events(len(events), at)
            for _, _, data in events:
                if data.startswith('{"type":"text_delta"'):  # the common case, without parsing
                    probe.text(at)
                    continue
                kind = json.loads(data).get("type")
                if kind == "text_delta":
                    probe.text(at)
                elif kind == "done":
                    probe.end = at
                    return
                elif kind == "error":
                    raise QueryFailed(f"error event ({json.loads(data).get('code')})")
        raise QueryFailed("stream ended before done")

    async def ws_client(self) -> None:
        stats = self.stats
        ws: aiohttp.ClientWebSocketResponse | None = None
        session_id: str | None = None
        ids: IdCheck | None = None
        used = 0
        try:
            while self.take():
                if session_id is not None and used >= self.config.queries_per_session:
                    if ws is not None and not ws.closed:
                        await ws.send_str(json.dumps({"type": "unsubscribe", "session_id": session_id}))
                    await self.delete_session(session_id)
                    session_id = None
                probe: Probe | None = None
                self.active += 1
                try:
                    async with asyncio.timeout(self.config.timeout):
                        if ws is None or ws.closed:
                            ws = await self.http.ws_connect(self.base + "/ws", max_msg_size=0, autoping=True)
                        if session_id is None:
                            session_id, used = await self.create_session(), 0
                            await ws.send_str(
                                json.dumps(
                                    {"type": "subscribe", "session_id": session_id, "last_event_id": 0}
                                )
                            )
                            ids = IdCheck(0)
                        used += 1
                        probe = Probe(stats)
                        await ws.send_str(
                            json.dumps(
                                {"type": "message", "session_id": session_id, "content": self.config.message}
                            )
                        )
                        assert ids is not None
                        await self._read_ws(ws, session_id, probe, ids)
                    failure = None
                except Exception as exc:
                    failure = exc
                    if ws is not None:
                        await ws.close()
                        ws = None
                    if session_id is not None:
                        await self.delete_session(session_id)
                        session_id = None
                finally:
                    self.active -= 1
                self.record("ws", probe or Probe(stats), failure, ids)
        finally:
            if ws is not None:
                await ws.close()
            if session_id is not None:
                await self.delete_session(session_id)

    async def _read_ws(
        self, ws: aiohttp.ClientWebSocketResponse, session_id: str, probe: Probe, ids: IdCheck
    ) -> None:
        stats = self.stats
        loads = json.loads
        while True:
            message = await ws.receive()
            at = now()
            if message.type is not aiohttp.WSMsgType.TEXT:
                code = ws.close_code if message.type is not aiohttp.WSMsgType.ERROR else "error"
                raise QueryFailed(f"websocket closed ({code})")
            frame = loads(message.data)
            if frame.get("session_id") != session_id:
                continue
            kind = frame.get("type")
            event_id = frame.get("id")
            if event_id is None:  # subscribed, accepted, unsubscribed, or a refused command
                if kind == "error":
                    raise QueryFailed(f"websocket error ({frame.get('code')})")
                continue
            stats.count_events(1, at)
            ids.feed(frame.get("first_id", event_id), event_id)
            if kind == "assistant_text":
                probe.text(at)
            elif kind == "done":
                probe.end = at
                return
            elif kind == "error":
                raise QueryFailed(f"error event ({frame.get('code')})")

    async def client(self, index: int, mode: str) -> None:
        config = self.config
        if config.ramp_up > 0 and config.clients > 1:
            # Clients start spread evenly over the ramp-up.
            await asyncio.sleep(config.ramp_up * index / config.clients)
        try:
            if mode == "sse":
                await self.sse_client()
            elif mode == "ws":
                await self.ws_client()
            else:
                await self.agent_client()
        except Exception as exc:  # a client's own failure outside a query (should not happen)
            self.stats.errors[error_kind(exc)] += 1


# -- the path check ----------------------------------------------------------------------------


async def selftest(
    http: aiohttp.ClientSession, url: str, ticks: int = 20, interval_ms: int = 50, idle_ms: int = 2000
) -> dict[str, Any]:
    """Read ``GET /selftest/stream`` and judge the path: buffering, compression, idle cut, lag.

    Returns the findings with ``problems`` (a list, empty when the path is clean) and ``lines``,
    one verdict per check.
    """
    ticks = max(3, ticks)
    query = f"?ticks={ticks}&interval_ms={interval_ms}&idle_ms={idle_ms}"
    arrivals: list[tuple[int, float, float]] = []  # (n, server ts, arrival wall clock)
    ended = False
    broken: str | None = None
    encoding = None
    responded = False
    timeout = (ticks * interval_ms + idle_ms) / 1000 + 30
    started = time.time()
    try:
        async with asyncio.timeout(timeout):
            async with http.get(url.rstrip("/") + "/selftest/stream" + query) as response:
                if response.status != 200:
                    body = (await response.text())[:200]
                    raise QueryFailed(f"GET /selftest/stream answered {response.status}: {body}")
                responded = True
                encoding = response.headers.get("Content-Encoding")
                parser = SSEParser()
                async for chunk in response.content.iter_any():
                    at = time.time()
                    for name, _, data in parser.feed(chunk):
                        if name == "tick":
                            tick = json.loads(data)
                            arrivals.append((tick["n"], tick["ts"], at))
                        elif name == "end":
                            ended = True
    except QueryFailed as exc:
        return _unavailable(str(exc))
    except TimeoutError:
        broken = f"no end within {timeout:.0f} s"
    except (aiohttp.ClientError, OSError) as exc:
        if not responded:
            return _unavailable(error_kind(exc))
        broken = error_kind(exc)
    cut_after = time.time() - started
    return judge_selftest(arrivals, ticks, interval_ms, idle_ms, encoding, ended, broken, cut_after)


def _unavailable(why: str) -> dict[str, Any]:
    return {"available": False, "problems": [why], "lines": [f"selftest unavailable: {why}"]}


def judge_selftest(
    arrivals: list[tuple[int, float, float]],
    ticks: int,
    interval_ms: int,
    idle_ms: int,
    encoding: str | None,
    ended: bool,
    broken: str | None,
    elapsed: float,
) -> dict[str, Any]:
    """The verdicts of a selftest from what arrived when (see :func:`selftest`)."""
    problems: list[str] = []
    lines: list[str] = []
    # Buffering: ticks written interval_ms apart that arrive together, or an arrival lag that grows.
    regular = [
        (b[1] - a[1], b[2] - a[2])
        for a, b in zip(arrivals, arrivals[1:], strict=False)
        if b[0] == a[0] + 1 and b[0] != ticks  # the last tick follows the idle pause
    ]
    lags = [(at - ts) * 1000 for _, ts, at in arrivals]
    bursts = sum(1 for written, arrived in regular if written > 0.005 and arrived < 0.2 * written)
    growth = 0.0
    if len(lags) >= 4:
        quarter = max(1, len(lags) // 4)
        growth = _median(lags[-quarter:]) - _median(lags[:quarter])
    buffering = bool(regular) and (bursts * 3 > len(regular) or growth > max(3 * interval_ms, 500))
    if len(regular) < 2:
        lines.append(f"buffering:   unknown: only {len(arrivals)} tick(s) arrived")
        problems.append("buffering unknown")
    elif buffering:
        problems.append("buffering")
        lines.append(
            f"buffering:   BUFFERED: {bursts} of {len(regular)} ticks written {interval_ms} ms apart "
            f"arrived together; arrival lag grew {growth:.0f} ms"
        )
    else:
        arrived = _median([gap for _, gap in regular]) * 1000
        lines.append(
            f"buffering:   ok: ticks written {interval_ms} ms apart arrived a median {arrived:.1f} ms apart "
            f"({bursts} bunched of {len(regular)}); lag grew {growth:.1f} ms"
        )
    # Compression.
    if encoding:
        problems.append("compressed")
        lines.append(f"compression: COMPRESSED (Content-Encoding: {encoding}); events may be held back")
    else:
        lines.append("compression: ok: no Content-Encoding")
    # Idle streams cut.
    idle_cut = False
    if ended:
        lines.append(f"idle:        ok: the stream stayed open through a {idle_ms} ms pause")
    else:
        seen = arrivals[-1][0] if arrivals else 0
        why = broken or "closed"
        if seen == ticks - 1:
            idle_cut = True
            problems.append("idle streams cut")
            lines.append(
                f"idle:        CUT: the stream ended ({why}) {elapsed:.1f} s in, during the {idle_ms} ms "
                "idle pause"
            )
        else:
            problems.append("stream broken")
            lines.append(f"idle:        BROKEN: the stream ended ({why}) after tick {seen} of {ticks}")
    lag = {"p50": _pct(lags, 0.5), "max": max(lags)} if lags else {"p50": None, "max": None}
    if lags:
        lines.append(
            f"lag:         p50 {lag['p50']:.1f} ms, max {lag['max']:.1f} ms (arrival - server ts; "
            "includes any clock offset between the hosts)"
        )
    return {
        "available": True,
        "ticks_received": len(arrivals),
        "ticks": ticks,
        "interval_ms": interval_ms,
        "idle_ms": idle_ms,
        "buffering": buffering,
        "bunched_ticks": bursts,
        "lag_growth_ms": round(growth, 3),
        "compressed": bool(encoding),
        "content_encoding": encoding,
        "idle_cut": idle_cut,
        "ended": ended,
        "lag_ms": {k: None if v is None else round(v, 3) for k, v in lag.items()},
        "problems": problems,
        "lines": [f"selftest {line}" for line in lines],
    }


# -- numbers -----------------------------------------------------------------------------------


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _median(values: list[float]) -> float:
    return _pct(values, 0.5)


def _summary(values: list[float]) -> dict[str, Any]:
    """n, p50, p90, p99, max in milliseconds."""
    if not values:
        return {"n": 0, "p50": None, "p90": None, "p99": None, "max": None}
    ordered = sorted(values)
    last = len(ordered) - 1

    def at(q: float) -> float:
        return round(ordered[min(last, int(q * len(ordered)))] * 1000, 3)

    return {
        "n": len(ordered),
        "p50": at(0.5),
        "p90": at(0.9),
        "p99": at(0.99),
        "max": round(ordered[-1] * 1000, 3),
    }


def raise_open_file_limit() -> int:
    """Raise the soft limit on open files to the hard one (each client holds a socket or two)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return target
        except (ValueError, OSError):
            pass
    return soft


async def _watch_loop(lags: list[float], period: float = 0.05) -> None:
    """Sample this process's own event-loop lag (how late a timer fires), to show the client kept up."""
    loop = asyncio.get_running_loop()
    while True:
        expected = loop.time() + period
        await asyncio.sleep(period)
        lags.append(max(0.0, loop.time() - expected))


# -- progress ----------------------------------------------------------------------------------


async def _progress(run: Run, out: Any) -> None:
    config = run.config
    stats = run.stats
    width = 24
    try:
        while True:
            elapsed = now() - stats.start
            events_rate = stats.events / elapsed if elapsed > 0 else 0.0
            if config.duration is not None:
                done_share = min(1.0, elapsed / config.duration)
                total = f"{stats.finished} done"
            else:
                target = config.count or 1
                done_share = stats.finished / target
                total = f"{stats.finished}/{target}"
            filled = int(done_share * width)
            failed = stats.finished - stats.ok
            out.write(
                f"\r[{'#' * filled}{'.' * (width - filled)}] {total} queries, {run.active} running, "
                f"{failed} failed, {events_rate:,.0f} ev/s, {elapsed:.1f} s   "
            )
            out.flush()
            await asyncio.sleep(0.25)
    except asyncio.CancelledError:
        out.write("\r" + " " * 100 + "\r")
        out.flush()
        raise


# -- entry points ------------------------------------------------------------------------------


def _session(config: Config, limit: int) -> aiohttp.ClientSession:
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else None
    connector = aiohttp.TCPConnector(limit=limit, limit_per_host=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
    return aiohttp.ClientSession(connector=connector, headers=headers, timeout=timeout)


async def run_selftest(config: Config) -> dict[str, Any]:
    """``--selftest`` alone: the path check's findings."""
    async with _session(config, 4) as http:
        return await selftest(
            http, config.url, config.selftest_ticks, config.selftest_interval_ms, config.selftest_idle_ms
        )


async def run(config: Config) -> dict[str, Any]:
    """Run the load (after the path check unless disabled) and return the report (``--json``'s)."""
    raise_open_file_limit()
    if config.count is None and config.duration is None:
        config.count = config.clients
    report: dict[str, Any] = {}
    async with _session(config, config.clients + 16) as http:
        if config.selftest:
            report["selftest"] = await selftest(
                http, config.url, config.selftest_ticks, config.selftest_interval_ms, config.selftest_idle_ms
            )
            if not config.json:
                print("\n".join(report["selftest"]["lines"]), flush=True)
        load = Run(config, http)
        modes = MODES if config.mode == "mixed" else (config.mode,)
        progress = None
        if config.progress:
            progress = asyncio.create_task(_progress(load, sys.stderr))
        lags: list[float] = []
        watcher = asyncio.create_task(_watch_loop(lags))
        cpu = time.process_time()
        started = now()
        load.stats.start = started
        if load.deadline is not None:
            load.deadline = started + (config.duration or 0)
        try:
            await asyncio.gather(*(load.client(i, modes[i % len(modes)]) for i in range(config.clients)))
        finally:
            for task in (progress, watcher):
                if task is not None:
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
        wall = now() - started
        cpu = time.process_time() - cpu
    stats = load.stats
    failed = stats.finished - stats.ok
    errors = dict(stats.errors.most_common())
    clean = (
        failed == 0
        and not errors
        and stats.lost == 0
        and stats.repeated == 0
        and stats.started == stats.finished
    )
    report.update(
        {
            "url": config.url,
            "mode": config.mode,
            "clients": config.clients,
            "ramp_up_s": config.ramp_up,
            "duration_s": round(wall, 3),
            "queries": {
                "started": stats.started,
                "finished": stats.finished,
                "ok": stats.ok,
                "failed": failed,
            },
            "by_mode": {mode: dict(counts) for mode, counts in stats.by_mode.items()},
            "ttft_ms": _summary(stats.ttft),
            "gap_ms": _summary(stats.gaps),
            "e2e_ms": _summary(stats.e2e),
            "events": stats.events,
            "events_per_s": round(stats.events / wall, 1) if wall > 0 else 0.0,
            "heartbeats": stats.heartbeats,
            "errors": errors,
            "ids": {"lost": stats.lost, "repeated": stats.repeated},
            "client_cpu": {
                "seconds": round(cpu, 3),
                "share_of_one_core": round(cpu / wall, 3) if wall > 0 else 0.0,
                "us_per_event": round(cpu / stats.events * 1e6, 2) if stats.events else None,
                "loop_lag_ms": _summary(lags),
            },
            "clean": clean,
        }
    )
    if config.plot:
        report["plot"] = plot(stats, config.plot)
    return report


def format_report(report: dict[str, Any]) -> str:
    """The summary table."""
    queries = report["queries"]
    out = [
        f"agentstream load: {report['mode']} against {report['url']}, {report['clients']} clients, "
        f"ramp-up {report['ramp_up_s']:g} s, {report['duration_s']:.1f} s",
        f"queries     {queries['finished']} finished of {queries['started']} started: "
        f"{queries['ok']} ok, {queries['failed']} failed"
        + (
            " ("
            + ", ".join(
                f"{m} {c.get('ok', 0)}/{c.get('ok', 0) + c.get('failed', 0)}"
                for m, c in report["by_mode"].items()
            )
            + ")"
            if len(report["by_mode"]) > 1
            else ""
        ),
        f"{'':12}{'n':>8}{'p50':>10}{'p90':>10}{'p99':>10}{'max':>10}",
    ]
    for name, key in (("TTFT ms", "ttft_ms"), ("gap ms", "gap_ms"), ("e2e ms", "e2e_ms")):
        row = report[key]
        cells = "".join(
            f"{'-' if row[q] is None else format(row[q], '.1f'):>10}" for q in ("p50", "p90", "p99", "max")
        )
        out.append(f"{name:12}{row['n']:>8}{cells}")
    out.append(
        f"events      {report['events']:,} ({report['events_per_s']:,.0f}/s), heartbeats {report['heartbeats']}"
    )
    ids = report["ids"]
    out.append(f"ids         lost {ids['lost']}, repeated {ids['repeated']}")
    errors = report["errors"]
    out.append(
        "errors      " + ("none" if not errors else ", ".join(f"{kind}: {n}" for kind, n in errors.items()))
    )
    cpu = report["client_cpu"]
    per_event = f", {cpu['us_per_event']:.0f} us/event" if cpu["us_per_event"] else ""
    lag = cpu["loop_lag_ms"]
    lag_text = f", loop lag p99 {lag['p99']:.1f} ms, max {lag['max']:.1f} ms" if lag["n"] else ""
    out.append(
        f"client CPU  {cpu['seconds']:.2f} s ({cpu['share_of_one_core']:.0%} of one core{per_event}{lag_text})"
    )
    if "plot" in report:
        out.append(f"plot        {report['plot']}")
    out.append("result      " + ("clean" if report["clean"] else "NOT CLEAN"))
    return "\n".join(out)


def plot(stats: Stats, path: str) -> str:
    """Latency over the run to ``path`` (PNG); matplotlib is imported only here."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return (
            "not written: --plot needs matplotlib (pip install 'agentstream[plot]' or pip install matplotlib)"
        )
    figure, (latency, rate) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    ok = [t for t in stats.timeline if t[3]]
    failed = [t for t in stats.timeline if not t[3]]
    latency.scatter([t[0] for t in ok], [t[2] * 1000 for t in ok], s=6, label="end to end")
    with_ttft = [t for t in stats.timeline if t[1] is not None]
    latency.scatter([t[0] for t in with_ttft], [t[1] * 1000 for t in with_ttft], s=6, label="TTFT")
    if failed:
        top = max((t[2] or 0) * 1000 for t in ok) if ok else 1.0
        latency.scatter([t[0] for t in failed], [top] * len(failed), marker="x", color="red", label="failed")
    latency.set_ylabel("ms")
    latency.set_title("latency by the time the query was sent")
    latency.legend()
    rate.step(range(len(stats.event_bins)), stats.event_bins, where="post")
    rate.set_ylabel("events/s")
    rate.set_xlabel("s since the start")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def parse_args(argv: list[str] | None = None) -> Config:
    """The command line as a :class:`Config`."""
    parser = argparse.ArgumentParser(
        prog="agentstream-load", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", default=DEFAULT_URL, help=f"the service's base URL (default {DEFAULT_URL})")
    parser.add_argument(
        "--api-key",
        default=os.environ.get("AGENTSTREAM_API_KEY"),
        help="sent as Authorization: Bearer (default $AGENTSTREAM_API_KEY)",
    )
    parser.add_argument(
        "--mode", choices=[*MODES, "mixed"], default="sse", help="what each client does (default sse)"
    )
    parser.add_argument("--clients", type=int, default=10, help="concurrent clients (default 10)")
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument(
        "--count", type=int, help="total queries, shared by the clients (default: one per client)"
    )
    budget.add_argument(
        "--duration", type=float, help="seconds during which each client keeps sending queries"
    )
    parser.add_argument(
        "--ramp-up", type=float, default=0.0, help="seconds over which the clients start (default 0)"
    )
    parser.add_argument("--message", default=DEFAULT_MESSAGE, help=f"the query (default {DEFAULT_MESSAGE!r})")
    parser.add_argument(
        "--timeout", type=float, default=120.0, help="seconds one query may take (default 120)"
    )
    parser.add_argument(
        "--queries-per-session",
        type=int,
        default=10,
        help="sse/ws: queries before a client takes a fresh session (default 10)",
    )
    parser.add_argument("--selftest", action="store_true", help="only check the streaming path, no load")
    parser.add_argument("--no-selftest", action="store_true", help="skip the path check before the load")
    parser.add_argument("--selftest-ticks", type=int, default=20, help="ticks of the path check (default 20)")
    parser.add_argument("--selftest-interval-ms", type=int, default=50, help="ms between ticks (default 50)")
    parser.add_argument(
        "--selftest-idle-ms",
        type=int,
        default=2000,
        help="pause before the last tick, to catch idle cuts (default 2000)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress line")
    parser.add_argument("--json", action="store_true", help="print the report as JSON instead of the table")
    parser.add_argument("--plot", metavar="FILE.png", help="latency over time as a PNG (needs matplotlib)")
    args = parser.parse_args(argv)
    if args.clients < 1:
        parser.error("--clients must be at least 1")
    if args.count is not None and args.count < 0:
        parser.error("--count must not be negative")
    if args.duration is not None and args.duration <= 0:
        parser.error("--duration must be positive")
    if args.queries_per_session < 1:
        parser.error("--queries-per-session must be at least 1")
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            parser.error(
                "--plot needs matplotlib: pip install 'agentstream[plot]' (or pip install matplotlib)"
            )
    return Config(
        url=args.url,
        api_key=args.api_key,
        mode=args.mode,
        clients=args.clients,
        count=args.count,
        duration=args.duration,
        ramp_up=args.ramp_up,
        message=args.message,
        timeout=args.timeout,
        queries_per_session=args.queries_per_session,
        selftest=not args.no_selftest,
        selftest_only=args.selftest,
        selftest_ticks=args.selftest_ticks,
        selftest_interval_ms=args.selftest_interval_ms,
        selftest_idle_ms=args.selftest_idle_ms,
        progress=not args.quiet and sys.stderr.isatty(),
        json=args.json,
        plot=args.plot,
    )


def main(argv: list[str] | None = None) -> int:
    """Command line entry point: 0 for a clean run (or a clean path), 1 otherwise."""
    config = parse_args(argv)
    if config.selftest_only:
        result = asyncio.run(run_selftest(config))
        print(json.dumps(result, indent=2) if config.json else "\n".join(result["lines"]))
        return 1 if result["problems"] else 0
    try:
        report = asyncio.run(run(config))
    except KeyboardInterrupt:
        return 130
    print(json.dumps(report, indent=2) if config.json else format_report(report))
    return 0 if report["clean"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
