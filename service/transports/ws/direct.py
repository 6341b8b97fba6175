"""A WebSocket's frames written from the side that appends to a log, while the socket keeps up.

A subscription's pump reads its session's log and queues frames in the socket's outbox, which its
writer task sends: two task wake-ups per event and per socket. With thousands of sockets on one
session, that is most of the core's work (docs/benchmarks.md, section Ten thousand viewers). So
while a socket's outbox is empty, its writer idle and its transport's buffer low, the log hands new
entries to the subscription (``deliver``, or a coalescing window's with ``deliver_many``, see
:mod:`service.core.direct`) and they are written here at once, as the SSE streams are; anything
else (a backlog, an acknowledgement waiting, a closing socket) declines, and the entries come
through the pump and the outbox as before, in order.

A window's text deltas go as one merged frame (with the last one's id), as a lagging reader's
batch already does, made once for every socket following the session, and so are its frames'
bytes on the wire: each socket is handed the same bytes in one write.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from aiohttp import web

from service.core.direct import Deliver, DeliverMany
from service.core.entry import LogEntry
from service.transports.stream.session import merge_text_runs, ws_frame
from service.transports.stream.writes import takes_at_once

Frame = str


class SocketWrites:
    """What may be written to one socket at once, and the writing (see the module docstring)."""

    __slots__ = ("_outbox_size", "sending", "transport", "ws")

    def __init__(self, ws: web.WebSocketResponse, transport: Any, outbox_size: Any) -> None:
        self.ws = ws
        self.transport = transport
        self._outbox_size = outbox_size  # the outbox's qsize: frames queued go first
        self.sending = False  # the writer task is sending what it took from the outbox

    def _can_take(self, size: int) -> bool:
        """Nothing is ahead of ``size`` more bytes and the socket can take them at once."""
        transport = self.transport
        if self.sending or self._outbox_size() or transport is None or self.ws.closed:
            return False
        return takes_at_once(transport, size)

    def now(self, frames: list[Frame]) -> bool:
        """Send ``frames`` without waiting if nothing is ahead of them and the socket can take
        them; False (nothing sent) otherwise."""
        if not self._can_take(sum(map(len, frames))):
            return False
        for frame in frames:
            sending = self.ws.send_str(frame)
            try:
                sending.send(None)
            except StopIteration:
                continue
            except Exception:
                return False  # the socket went away: the pump's own write meets it too
            # It stopped to wait for the transport to drain, after handing the frame over.
            sending.close()
        return True

    def delivery(
        self,
        session_id: str,
        frame: Callable[[str, LogEntry], Frame],
        written: Callable[[int, int], None],
    ) -> tuple[Deliver, DeliverMany]:
        """What a subscription to ``session_id`` hands the log: an entry's frame (``frame``), or
        a window's, written at once when the socket can take them; ``written`` hears how many
        frames went and the last id they carry."""

        def deliver(entry: LogEntry) -> bool:
            if not self.now([frame(session_id, entry)]):
                return False
            written(1, entry.id)
            return True

        def deliver_many(entries: list[LogEntry], shared: dict[Any, Any]) -> bool:
            count, wire = window_wire(session_id, entries, shared)
            if not self._can_take(len(wire)):
                return False
            self.transport.write(wire)  # aiohttp's writer counts bytes only to know when to drain
            written(count, entries[-1].id)
            return True

        return deliver, deliver_many


def window_wire(session_id: str, entries: list[LogEntry], shared: dict[Any, Any]) -> tuple[int, bytes]:
    """The frames of a window of entries for every socket following the session, its text deltas
    merged: how many, and their bytes on the wire, made once per window."""
    key = ("ws", session_id, entries[0].id)
    made = shared.get(key)
    if made is None:
        frames = [ws_frame(session_id, data) for _, _, data in merge_text_runs(entries)]
        made = shared[key] = (len(frames), wire_bytes(frames))
    return made  # type: ignore[no-any-return]


def wire_bytes(frames: list[Frame]) -> bytes:
    """``frames`` as a server writes them uncompressed (RFC 6455 5.2: final text frames,
    unmasked). The service's sockets never negotiate compression, and where one had, an
    uncompressed message would still be valid on it (RFC 7692 6: RSV1 clear)."""
    parts = []
    for frame in frames:
        payload = frame.encode()
        size = len(payload)
        if size < 126:
            parts.append(bytes((0x81, size)))
        elif size < 65536:
            parts.append(struct.pack("!BBH", 0x81, 126, size))
        else:
            parts.append(struct.pack("!BBQ", 0x81, 127, size))
        parts.append(payload)
    return b"".join(parts)
