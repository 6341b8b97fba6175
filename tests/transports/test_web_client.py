"""The browser page's files as the service serves them, without a browser: the event types the page
listens for are the session stream's, and its ES modules are all there and served as JavaScript
(a browser refuses a module script of any other MIME type)."""

from __future__ import annotations

import json
import re
import typing
from typing import Any

from typing_extensions import TypeAliasType, is_typeddict

from service.transports.native.web_client import WEB_ROOT
from service.transports.stream import payloads
from tests.conftest import ClientFactory

# The MIME types a browser accepts for a script (the HTML standard's "JavaScript MIME type").
JAVASCRIPT_TYPES = {"text/javascript", "application/javascript", "application/x-javascript"}
IMPORT = re.compile(r'^import\s+(?:[^;]*?\sfrom\s+)?"\./([^"]+)";', re.MULTILINE | re.DOTALL)


def type_names(annotation: Any) -> set[str]:
    """The ``type`` values of every TypedDict a (possibly aliased, annotated) union names."""
    if isinstance(annotation, TypeAliasType):
        return type_names(annotation.__value__)
    if typing.get_origin(annotation) is typing.Annotated:
        return type_names(typing.get_args(annotation)[0])
    if is_typeddict(annotation):
        return set(typing.get_args(typing.get_type_hints(annotation)["type"]))
    return set().union(*(type_names(member) for member in typing.get_args(annotation)))


def page_event_types() -> list[str]:
    """The list in events.js, read as the JSON array it is written as."""
    source = (WEB_ROOT / "events.js").read_text()
    match = re.search(r"export const EVENT_TYPES = Object\.freeze\((\[.*?\])\);", source, re.DOTALL)
    assert match, "events.js no longer declares EVENT_TYPES as a frozen array literal"
    return json.loads(re.sub(r",\s*\]", "]", match.group(1)))


def test_the_page_handles_exactly_the_session_streams_event_types() -> None:
    """An EventSource hears only the event names it listens for: a type the service adds to the
    session dialect must be added to events.js, or the page would never see it."""
    listed = page_event_types()
    assert len(listed) == len(set(listed)), "a type is listed twice in events.js"
    assert set(listed) == type_names(payloads.SessionStreamEvent)


def page_modules() -> set[str]:
    """Every module the page loads, following imports from its entry."""
    entry = re.search(r'<script type="module" src="/static/([^"]+)"', (WEB_ROOT / "index.html").read_text())
    assert entry, "index.html loads no module script"
    seen: set[str] = set()
    todo = [entry.group(1)]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = WEB_ROOT / name
        assert path.is_file(), f"{name} is imported but missing from service/web"
        todo.extend(IMPORT.findall(path.read_text()))
    return seen


def test_the_pages_modules_import_without_a_cycle() -> None:
    """A module that needs a later one's action is handed it by the entry (app.js) instead."""
    graph = {name: IMPORT.findall((WEB_ROOT / name).read_text()) for name in page_modules()}

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, f"import cycle: {' -> '.join((*path[path.index(name) :], name))}"
        for imported in graph[name]:
            visit(imported, (*path, name))

    for name in graph:
        visit(name, ())


def test_every_script_of_the_page_is_loaded() -> None:
    """No module left behind unused: each script file is the entry, imported, or vendored."""
    scripts = {path.name for path in WEB_ROOT.glob("*.js")}
    assert page_modules() == scripts


async def test_the_pages_scripts_are_served_as_javascript(make_client: ClientFactory) -> None:
    client = await make_client()
    names = sorted(page_modules()) + [f"vendor/{path.name}" for path in (WEB_ROOT / "vendor").glob("*.js")]
    for name in names:
        response = await client.get(f"/static/{name}")
        assert response.status == 200, name
        assert response.content_type in JAVASCRIPT_TYPES, (name, response.content_type)
        assert await response.read() == (WEB_ROOT / name).read_bytes()
