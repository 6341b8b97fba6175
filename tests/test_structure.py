"""The house rules, checked on the code itself: which layer may import which, no import cycle
between the service's modules, and no module too long to read in one sitting.

Imports are read with ``ast`` from every file, at any depth (an import inside a function counts:
that is how a cycle hides), and resolved to the service's own modules.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SERVICE = ROOT / "service"

# (importer prefix, forbidden prefixes, files of the importer allowed to break the rule)
RULES: list[tuple[str, tuple[str, ...], tuple[str, ...]]] = [
    (
        "service.core",
        (
            "service.transports",
            "service.providers",
            "service.store",
            "service.db",
            "service.agent",
            "service.app",
            "aiohttp.web",
            "aiohttp_sse",
            "boto3",
            "botocore",
        ),
        (),
    ),
    (
        "service.transports",
        ("service.agent", "service.providers", "service.app", "service.store", "service.db"),
        (),
    ),
    ("service.providers", ("service.agent", "service.transports", "service.app"), ()),
    (
        "service.agent",
        ("service.transports", "service.app", "botocore", "boto3"),
        ("service.agent.aws_tools",),
    ),
    ("service.store", ("service.transports", "service.agent", "service.providers", "service.app"), ()),
    # The database knows the core's record interface, and nothing of HTTP or of the other tiers.
    (
        "service.db",
        (
            "service.transports",
            "service.agent",
            "service.providers",
            "service.store",
            "service.app",
            "aiohttp",
        ),
        (),
    ),
    ("service.sandbox", ("service.agent", "service.transports", "service.app"), ()),
    # Quota policy is the core's run gate: it knows nothing of HTTP.
    ("service.quotas", ("service.transports", "service.app", "aiohttp"), ()),
    # Spans are started through OpenTelemetry's API; its SDK and exporter are set up in one place,
    # and loaded only when traces are on.
    ("service", ("opentelemetry.sdk", "opentelemetry.exporter"), ("service.telemetry",)),
]

# Inside transports: the edge stands on nothing above it, the stream package on the edge alone,
# a face on the edge and the stream packages, never on another face; the OpenAPI document merges
# the fragments the app hands it, and imports no face either.
T = "service.transports"
FACES = ("native", "ws", "mcp", "aisdk", "agui", "openai", "responses")
RULES += [
    (f"{T}.edge", (f"{T}.stream", f"{T}.openapi", *(f"{T}.{face}" for face in FACES)), ()),
    (f"{T}.stream", (f"{T}.openapi", *(f"{T}.{face}" for face in FACES)), ()),
    (f"{T}.openapi", tuple(f"{T}.{face}" for face in FACES), ()),
    *(
        (f"{T}.{face}", (f"{T}.openapi", *(f"{T}.{other}" for other in FACES if other != face)), ())
        for face in FACES
    ),
]
MAX_LINES = {"service": 600, "scripts": 600}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(SERVICE.rglob("*.py"))}


def imports_of(path: Path, name: str) -> Iterator[str]:
    """Every module ``path`` imports, at any level; relative imports resolved against ``name``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def own_imports(known: dict[str, Path]) -> dict[str, set[str]]:
    """The import graph between the service's own modules (``from pkg import mod`` is an arrow to
    ``pkg.mod``; ``from mod import name`` to ``mod``)."""
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        targets = {target for target in imports_of(path, name) if target in known and target != name}
        # "from a.b import c" names both a.b and a.b.c: keep the most precise one.
        graph[name] = {t for t in targets if not any(o.startswith(f"{t}.") for o in targets)}
    return graph


def violations(known: dict[str, Path]) -> list[str]:
    found = []
    for name, path in known.items():
        for prefix, forbidden, allowed in RULES:
            if not (name == prefix or name.startswith(f"{prefix}.")) or name in allowed:
                continue
            for target in sorted(set(imports_of(path, name))):
                if any(target == bad or target.startswith(f"{bad}.") for bad in forbidden):
                    found.append(f"{name} imports {target}")
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_layers_import_only_what_they_may() -> None:
    assert violations(modules()) == []


def test_no_import_cycle_between_the_services_modules() -> None:
    assert cycles(own_imports(modules())) == []


@pytest.mark.parametrize("folder", sorted(MAX_LINES))
def test_no_module_is_too_long(folder: str) -> None:
    limit = MAX_LINES[folder]
    long = {
        str(path.relative_to(ROOT)): lines
        for path in sorted((ROOT / folder).rglob("*.py"))
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > limit
    }
    assert long == {}, f"over {limit} lines"


# --- the checks themselves ---------------------------------------------------------------


def test_a_face_may_not_import_another_face(tmp_path: Path) -> None:
    face = tmp_path / "service" / "transports" / "aisdk"
    face.mkdir(parents=True)
    (face / "x.py").write_text(
        "from service.transports.agui.projector import encode\n"
        "from service.transports.stream.sse import serve\n",
        encoding="utf-8",
    )
    assert violations({"service.transports.aisdk.x": face / "x.py"}) == [
        "service.transports.aisdk.x imports service.transports.agui.projector",
        "service.transports.aisdk.x imports service.transports.agui.projector.encode",
    ]


def test_the_checks_see_a_forbidden_import_inside_a_function_and_a_cycle(tmp_path: Path) -> None:
    core = tmp_path / "service" / "core"
    core.mkdir(parents=True)
    (core / "x.py").write_text("def f():\n    from ..transports import sse\n", encoding="utf-8")
    assert set(imports_of(core / "x.py", "service.core.x")) >= {"service.transports.sse"}
    found = violations({"service.core.x": core / "x.py"})
    assert found and "service.core.x imports service.transports" in found[0]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_only_the_telemetry_module_may_import_the_opentelemetry_sdk(tmp_path: Path) -> None:
    source = "from opentelemetry.sdk.trace import TracerProvider\nfrom opentelemetry import trace\n"
    path = tmp_path / "runs.py"
    path.write_text(source, encoding="utf-8")
    assert violations({"service.core.runs": path, "service.telemetry": path}) == [
        "service.core.runs imports opentelemetry.sdk.trace",
        "service.core.runs imports opentelemetry.sdk.trace.TracerProvider",
    ]
