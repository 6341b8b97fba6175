"""The providers own their wire: they import nothing of the agent or the transports, and the agent
imports no botocore (only its AWS tools, which call AWS themselves, may)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SERVICE = Path(__file__).resolve().parents[2] / "service"


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at any level of the file (function-level imports too)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def offending(package: str, forbidden: tuple[str, ...], allowed: tuple[str, ...] = ()) -> list[str]:
    found = []
    for path in sorted((SERVICE / package).glob("*.py")):
        if path.name in allowed:
            continue
        for name in sorted(imported_modules(path)):
            if any(name == bad or name.startswith(f"{bad}.") for bad in forbidden):
                found.append(f"{package}/{path.name} imports {name}")
    return found


@pytest.mark.parametrize(
    ("package", "forbidden", "allowed"),
    [
        ("providers", ("service.agent", "service.transports"), ()),
        ("agent", ("botocore", "boto3"), ("aws_tools.py",)),
    ],
)
def test_no_forbidden_import(package: str, forbidden: tuple[str, ...], allowed: tuple[str, ...]) -> None:
    assert offending(package, forbidden, allowed) == []


def test_the_check_sees_an_import_inside_a_function(tmp_path: Path) -> None:
    source = tmp_path / "x.py"
    source.write_text("def f():\n    from service.agent.loop import AgentLoop\n", encoding="utf-8")
    assert "service.agent.loop" in imported_modules(source)
