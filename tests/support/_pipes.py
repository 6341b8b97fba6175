"""Child processes for tests: free ports, and pipes drained on a thread so a child never blocks on them."""

from __future__ import annotations

import socket
import threading
from collections import deque
from collections.abc import Callable
from typing import IO


class ProcessStartError(RuntimeError):
    """A child process exited, or never said it was ready, before its deadline."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class PipeDrain:
    """Reads one pipe of a child line by line on a daemon thread until EOF, keeping the last lines.

    ``marker`` picks the line that means "ready"; :meth:`wait_ready` blocks on a condition (no
    polling) until that line arrives, the pipe closes, or the deadline passes.
    """

    def __init__(self, stream: IO[bytes], name: str, marker: Callable[[str], bool] | None = None) -> None:
        self._stream = stream
        self._marker = marker
        self._lines: deque[str] = deque(maxlen=400)
        self._condition = threading.Condition()
        self._closed = False
        self.ready_line: str | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for raw in iter(self._stream.readline, b""):
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                with self._condition:
                    self._lines.append(line)
                    if self.ready_line is None and self._marker is not None and self._marker(line):
                        self.ready_line = line
                    self._condition.notify_all()  # for wait_ready and wait_lines
        finally:
            self._stream.close()
            with self._condition:
                self._closed = True
                self._condition.notify_all()

    def wait_ready(self, timeout: float) -> bool:
        """True once the marker line has been read; False when the pipe closed or time ran out first."""
        with self._condition:
            self._condition.wait_for(lambda: self.ready_line is not None or self._closed, timeout)
            return self.ready_line is not None

    def wait_lines(self, match: Callable[[str], bool], count: int, timeout: float) -> list[str]:
        """The kept lines that ``match``, once there are ``count`` of them (fewer: the pipe closed or
        time ran out first)."""
        with self._condition:
            self._condition.wait_for(lambda: self._closed or sum(map(match, self._lines)) >= count, timeout)
            return [line for line in self._lines if match(line)]

    def join(self, timeout: float = 5.0) -> None:
        """Wait for EOF (the child has exited and the last lines are read)."""
        self._thread.join(timeout)

    def tail(self, lines: int = 40) -> str:
        with self._condition:
            return "\n".join(list(self._lines)[-lines:])
