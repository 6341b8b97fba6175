"""Running the protocols' own JavaScript clients (tests/node/) from a test.

The scripts there import npm packages installed by ``npm ci`` in tests/node (``.ci/run`` does
it). Without ``node`` or those packages a test cannot run: in CI (``CI=true``) that is a failure,
elsewhere a skip that says what to do.

The AI SDK's scripts import ``#ai``: npm ``ai`` 6 by default, ``ai`` 7 (installed as ``ai7``)
under Node's ``--conditions=ai7``; those on OpenAI's Responses API import ``#openai`` likewise,
``@ai-sdk/openai`` 3 or 4 (installed as ``ai-sdk-openai4``), the provider of each ``ai``. ``ai`` 7 needs Node 22; where the machine's Node is older, the
one the npm registry's ``node`` package installed in tests/node runs it.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

NODE_DIR = Path(__file__).resolve().parents[1] / "node"
PACKAGES = ("ai", "ai7", "@ag-ui/client", "@ai-sdk/openai", "ai-sdk-openai4")
AI_MAJORS = (6, 7)
NODE_FOR_AI = {6: 20, 7: 22}  # the least Node major each ai major runs on
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


@functools.cache
def node_major(node: str) -> int:
    """The major version of the ``node`` binary at that path."""
    version = subprocess.run([node, "--version"], capture_output=True, text=True, check=True).stdout
    return int(version.strip().lstrip("v").split(".")[0])


def node_for(ai: int) -> str:
    """A ``node`` that runs npm ``ai`` of that major: the machine's, or tests/node's own Node 22."""
    node = require_node()
    need = NODE_FOR_AI[ai]
    if node_major(node) >= need:
        return node
    bundled = NODE_DIR / "node_modules" / ".bin" / "node"
    if bundled.exists() and node_major(str(bundled)) >= need:
        return str(bundled)
    node_unavailable(
        f"npm ai {ai} needs Node {need}: run `npm ci` in {NODE_DIR} (it installs Node 22 from npm)"
    )
    raise AssertionError("unreachable")


async def run_node(script: str, *args: str, env: dict[str, str] | None = None, ai: int = 6) -> dict[str, Any]:
    """Run ``tests/node/<script>`` with ``args`` (on npm ``ai`` of major ``ai``); its one JSON
    line of results (stderr on failure)."""
    node = node_for(ai)
    conditions = ["--conditions=ai7"] if ai == 7 else []
    process = await asyncio.create_subprocess_exec(
        node,
        *conditions,
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
    result: dict[str, Any] = json.loads(stdout.decode().strip().splitlines()[-1])
    if script.startswith(("aisdk_", "responses_")):
        expected = "/node_modules/ai7/" if ai == 7 else "/node_modules/ai/"
        assert expected in result["aiPackage"], (ai, result["aiPackage"])
    if script.startswith("responses_"):
        provider = "/node_modules/ai-sdk-openai4/" if ai == 7 else "/node_modules/@ai-sdk/openai/"
        assert provider in result["openaiPackage"], (ai, result["openaiPackage"])
    return result
