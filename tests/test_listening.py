"""A burst of new connections is queued by the kernel, not dropped.

A listening socket's backlog bounds the connections the kernel has accepted and the process has not
yet taken; past it, SYNs are dropped and the clients retry after 1, 3 and 7 s. With aiohttp's
default of 128, a few hundred clients connecting at once (a reconnecting load balancer, a page of
users after a deploy, the benchmark's batch of 1,000 on two workers) waited seconds for a service
that was half idle. Each process here is stopped (SIGSTOP) so that it takes no connection at all:
every one of the burst must still complete its handshake, which only the kernel's queue can do.
"""

from __future__ import annotations

import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support._pipes import PipeDrain, free_port
from tests.support.instances import ServiceProcess

ROOT = Path(__file__).resolve().parents[1]
AIOHTTP_DEFAULT_BACKLOG = 128


def somaxconn() -> int:
    try:
        return int(Path("/proc/sys/net/core/somaxconn").read_text())
    except (OSError, ValueError):
        return 0


def burst_size() -> int:
    """More connections than aiohttp's default queue holds, within what the kernel allows."""
    size = min(400, somaxconn() - 16)
    if size <= AIOHTTP_DEFAULT_BACKLOG + 16:
        pytest.skip(f"net.core.somaxconn is {somaxconn()}: the kernel caps every backlog near aiohttp's")
    return size


def handshakes_completed(port: int, count: int, timeout: float = 10.0) -> int:
    """Open ``count`` connections to ``port`` at once; how many complete their handshake in ``timeout``."""
    selector = selectors.DefaultSelector()
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", port))
            selector.register(sock, selectors.EVENT_WRITE)
            sockets.append(sock)
        done = 0
        deadline = time.monotonic() + timeout
        while done < count and (left := deadline - time.monotonic()) > 0:
            for key, _ in selector.select(left):
                selector.unregister(key.fileobj)
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                    done += 1
        return done
    finally:
        selector.close()
        for sock in sockets:
            sock.close()


@contextmanager
def stopped(pid: int) -> Iterator[None]:
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


@pytest.mark.slow
def test_the_service_queues_a_burst_of_connections_while_busy() -> None:
    count = burst_size()
    with ServiceProcess({"AGENT_DATABASE_URL": ""}) as service:
        assert service.process is not None and service.port is not None
        with stopped(service.process.pid):
            assert handshakes_completed(service.port, count) == count


def test_the_emulator_queues_a_burst_of_connections_while_busy() -> None:
    count = burst_size()
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "service.emulator", "--port", str(port)],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    assert process.stdout is not None
    output = PipeDrain(process.stdout, "emulator", lambda line: "Running on" in line)
    try:
        assert output.wait_ready(30), output.tail(20)
        with stopped(process.pid):
            assert handshakes_completed(port, count) == count
    finally:
        process.terminate()
        process.wait(15)
