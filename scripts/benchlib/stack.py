"""The emulator and the service as one unit, and the service as of another git ref (``--baseline``)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from benchlib import ROOT
from benchlib.procs import ProcessGroup, free_port, log_file


class ServiceStack(ProcessGroup):
    """The emulator and the service (from ``source``, a checkout) pointed at it, for one scenario.

    As in production: the service reaches the emulator as it would Bedrock (``AGENT_PROVIDER``
    ``bedrock``, boto3's ``AWS_ENDPOINT_URL_BEDROCK_RUNTIME``) or, with ``AGENT_PROVIDER=openai``
    in ``env``, over its OpenAI-compatible route. ``service_cpu`` and ``emulator_cpu`` pin them;
    under ``logs`` each writes its output to a file of its own (``service_log``); ``service_args``
    go on ``python -m service``'s command line (``--workers 2``, say).
    """

    def __init__(
        self,
        env: dict[str, str] | None = None,
        *,
        source: Path = ROOT,
        emulator_args: list[str] | None = None,
        service_cpu: int | None = None,
        emulator_cpu: int | None = None,
        logs: Path | None = None,
        service_args: list[str] | None = None,
    ) -> None:
        super().__init__()
        self.emulator_port, self.port = free_port(), free_port()
        self.emulator_url = f"http://127.0.0.1:{self.emulator_port}"
        self.url = f"http://127.0.0.1:{self.port}"
        self.source = source
        self.service_args = service_args or []
        self.service_cpu, self.emulator_cpu = service_cpu, emulator_cpu
        self.emulator_cmd = [
            sys.executable,
            "-m",
            "service.emulator",
            "--port",
            str(self.emulator_port),
            *(emulator_args or []),
        ]
        self.env = {
            "AGENT_PROVIDER": "bedrock",
            "AGENT_PORT": str(self.port),
            "AWS_ENDPOINT_URL_BEDROCK_RUNTIME": self.emulator_url,
            "AGENT_OPENAI_BASE_URL": self.emulator_url + "/v1",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": "bench",
            "AWS_SECRET_ACCESS_KEY": "bench",
            **(env or {}),
        }
        if source != ROOT:
            self.env["PYTHONPATH"] = str(source)
        self.service_log = log_file(logs, "service")
        self.emulator_log = log_file(logs, "emulator")
        self.pid = 0
        self.emulator_pid = 0

    def launch(self) -> list[tuple[str, subprocess.Popen[bytes]]]:
        """Start the emulator and the service."""
        # The emulator always comes from the current tree: only the service is compared.
        emulator = self.start(self.emulator_cmd, cpu=self.emulator_cpu, log=self.emulator_log)
        service = self.start(
            [sys.executable, "-m", "service", *self.service_args],
            self.env,
            cwd=self.source,
            cpu=self.service_cpu,
            log=self.service_log,
        )
        self.emulator_pid, self.pid = emulator.pid, service.pid
        return [(self.emulator_url + "/_emulator/records", emulator), (self.url + "/healthz", service)]


@contextlib.contextmanager
def baseline_tree(ref: str) -> Iterator[Path]:
    """``ref`` checked out in a temporary worktree, removed afterwards."""
    parent = Path(tempfile.mkdtemp(prefix="agentstream-baseline-"))
    tree = parent / "tree"
    subprocess.run(
        ["git", "worktree", "add", "--detach", str(tree), ref], cwd=ROOT, check=True, capture_output=True
    )
    try:
        where = subprocess.run(
            [sys.executable, "-c", "import service; print(service.__file__)"],
            cwd=tree,
            env={**os.environ, "PYTHONPATH": str(tree)},
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        if not Path(where).resolve().is_relative_to(tree.resolve()):
            raise RuntimeError(f"the baseline imports the service from {where}, not from {tree}")
        yield tree
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)
        subprocess.run(["git", "worktree", "prune"], cwd=ROOT, capture_output=True)
        shutil.rmtree(parent, ignore_errors=True)


def git_version() -> str:
    """The commit the service ran from, ``-dirty`` when the tree had changes."""
    try:
        done = subprocess.run(
            ["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True, timeout=10
        )
        return done.stdout.strip() or "unknown"
    except OSError:
        return "unknown"
