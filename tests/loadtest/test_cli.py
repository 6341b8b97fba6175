"""The command line (``service/loadtest/cli.py``, ``scripts/loadtest.py``, ``agentstream-load``)."""

from __future__ import annotations

import configparser
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent


def test_cli_help() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "loadtest.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    for option in (
        "--clients",
        "--count",
        "--duration",
        "--ramp-up",
        "--mode",
        "--selftest",
        "--json",
        "--plot",
    ):
        assert option in result.stdout


def test_console_script_and_python_m_reach_the_same_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    scripts = dict(
        line.replace(" ", "").split("=", 1)
        for line in config["options.entry_points"]["console_scripts"].splitlines()
        if line.strip()
    )
    module, _, name = scripts["agentstream-load"].partition(":")
    main = getattr(importlib.import_module(module), name)
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    assert "--queries-per-session" in capsys.readouterr().out
    result = subprocess.run(
        [sys.executable, "-m", "service.loadtest", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert "--queries-per-session" in result.stdout
