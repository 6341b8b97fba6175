"""Every script under ``scripts/`` starts: its imports (the harness, the scenario packages, the shared
SSE reader) resolve from the checkout, and its command line parses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
SCRIPTS = sorted(path.name for path in (ROOT / "scripts").glob("*.py"))


def test_every_script_is_covered() -> None:
    assert {"bench_peers.py", "bench_scaleout.py", "soak.py", "stream_client.py", "loadtest.py"} <= set(
        SCRIPTS
    )


@pytest.mark.slow  # a Python process per script
@pytest.mark.parametrize("script", SCRIPTS)
def test_script_help(script: str, tmp_path: Path) -> None:
    # From another directory and with no PYTHONPATH: a script finds its own helpers and this checkout.
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / script), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage:")
