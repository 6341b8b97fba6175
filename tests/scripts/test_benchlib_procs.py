"""The benchmarks' reading of a server's processes from /proc: a parent and its workers, their threads."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support._pipes import PipeDrain

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from benchlib.procs import connections_to, process_tree, thread_count  # noqa: E402

# A parent that starts a worker process and a second thread, then says the worker's pid.
PARENT = """
import subprocess, sys, threading
worker = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
threading.Thread(target=sys.stdin.read, daemon=True).start()
print("worker", worker.pid, flush=True)
sys.stdin.read()
worker.stdin.close()
worker.wait()
"""


@pytest.fixture
def parent() -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    child = subprocess.Popen(
        [sys.executable, "-c", PARENT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    assert child.stdout is not None and child.stdin is not None
    output = PipeDrain(child.stdout, "parent", marker=lambda line: line.startswith("worker "))
    try:
        assert output.wait_ready(30), output.tail()
        assert output.ready_line is not None
        yield child, int(output.ready_line.split()[1])
    finally:
        child.stdin.close()
        child.wait(10)


def test_process_tree_holds_the_workers(parent: tuple[subprocess.Popen[bytes], int]) -> None:
    child, worker = parent
    assert process_tree(child.pid) == [child.pid, worker]
    assert process_tree(worker) == [worker]


def test_thread_count(parent: tuple[subprocess.Popen[bytes], int]) -> None:
    child, worker = parent
    assert thread_count(child.pid) >= 2  # the main thread and the one it started
    assert thread_count(worker) == 1


def test_thread_count_of_a_process_gone() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert thread_count(gone.pid) == 0


def test_connections_to_counts_the_established_ones_to_a_port() -> None:
    import os
    import socket

    with socket.create_server(("127.0.0.1", 0)) as server, socket.create_server(("127.0.0.1", 0)) as other:
        port = server.getsockname()[1]
        before = connections_to(os.getpid(), port)
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
        elsewhere = socket.create_connection(other.getsockname())
        accepted = [server.accept()[0] for _ in clients]
        try:
            # the three to the port, not the one to another port nor the accepted ends (their
            # remote port is the clients' own)
            assert connections_to(os.getpid(), port) == before + 3
            clients.pop().close()
            accepted.pop().close()
            assert connections_to(os.getpid(), port) == before + 2
        finally:
            for sock in [*clients, *accepted, elsewhere]:
                sock.close()
    assert connections_to(2**22 + 7, port) == 0  # no such process
