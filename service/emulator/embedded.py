"""The emulator served from a background thread, for tests, benchmarks and the embedded provider.

:class:`EmbeddedEmulator` runs the app of :mod:`service.emulator.server` on its own thread with
its own event loop, so that its pacing never competes with the loop of the service under test.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from types import TracebackType

from aiohttp import web

from service.emulator.records import RequestRecord
from service.emulator.server import LISTEN_BACKLOG, RECORDS_KEY, EmulatorConfig, create_emulator_app


class EmbeddedEmulator:
    """The emulator served from a background thread with its own event loop."""

    def __init__(
        self,
        config: EmulatorConfig | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        shutdown_timeout: float = 2.0,
    ) -> None:
        self.config = config or EmulatorConfig()
        self.host = host
        self.port = port
        self._shutdown_timeout = shutdown_timeout
        self._app = create_emulator_app(self.config)
        self._store = self._app[RECORDS_KEY]
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None

    @property
    def url(self) -> str:
        """Base URL to give boto3 as ``endpoint_url``."""
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 10.0) -> EmbeddedEmulator:
        """Start serving; return once the socket is bound."""
        if self._thread is not None:
            raise RuntimeError("the emulator is already started")
        self._thread = threading.Thread(target=self._run, name="model-emulator", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError("the emulator did not start in time")
        if self._startup_error is not None:
            self._thread.join()
            raise self._startup_error
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving and join the thread; in-flight streams are cut."""
        thread, loop, stop_event = self._thread, self._loop, self._stop_event
        if thread is None:
            return
        if loop is not None and stop_event is not None:
            try:
                loop.call_soon_threadsafe(stop_event.set)
            except RuntimeError:
                pass  # The loop already ended, e.g. after a failed start.
        thread.join(timeout)
        if thread.is_alive():
            raise TimeoutError("the emulator thread did not stop in time")

    def records(self) -> list[RequestRecord]:
        """A snapshot copy of the kept request records, oldest first."""
        return self._store.snapshot()

    def wait_for(self, predicate: Callable[[RequestRecord], bool], timeout: float = 5.0) -> RequestRecord:
        """Block this thread until a record satisfies ``predicate``; TimeoutError otherwise."""
        return self._store.wait_for(predicate, timeout)

    def __enter__(self) -> EmbeddedEmulator:
        return self.start() if self._thread is None else self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        # handler_cancellation: a client hanging up cancels its handler even mid-sleep.
        # access_log=None: one log line per request is measurable under benchmark load.
        runner = web.AppRunner(
            self._app,
            handler_cancellation=True,
            shutdown_timeout=self._shutdown_timeout,
            access_log=None,
        )
        try:
            await runner.setup()
            site = web.TCPSite(runner, self.host, self.port, backlog=LISTEN_BACKLOG)
            await site.start()
            self.port = runner.addresses[0][1]
        except BaseException as exc:
            self._startup_error = exc
            self._ready.set()
            await runner.cleanup()
            return
        self._ready.set()
        try:
            await self._stop_event.wait()
        finally:
            await runner.cleanup()
