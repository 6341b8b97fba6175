"""Running the protocols' own JavaScript clients (tests/node/) from a test.

The scripts there import npm packages installed by ``npm ci`` in tests/node (``.ci/run`` does
it). Without ``node`` or those packages a test cannot run: in CI (``CI=true``) that is a failure,
elsewhere a skip that says what to do.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

NODE_DIR = Path(__file__).resolve().parents[1] / "node"
PACKAGES = ("ai", "@ag-ui/client")
NODE_TIMEOUT_S = 60.0


def node_unavailable(reason: str) -> None:
    """In CI a Node test must run: a missing Node is a failure there, a skip elsewhere."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"Node client tests cannot run in CI: {reason}")
    pytest.skip(reason)


def require_node() -> str:
    """The ``node`` binary, once the client packages are installed (or a skip / CI failure)."""
    node = shutil.which("node")
    if node is None:
        node_unavailable("no `node` on PATH (install Node.js 20 or later)")
    missing = [name for name in PACKAGES if not (NODE_DIR / "node_modules" / name / "package.json").exists()]
    if missing:
        node_unavailable(f"npm packages {', '.join(missing)} are not installed: run `npm ci` in {NODE_DIR}")
    return node  # type: ignore[return-value]


async def run_node(script: str, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``tests/node/<script>`` with ``args``; its one JSON line of results (stderr on failure)."""
    node = require_node()
    process = await asyncio.create_subprocess_exec(
        node,
        str(NODE_DIR / script),
        *args,
        cwd=NODE_DIR,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )
    try:
        async with asyncio.timeout(NODE_TIMEOUT_S):
            stdout, stderr = await process.communicate()
    except TimeoutError:
        process.kill()
        await process.wait()
        raise AssertionError(f"{script} did not finish within {NODE_TIMEOUT_S} s") from None
    assert process.returncode == 0, f"{script} failed ({process.returncode}):\n{stderr.decode()}"
    return json.loads(stdout.decode().strip().splitlines()[-1])
