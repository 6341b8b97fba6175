"""The client-side SSE reader (``service/loadtest/sse.py``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from service.loadtest.sse import FrameSplitter, MarkCounter, SSEParser, iter_events, read_batches, read_events

ROOT = Path(__file__).resolve().parent.parent.parent


def test_sse_parser_across_chunk_boundaries() -> None:
    stream = (
        b'retry: 1000\r\nid: 7\r\nevent: assistant_text\r\ndata: {"a":1}\r\n\r\n'
        b": ping\r\n\r\nevent: heartbeat\r\ndata: {}\r\n\r\n"
        b"id: 8\nevent: done\ndata: x\ndata: y\n\n"
    )
    expected = [("assistant_text", "7", '{"a":1}'), ("heartbeat", None, "{}"), ("done", "8", "x\ny")]
    for size in (1, 2, 3, 7, len(stream)):
        parser = SSEParser()
        events = []
        for start in range(0, len(stream), size):
            events += parser.feed(stream[start : start + size])
        events += parser.close()
        assert events == expected, size


def test_parser_ends_the_event_the_last_chunk_left_open() -> None:
    parser = SSEParser()
    assert parser.feed(b"event: a\ndata: 1\n\nevent: b\ndata: 2") == [("a", None, "1")]
    assert parser.close() == [("b", None, "2")]
    assert parser.close() == []


async def test_read_events_goes_on_where_an_earlier_loop_stopped() -> None:
    reader = Chunks([b"id: 1\ndata: a\n\nid: 2\nda", b"ta: b\n\n: ping\n\n", b"data: c\n\n"])
    events = read_events(reader)
    async for event in events:
        assert event == ("message", "1", "a")
        break
    assert [event async for event in events] == [("message", "2", "b"), ("message", None, "c")]


async def test_read_batches_gives_one_list_per_read() -> None:
    reader = Chunks([b"data: a\n\ndata: b\n\n", b": ping\n\n", b"data: c", b"\n\n"])
    assert [batch async for batch in read_batches(reader)] == [
        [("message", None, "a"), ("message", None, "b")],
        [],
        [],
        [("message", None, "c")],
    ]


def test_iter_events_reads_a_blocking_stream_line_by_line() -> None:
    lines = [b'data: {"type":"text_delta"}\r\n', b"\r\n", b'data: {"type":"done"}\r\n', b"\r\n"]
    assert [data for _, _, data in iter_events(lines)] == ['{"type":"text_delta"}', '{"type":"done"}']


def test_the_reader_needs_no_aiohttp() -> None:
    code = "import sys; sys.modules['aiohttp'] = None; import service.loadtest.sse"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr


@given(
    st.binary(max_size=200).map(lambda b: bytes(STREAM_BYTES[x % len(STREAM_BYTES)] for x in b)), st.data()
)
def test_mark_counter_counts_as_if_the_stream_were_one_piece(stream: bytes, data: st.DataObject) -> None:
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=20)))
    for mark, start in ((b"\r\n\r\n", b""), (b"\nid:", b"\n"), (b"x", b"")):
        counter = MarkCounter(mark, start)
        counted = sum(counter.feed(piece) for piece in pieces(stream, cuts))
        assert counted == (start + stream).count(mark)


@given(
    st.binary(max_size=200).map(lambda b: bytes(STREAM_BYTES[x % len(STREAM_BYTES)] for x in b)), st.data()
)
def test_frame_splitter_hands_over_whole_frames_in_order(stream: bytes, data: st.DataObject) -> None:
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=20)))
    splitter = FrameSplitter()
    frames = [splitter.feed(piece) for piece in pieces(stream, cuts)]
    assert all(not f or f.endswith(b"\r\n\r\n") for f in frames)
    whole = b"".join(frames)
    assert stream.startswith(whole) and b"\r\n\r\n" not in stream[len(whole) :]
    assert whole.endswith(b"\r\n\r\n") or not whole


STREAM_BYTES = b"\r\nid:x"


def pieces(stream: bytes, cuts: list[int]) -> list[bytes]:
    """``stream`` cut at ``cuts`` (sorted offsets), empty pieces included."""
    bounds = [0, *cuts, len(stream)]
    return [stream[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


class Chunks:
    """A stand-in for aiohttp's ``StreamReader``: ``readany()`` hands out the chunks, then ``b""``."""

    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = list(chunks)

    async def readany(self) -> bytes:
        """The next chunk, or the end."""
        return self._chunks.pop(0) if self._chunks else b""
