"""The client side of Server-Sent Events: the one reader of the load tool, the scripts and the benchmarks.

Standard library only, so that ``scripts/stream_client.py`` stays free of third-party packages; the
async helpers take anything with aiohttp's ``readany()`` without importing aiohttp.

- :class:`SSEParser` is the reader: bytes in, whole events out, across any chunk boundary.
- :func:`read_batches` and :func:`read_events` run it over a stream (aiohttp's ``response.content``),
  :func:`iter_events` over a blocking one (``urllib``'s response).
- :class:`MarkCounter` and :class:`FrameSplitter` parse nothing: a benchmark client that reads
  hundreds of streams counts frame ends or ``id:`` lines in the raw bytes, or cuts complete frames
  for a regular expression, so that it stays cheaper than the server it measures.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Protocol

# (event name, id or None, data): the event name is "message" when the frame has no ``event:``.
Event = tuple[str, str | None, str]

COLON = 58  # b":"[0]: a line that starts with it is a comment (a keep-alive)


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

    def feed(self, chunk: bytes) -> list[Event]:
        """The events that ``chunk`` completes."""
        if self._tail:
            chunk = self._tail + chunk
        lines = chunk.splitlines(keepends=True)
        # An unfinished line (or a lone CR that may be half of CRLF) waits for the next chunk.
        if lines and not lines[-1].endswith(b"\n"):
            self._tail = lines.pop()
        else:
            self._tail = b""
        return self._lines(lines)

    def close(self) -> list[Event]:
        """The end of the stream: what the last chunk left unfinished."""
        tail, self._tail = self._tail, b""
        return self._lines([tail, b"\n"] if tail else [])

    def _lines(self, lines: list[bytes]) -> list[Event]:
        events: list[Event] = []
        for raw in lines:
            line = raw.rstrip(b"\r\n")
            if not line:
                if self._data is not None:
                    events.append((self._event or "message", self._id, self._data))
                self._event, self._id, self._data = "", None, None
                continue
            if line[0] == COLON:
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


class ChunkReader(Protocol):
    """What the async helpers read from: aiohttp's ``StreamReader`` (``response.content``)."""

    async def readany(self) -> bytes:
        """The next bytes that arrived; empty at the end of the stream."""
        ...


async def read_batches(content: ChunkReader) -> AsyncIterator[list[Event]]:
    """The events each network read completes (often none), to the end of the stream.

    One list per read, so that a caller can take the time of arrival once per read, or look at a
    deadline even while only keep-alive comments arrive.
    """
    parser = SSEParser()
    while chunk := await content.readany():
        yield parser.feed(chunk)
    if last := parser.close():
        yield last


async def read_events(content: ChunkReader) -> AsyncIterator[Event]:
    """Each event of the stream, in order, as it completes.

    Leaving the loop early leaves the rest of the stream unread: a later ``async for`` over the
    same iterator goes on where the first stopped, with nothing lost in between.
    """
    async for batch in read_batches(content):
        for event in batch:
            yield event


def iter_events(chunks: Iterable[bytes]) -> Iterator[Event]:
    """Each event of a blocking stream (a ``urllib`` response yields its lines)."""
    parser = SSEParser()
    for chunk in chunks:
        yield from parser.feed(chunk)
    yield from parser.close()


class MarkCounter:
    """Counts a byte mark in a stream of chunks, including a mark split across two of them.

    ``MarkCounter(b"\\r\\n\\r\\n")`` counts frame ends (aiohttp-sse and sse-starlette end frames
    with CRLF CRLF); ``MarkCounter(b"\\nid:", start=b"\\n")`` counts ``id:`` lines, the first line
    of the stream included.
    """

    __slots__ = ("_mark", "_keep", "_tail")

    def __init__(self, mark: bytes, start: bytes = b"") -> None:
        self._mark = mark
        self._keep = len(mark) - 1  # the most of a mark that can wait at the end of a chunk
        self._tail = start

    def feed(self, chunk: bytes) -> int:
        """How many marks ``chunk`` completes."""
        buffer = self._tail + chunk
        keep_from = max(0, len(buffer) - self._keep)
        last = buffer.rfind(self._mark, max(0, keep_from - self._keep))
        if last >= 0:  # a mark counted now must not be counted again with the next chunk
            keep_from = max(keep_from, last + len(self._mark))
        self._tail = buffer[keep_from:]
        return buffer.count(self._mark)


class FrameSplitter:
    """Cuts a stream of chunks after its last complete frame: the frames out, the rest kept."""

    __slots__ = ("_end", "_tail")

    def __init__(self, end: bytes = b"\r\n\r\n") -> None:
        self._end = end
        self._tail = b""

    def feed(self, chunk: bytes) -> bytes:
        """The frames ``chunk`` completes, as one piece of bytes (empty when it completes none)."""
        buffer = self._tail + chunk
        cut = buffer.rfind(self._end)
        if cut < 0:
            self._tail = buffer
            return b""
        cut += len(self._end)
        self._tail = buffer[cut:]
        return buffer[:cut]
