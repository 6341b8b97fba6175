"""Settings come from AGENT_* variables; a bad one stops the start and is named."""

from __future__ import annotations

import subprocess
import sys

import pytest

from service.config import SettingsError, load_settings


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AGENT_PORT", "AGENT_PROVIDER", "AGENT_API_KEYS"):
        monkeypatch.delenv(name, raising=False)
    settings = load_settings()
    assert settings.port == 8080 and settings.provider == "emulator"
    assert settings.max_concurrent_runs == 256 and settings.session_events_max_bytes == 10 * 1024 * 1024
    assert settings.api_keys == []


def test_comma_separated_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_API_KEYS", "a, b,,c")
    monkeypatch.setenv("AGENT_ALLOWED_ORIGINS", "https://x.example")
    settings = load_settings()
    assert settings.api_keys == ["a", "b", "c"]
    assert settings.allowed_origins == ["https://x.example"]


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("AGENT_PORT", "eighty"),
        ("AGENT_MAX_TURNS", "0"),
        ("AGENT_PROVIDER", "gpt"),
        ("AGENT_MAX_CONCURRENT_RUNS", "-1"),
        ("AGENT_REDIS_URL", "localhost:6379"),
        ("AGENT_REDIS_URL", "http://127.0.0.1:6379"),
        ("AGENT_REDIS_LOCK_TTL_S", "0"),
        ("AGENT_REDIS_DEADLINE_S", "0"),
        ("AGENT_REDIS_PREFIX", "has spaces"),
        ("AGENT_INSTANCE_ID", "a/b"),
    ],
)
def test_bad_value_names_the_variable(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError) as info:
        load_settings()
    assert name in str(info.value)


def test_openai_needs_a_base_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_PROVIDER", "openai")
    monkeypatch.delenv("AGENT_OPENAI_BASE_URL", raising=False)
    with pytest.raises(SettingsError, match="AGENT_OPENAI_BASE_URL"):
        load_settings()


def test_start_refuses_a_bad_setting_with_a_clear_message() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "service"],
        env={"AGENT_PORT": "not-a-port", "PATH": ""},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "AGENT_PORT" in result.stderr and "Traceback" not in result.stderr


def test_the_database_defaults_to_sqlite_under_the_data_dir_and_empty_turns_it_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("AGENT_DATABASE_URL", raising=False)
    monkeypatch.setenv("AGENT_DATA_DIR", "/var/lib/agentstream")
    assert load_settings().database() == "sqlite+aiosqlite:////var/lib/agentstream/agentstream.db"
    monkeypatch.setenv("AGENT_DATABASE_URL", "")
    assert load_settings().database() == ""
    monkeypatch.setenv("AGENT_DATABASE_URL", "postgresql+asyncpg://u@db/agentstream")
    assert load_settings().database() == "postgresql+asyncpg://u@db/agentstream"
    monkeypatch.setenv("AGENT_DATABASE_URL", "mysql://u@db/x")
    with pytest.raises(SettingsError, match="AGENT_DATABASE_URL"):
        load_settings()


def test_the_context_budget_is_sized_to_the_model_unless_set() -> None:
    assert load_settings(context_max_tokens=5000).context_limit() == 5000
    assert load_settings(max_tokens=4096).context_limit() == 200_000 - 4096
    assert load_settings(model_id="gpt-4o", max_tokens=1000).context_limit() == 127_000
