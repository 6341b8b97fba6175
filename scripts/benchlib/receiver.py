"""The OTLP/HTTP receiver of ``benchlib/otlp.py`` as a child process, and what a benchmark asks
of it: the spans counted so far, and a wait until every query so far has been exported."""

from __future__ import annotations

import asyncio
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Self

import aiohttp

from benchlib import ROOT
from benchlib.procs import free_port, process, wait_until_up

RECEIVER = Path(__file__).resolve().parent / "otlp.py"
# The spans every query exports whatever it does: its server span and its invoke_agent span.
QUERY_SPANS = ("POST ", "invoke_agent ")


class SpanReceiver:
    """``async with SpanReceiver() as receiver``: the receiver up at ``receiver.endpoint`` (for
    ``OTEL_EXPORTER_OTLP_ENDPOINT``), stopped after the block."""

    def __init__(self, log: Path | None = None) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log = log
        self._processes = ExitStack()

    async def __aenter__(self) -> Self:
        args = [sys.executable, str(RECEIVER), "--port", str(self.port)]
        child = self._processes.enter_context(process(args, cwd=ROOT, log=self.log))
        try:
            await wait_until_up(self.endpoint + "/spans", child=child)
        except BaseException:
            self._processes.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._processes.close()

    async def counts(self) -> dict[str, int]:
        """The spans received so far, by name."""
        async with aiohttp.ClientSession() as http, http.get(self.endpoint + "/spans") as response:
            return (await response.json())["by_name"]

    async def wait_for_queries(self, queries: int, timeout: float = 60.0) -> bool:
        """Wait until the receiver holds the server and ``invoke_agent`` spans of ``queries``
        queries (the batch processor exports on its own schedule, 5 s by default, or at 512
        spans); False if they did not all come within ``timeout`` (spans dropped)."""
        deadline = time.monotonic() + timeout
        while True:
            counts = await self.counts()
            seen = min(sum(n for name, n in counts.items() if name.startswith(p)) for p in QUERY_SPANS)
            if seen >= queries:
                return True
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.05)
