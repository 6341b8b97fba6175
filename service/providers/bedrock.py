"""Amazon Bedrock ConverseStream through boto3, read in worker threads.

boto3 blocks, so each stream is read in a thread from an executor sized for the configured
number of concurrent runs (botocore's connection pool is sized to match). The thread hands
events to the event loop in batches: it schedules one wake-up per batch instead of one per
event, which keeps the loop's lag low when hundreds of streams are live. Closing the async
iterator (the client went away, the run was cancelled) shuts the upstream socket down, which
wakes the blocked read at once, so the thread is freed without waiting for the next token.

:meth:`BedrockProvider.stream` feeds those events to
:class:`~service.providers.bedrock_stream.BedrockStreamParser`: the turn's canonical events,
then its result.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import socket
import threading
from collections.abc import AsyncGenerator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import NoRegionError

from service.core.events import Event
from service.errors import ProviderError
from service.providers.base import ModelRequest, TurnResult, alternate_roles, parse_stream
from service.providers.bedrock_stream import BedrockStreamParser, stream_error_from_exception

log = logging.getLogger(__name__)

_END = object()


class _Failure:
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class _Bridge:
    """Carries items from a worker thread to the event loop with one wake-up per batch."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._items: collections.deque[Any] = collections.deque()
        self._lock = threading.Lock()
        self._wake_pending = False
        self._ready = asyncio.Event()

    def put(self, item: Any) -> None:
        """Called from the worker thread."""
        self._items.append(item)
        with self._lock:
            if self._wake_pending:
                return
            self._wake_pending = True
        try:
            self._loop.call_soon_threadsafe(self._wake)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass

    def _wake(self) -> None:
        with self._lock:
            self._wake_pending = False
        self._ready.set()

    async def get_batch(self) -> list[Any]:
        """Everything the thread has put so far; waits while there is nothing."""
        while True:
            if self._items:
                batch = list(self._items)
                for _ in range(len(batch)):
                    self._items.popleft()
                return batch
            self._ready.clear()
            if self._items:
                continue
            await self._ready.wait()


class _Upstream:
    """The boto3 event stream of one request, closable from the event loop's thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stream: Any = None
        self.aborted = False

    def attach(self, stream: Any) -> bool:
        """Remember the stream; False if the reader already went away."""
        with self._lock:
            self._stream = stream
            return not self.aborted

    def abort(self) -> None:
        """Shut the socket down so that a read blocked in the worker thread returns now."""
        with self._lock:
            self.aborted = True
            stream = self._stream
        if stream is None:
            return
        sock = _socket_of(stream)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _socket_of(event_stream: Any) -> socket.socket | None:
    """The socket under a botocore EventStream (urllib3 2.x), or None if it can't be found."""
    raw = getattr(event_stream, "_raw_stream", None)
    connection = getattr(raw, "_connection", None)
    sock = getattr(connection, "sock", None)
    if isinstance(sock, socket.socket):
        return sock
    fp = getattr(getattr(raw, "_fp", None), "fp", None)
    sock = getattr(getattr(fp, "raw", None), "_sock", None)
    return sock if isinstance(sock, socket.socket) else None


class BedrockProvider:
    """ConverseStream on Bedrock (or anything that speaks its wire format, like the emulator)."""

    name = "bedrock"

    def __init__(
        self,
        *,
        model_id: str,
        max_concurrent_runs: int = 256,
        endpoint_url: str | None = None,
        region_name: str | None = None,
        credentials: dict[str, str] | None = None,
        max_attempts: int = 3,
        read_timeout: float = 120.0,
        connect_timeout: float = 10.0,
    ) -> None:
        self.model_id = model_id
        config = Config(
            max_pool_connections=max_concurrent_runs,
            retries={"mode": "standard", "max_attempts": max_attempts},
            read_timeout=read_timeout,
            connect_timeout=connect_timeout,
            tcp_keepalive=True,
        )
        session = boto3.session.Session(region_name=region_name, **(credentials or {}))
        kwargs: dict[str, Any] = {"config": config}
        if session.region_name is None and os.environ.get("AWS_REGION"):
            # botocore reads AWS_DEFAULT_REGION; AWS_REGION is what other SDKs and Lambda set.
            kwargs["region_name"] = os.environ["AWS_REGION"]
        # Pass an endpoint only when one is configured, so boto3's own
        # AWS_ENDPOINT_URL_BEDROCK_RUNTIME keeps working.
        if endpoint_url:
            kwargs["endpoint_url"] = endpoint_url
        try:
            self._client = session.client("bedrock-runtime", **kwargs)
        except NoRegionError:
            raise ProviderError(
                "no AWS region is configured for Bedrock: set AWS_DEFAULT_REGION (or AWS_REGION, "
                "or a region in ~/.aws/config)",
                code="no_region",
            ) from None
        self._executor = ThreadPoolExecutor(
            max_workers=max_concurrent_runs, thread_name_prefix="bedrock-stream"
        )
        self._active = 0
        self._active_lock = threading.Condition()

    @property
    def active_streams(self) -> int:
        """Worker threads currently reading a stream."""
        return self._active

    def wait_idle(self, timeout: float) -> bool:
        """Block until no worker thread reads a stream; False on timeout (for tests and drain)."""
        with self._active_lock:
            return self._active_lock.wait_for(lambda: self._active == 0, timeout)

    @property
    def region(self) -> str:
        """The AWS region the client talks to."""
        return self._client.meta.region_name

    def request_kwargs(self, request: ModelRequest) -> dict[str, Any]:
        """The arguments of ``converse_stream`` for one turn."""
        kwargs: dict[str, Any] = {
            "modelId": self.model_id,
            "messages": alternate_roles(request.messages),
            "inferenceConfig": {"maxTokens": request.max_tokens},
        }
        if request.system:
            kwargs["system"] = [{"text": request.system}]
        if request.tool_specs:
            kwargs["toolConfig"] = {
                "tools": [
                    {
                        "toolSpec": {
                            "name": spec["name"],
                            "description": spec["description"],
                            "inputSchema": {"json": spec["input_schema"]},
                        }
                    }
                    for spec in request.tool_specs
                ]
            }
        return kwargs

    def stream(self, request: ModelRequest, turn: int = 1) -> AsyncGenerator[Event | TurnResult, None]:
        """One turn's canonical events, then its result; errors are raised as :class:`ProviderError`."""
        return parse_stream(self.raw_stream(request), BedrockStreamParser(turn=turn))

    async def raw_stream(self, request: ModelRequest) -> AsyncGenerator[dict[str, Any], None]:
        """Yield ConverseStream events; errors are raised as :class:`ProviderError`."""
        kwargs = self.request_kwargs(request)
        bridge = _Bridge(asyncio.get_running_loop())
        upstream = _Upstream()
        self._executor.submit(self._pump, kwargs, bridge, upstream)
        try:
            while True:
                for item in await bridge.get_batch():
                    if item is _END:
                        return
                    if isinstance(item, _Failure):
                        raise stream_error_from_exception(item.exc) from item.exc
                    yield item
        finally:
            upstream.abort()

    def _pump(self, kwargs: dict[str, Any], bridge: _Bridge, upstream: _Upstream) -> None:
        """Worker thread: call Bedrock, read its stream, hand events over."""
        with self._active_lock:
            self._active += 1
        stream = None
        try:
            if upstream.aborted:
                return
            response = self._client.converse_stream(**kwargs)
            stream = response["stream"]
            if not upstream.attach(stream):
                return
            for event in stream:
                if upstream.aborted:
                    break
                bridge.put(event)
        except Exception as exc:
            if not upstream.aborted:
                bridge.put(_Failure(exc))
        finally:
            if stream is not None:
                try:
                    stream.close()
                except Exception:  # closing a socket we shut down ourselves may complain
                    log.debug("closing the upstream stream failed", exc_info=True)
            bridge.put(_END)
            with self._active_lock:
                self._active -= 1
                self._active_lock.notify_all()

    async def close(self) -> None:
        """Stop the worker threads (they end as their streams end) and close the client."""
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._client.close()
