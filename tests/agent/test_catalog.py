"""The agents file and the catalog built from it: validation that names the agent and the field,
what a table leaves to the environment, and one provider per upstream."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from service.agent.aws_tools import aws_tools
from service.agent.calculator import builtin_tools
from service.agent.catalog import AgentCatalog, AgentsFileError, load_definitions
from service.agent.tools import ToolExecutor
from service.app import create_app
from service.config import Settings
from service.providers.bedrock import BedrockProvider
from service.providers.openai import OpenAIProvider
from tests.conftest import TEST_SETTINGS

ROOT = Path(__file__).resolve().parents[2]
BUILTIN = [tool.name for tool in [*builtin_tools(), *aws_tools()]]

TWO_AGENTS = """
[agents.support]
description = "Answers questions about orders."
provider = "emulator"
model = "support-model"
system_prompt = "You are the support agent."
tools = ["calculator"]
require_approval = ["calculator"]
max_turns = 3

[agents.research]
provider = "openai"
base_url = "emulator"
model = "research-model"
system_prompt = "You are the research agent."
tools = []
client_tools = false
"""


def settings_with(tmp_path: Path, text: str | bytes | None, **overrides: object) -> Settings:
    """Test settings whose AGENT_AGENTS_FILE holds ``text`` (None: no such file)."""
    path = tmp_path / "agents.toml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    elif text is not None:
        path.write_text(text, encoding="utf-8")
    return Settings(**{**TEST_SETTINGS, "agents_file": str(path), **overrides})


def test_without_a_file_the_environment_is_the_agent_default() -> None:
    settings = Settings(
        **{**TEST_SETTINGS, "model_id": "env-model", "system_prompt": "From the environment.", "max_turns": 7}
    )
    [(name, definition)] = load_definitions(settings, BUILTIN).items()
    assert name == "default"
    assert (definition.provider, definition.model, definition.system_prompt) == (
        "emulator",
        "env-model",
        "From the environment.",
    )
    assert definition.max_turns == 7 and definition.tools is None  # every built-in tool


def test_a_table_takes_what_it_leaves_out_from_the_environment(tmp_path: Path) -> None:
    settings = settings_with(tmp_path, TWO_AGENTS, max_turns=9, tools_require_approval=["*"])
    definitions = load_definitions(settings, BUILTIN)
    assert list(definitions) == ["support", "research"]  # file order
    support, research = definitions["support"], definitions["research"]
    assert (support.provider, support.model, support.system_prompt) == (
        "emulator",
        "support-model",
        "You are the support agent.",
    )
    assert support.tools == frozenset({"calculator"}) and support.require_approval == ("calculator",)
    assert support.max_turns == 3 and support.client_tools is True
    assert (research.provider, research.base_url, research.model) == ("openai", "emulator", "research-model")
    assert research.tools == frozenset() and research.client_tools is False
    assert research.max_turns == 9 and research.require_approval == ("*",)  # from the environment


@pytest.mark.parametrize(
    ("text", "names"),
    [
        # an unknown field: the agent and the field
        ('[agents.support]\nmodle = "x"\n', ["agent 'support'", "field 'modle'", "Extra inputs"]),
        # a bad type: TOML's string where a number belongs, and a number out of range
        ('[agents.support]\nmax_turns = "ten"\n', ["agent 'support'", "field 'max_turns'"]),
        ("[agents.support]\ntemperature = 3.5\n", ["agent 'support'", "field 'temperature'"]),
        ('[agents.support]\ntools = "calculator"\n', ["agent 'support'", "field 'tools'"]),
        ('[agents.support]\nprovider = "vertex"\n', ["agent 'support'", "field 'provider'"]),
        # a built-in tool that does not exist: named, with the ones that do
        (
            '[agents.ok]\n[agents.support]\ntools = ["calculator", "teleport"]\n',
            ["agent 'support'", "field 'tools'", "teleport", "calculator"],
        ),
        # a bad name
        ('[agents."sup port"]\nmodel = "x"\n', ["agent name 'sup port'", "pattern"]),
        # no agents, or something else beside them
        ("[agents]\n", ["field 'agents'"]),
        ('title = "x"\n[agents.a]\n', ["field 'title'"]),
        # not TOML
        ("[agents.support\nmodel = 1\n", ["not valid TOML"]),
        (b"\xff\xfe[agents.a]\n", ["not valid TOML"]),
    ],
)
def test_a_bad_file_is_refused_naming_the_agent_and_the_field(
    tmp_path: Path, text: str | bytes, names: list[str]
) -> None:
    settings = settings_with(tmp_path, text)
    with pytest.raises(AgentsFileError) as caught:
        load_definitions(settings, BUILTIN)
    message = str(caught.value)
    assert message.startswith(f"AGENT_AGENTS_FILE {settings.agents_file}: ")
    for name in names:
        assert name in message, message


def test_a_missing_file_is_refused(tmp_path: Path) -> None:
    settings = settings_with(tmp_path, None)
    with pytest.raises(AgentsFileError, match="agents.toml: cannot be read: No such file"):
        load_definitions(settings, BUILTIN)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, "cannot be read"),
        ("[agents.support]\nmax_tokens = 0\n", "agent 'support', field 'max_tokens'"),
        ('[agents.support]\ntools = ["teleport"]\n', "agent 'support', field 'tools': no built-in tool"),
    ],
)
def test_a_bad_file_stops_create_app(tmp_path: Path, text: str | None, expected: str) -> None:
    with pytest.raises(AgentsFileError, match=expected):
        create_app(settings_with(tmp_path, text))


def test_a_bad_file_stops_the_service_with_one_line(tmp_path: Path) -> None:
    """``python -m service`` says what is wrong on one line and exits 2: no traceback."""
    path = tmp_path / "agents.toml"
    path.write_text('[agents.support]\nmax_turns = "ten"\n', encoding="utf-8")
    env = {**os.environ, "AGENT_AGENTS_FILE": str(path), "AGENT_PORT": "0", "AGENT_DATABASE_URL": ""}
    done = subprocess.run(
        [sys.executable, "-m", "service"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"agentstream: cannot start: AGENT_AGENTS_FILE {path}: ")
    assert "agent 'support', field 'max_turns'" in done.stderr
    assert "Traceback" not in done.stderr


async def test_agents_on_one_upstream_share_one_provider(tmp_path: Path) -> None:
    """Two agents on the emulator's Bedrock wire share a provider, two on one OpenAI-compatible
    server share another, and one on a second server gets its own: three providers for five
    agents, each request naming its agent's model."""
    text = """
    [agents.a]
    provider = "emulator"
    model = "model-a"
    [agents.b]
    provider = "emulator"
    model = "model-b"
    [agents.c]
    provider = "openai"
    base_url = "http://127.0.0.1:9/v1"
    model = "model-c"
    [agents.d]
    provider = "openai"
    base_url = "http://127.0.0.1:9/v1"
    model = "model-d"
    system_prompt = "Another prompt, the same upstream."
    [agents.e]
    provider = "openai"
    base_url = "http://127.0.0.2:9/v1"
    model = "model-e"
    """
    settings = settings_with(tmp_path, text)
    executor = ToolExecutor(builtin_tools())
    catalog = AgentCatalog.from_settings(settings, executor)
    # Nothing listens there: making and starting a provider opens no connection.
    await catalog.start("http://127.0.0.1:9")
    try:
        loops = {name: catalog.resolve(name)[0] for name in "abcde"}
        assert len(catalog.providers) == 3
        assert loops["a"].provider is loops["b"].provider
        assert loops["c"].provider is loops["d"].provider
        assert len({id(loops[name].provider) for name in "ace"}) == 3
        assert isinstance(loops["a"].provider, BedrockProvider)
        assert isinstance(loops["c"].provider, OpenAIProvider)
        assert [loops[name].model for name in "abcde"] == [f"model-{name}" for name in "abcde"]
    finally:
        await catalog.close()
    assert catalog.providers == []
