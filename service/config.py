"""Settings, read from the environment with the prefix ``AGENT_`` and validated at start.

A bad value stops the start with a message that names the variable (see :func:`load_settings`).
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

DEFAULT_MODEL_ID = "us.anthropic.claude-3-5-haiku-20241022-v1:0"

CommaList = Annotated[list[str], NoDecode]


class Settings(BaseSettings):
    """Every setting of the service; environment variable = ``AGENT_`` + the field name in capitals."""

    model_config = SettingsConfigDict(env_prefix="AGENT_", extra="ignore", validate_default=True)

    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    # Processes serving the one port (SO_REUSEPORT), sharing sessions through Redis; see
    # service/workers.py. ``python -m service --workers N`` overrides it.
    workers: int = Field(1, ge=1, le=256)
    provider: Literal["emulator", "bedrock", "openai"] = "emulator"
    model_id: str = Field(DEFAULT_MODEL_ID, min_length=1)
    max_turns: int = Field(10, ge=1, le=100)
    max_concurrent_runs: int = Field(256, ge=1, le=10_000)
    max_tokens: int = Field(4096, ge=1, le=200_000)
    system_prompt: str = "You are a helpful assistant. Use the calculator tool for arithmetic."
    # A TOML file of named agents (see service/agent/catalog.py); empty: the settings here are the
    # one agent, "default".
    agents_file: str = ""
    openai_base_url: str = ""
    openai_api_key: str = ""
    session_events_max_bytes: int = Field(10 * 1024 * 1024, ge=1024)
    redis_url: str = ""
    redis_prefix: str = Field("agentstream", min_length=1, pattern=r"^[A-Za-z0-9_.:-]+$")
    redis_lock_ttl_s: float = Field(10.0, ge=0.2, le=600)
    # The longest any one store call may take, retries included, before it counts as Redis being
    # unavailable (a 503 for new work): a hung Redis must not hold requests for long.
    redis_deadline_s: float = Field(2.0, gt=0, le=600)
    instance_id: str = Field("", pattern=r"^[A-Za-z0-9_.-]*$")
    api_keys: CommaList = Field(default_factory=list)
    # Signed-in users (see service/transports/edge/identity.py): a JWT checked with a shared secret
    # (HS256/384/512) or with the keys of a JWKS (RS, PS, ES, EdDSA); its ``sub`` (scoped by
    # ``iss``) owns sessions as a key does.
    jwt_secret: str = ""
    jwks_url: str = ""
    jwt_issuer: str = ""
    jwt_audience: CommaList = Field(default_factory=list)
    jwt_leeway_s: float = Field(30.0, ge=0, le=3600)
    allowed_origins: CommaList = Field(default_factory=list)
    # Host header names accepted (DNS-rebinding guard); empty: see allowed_host_names().
    allowed_hosts: CommaList = Field(default_factory=list)
    mcp_servers: CommaList = Field(default_factory=list)
    # Tools whose calls wait for a person's approval (``*``: every tool), and how long a request
    # waits before it counts as denied (``expired``). See service/core/approvals.py.
    tools_require_approval: CommaList = Field(default_factory=list)
    approval_timeout_s: float = Field(600.0, gt=0, le=7 * 24 * 3600)
    # A browser-side tool's call waits this long for the client's result, then gets an error one.
    client_tool_timeout_s: float = Field(600.0, gt=0, le=7 * 24 * 3600)
    # Messages that may wait behind a session's running query (multitask_strategy: enqueue).
    max_queued: int = Field(8, ge=0, le=1000)
    mcp_max_sessions: int = Field(1000, ge=1)
    mcp_session_ttl_s: float = Field(3600.0, gt=0)
    tool_timeout_s: float = Field(30.0, gt=0, le=3600)
    # Every tool's result (built-in, AWS, MCP) is cut past this many characters, and marked.
    tool_max_output_chars: int = Field(20_000, ge=1, le=10_000_000)
    # The calculator evaluates in worker processes: killed past the time limit, capped in memory.
    calculator_timeout_s: float = Field(2.0, gt=0, le=300)
    calculator_memory_mb: int = Field(256, ge=64, le=65_536)
    calculator_workers: int = Field(2, ge=1, le=64)
    max_request_bytes: int = Field(1024 * 1024, ge=1024)
    max_message_chars: int = Field(100_000, ge=1)
    # The longest request line or single header aiohttp's parser accepts (bytes); longer: 400.
    max_header_bytes: int = Field(8190, ge=1024, le=1024 * 1024)
    # Per API key (across instances with keys and Redis); 0 = unlimited (see quotas/local.py).
    # With no keys every caller is one anonymous owner, so these apply only when set explicitly
    # (see quota()).
    quota_sessions: int = Field(100, ge=0)
    quota_streams: int = Field(32, ge=0)
    quota_runs: int = Field(8, ge=0)
    quota_requests_per_minute: int = Field(600, ge=0)
    quota_tokens_per_day: int = Field(2_000_000, ge=0)
    throttle_retries: int = Field(2, ge=0, le=10)
    throttle_backoff_s: float = Field(0.5, ge=0, le=60)
    throttle_backoff_max_s: float = Field(8.0, ge=0, le=300)
    bedrock_max_attempts: int = Field(3, ge=1, le=10)
    bedrock_read_timeout_s: float = Field(120.0, gt=0)
    shutdown_timeout_s: float = Field(10.0, ge=0)
    emulator_ttft_ms: float = Field(150.0, ge=0)
    emulator_tokens_per_second: float = Field(40.0, ge=0)
    # The embedded model's context window (input tokens); longer requests get Bedrock's
    # ValidationException. 0: unlimited.
    emulator_context_tokens: int = Field(0, ge=0)
    sse_ping_interval_s: float = Field(15.0, gt=0)
    sse_send_timeout_s: float = Field(30.0, gt=0)
    sse_retry_ms: int = Field(1000, ge=0, le=60_000)
    heartbeat_interval_s: float = Field(15.0, gt=0)
    max_sessions: int = Field(10_000, ge=1)
    # Instance-wide bound on open streams (SSE, WebSocket, MCP), whoever holds them.
    max_streams: int = Field(4096, ge=1)
    session_ttl_s: float = Field(3600.0, gt=0)
    # The durable record of sessions (service/db/): where the embedded SQLite file lives, and the
    # database's URL; unset: SQLite in data_dir; set empty: no database, sessions in memory/Redis only.
    data_dir: str = "./data"
    database_url: str | None = None
    # Apply the missing migrations at start; off where they run once elsewhere (`agentstream db
    # upgrade`, or the --workers supervisor before it starts its workers, which must not race).
    database_migrate: bool = True
    # The longest any one database call may take before the database counts as unavailable (a 503
    # for new work; a query's end is then recorded once it answers again), as redis_deadline_s.
    database_deadline_s: float = Field(3.0, gt=0, le=600)
    # Sessions not updated for this many days are deleted from the database; 0 keeps them.
    session_retention_days: float = Field(30.0, ge=0)
    # The most input tokens a request to the model may hold; older whole turns are left out of
    # what is sent past it. 0: sized to the model (see context_limit()).
    context_max_tokens: int = Field(0, ge=0)
    merge_deltas_after: int = Field(64, ge=2)
    # A log with many live subscribers holds its new events for a window before writing them to
    # each (service/core/direct.py): 20 µs per subscriber, up to this many milliseconds; 0: never.
    # Every subscriber is written once a window, so 20 µs caps the writes at 50,000 a second.
    coalesce_max_ms: float = Field(200.0, ge=0, le=1000)
    coalesce_per_subscriber_us: float = Field(20.0, ge=0, le=1000)
    steps_planning: bool = False
    poll_max_events: int = Field(1000, ge=1, le=100_000)
    allow_unauthenticated: bool = False
    token_ttl_s: float = Field(3600.0, gt=0)
    ws_send_queue: int = Field(1024, ge=8)
    ws_send_timeout_s: float = Field(10.0, gt=0)
    ws_max_message_bytes: int = Field(65536, ge=1024)
    ws_heartbeat_s: float = Field(20.0, gt=0)
    ws_idle_timeout_s: float = Field(300.0, gt=0)
    gc_tuning: bool = True
    log_format: Literal["text", "json"] = "text"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    def quota(self, name: str) -> int:
        """The per-key quota ``quota_<name>`` in force: with no keys configured every caller is the
        one anonymous owner, and a default meant per key would bound the whole world, so then only
        a quota set explicitly applies (instance-wide bounds protect the process instead)."""
        field = f"quota_{name}"
        if self.authenticated or field in self.model_fields_set:
            return int(getattr(self, field))
        return 0

    @property
    def authenticated(self) -> bool:
        """True when callers must say who they are: API keys, or a JWT secret or JWKS."""
        return bool(self.api_keys or self.jwt_secret or self.jwks_url)

    def database(self) -> str:
        """The database URL in force: ``AGENT_DATABASE_URL``, or SQLite under ``AGENT_DATA_DIR``
        when it is unset; empty: no database."""
        if self.database_url is None:
            return f"sqlite+aiosqlite:///{Path(self.data_dir) / 'agentstream.db'}"
        return self.database_url

    def context_limit(self) -> int:
        """``AGENT_CONTEXT_MAX_TOKENS``, or, when 0, the model's context window less the room its
        answer needs (Claude models take 200,000 tokens; others are taken as 128,000)."""
        if self.context_max_tokens:
            return self.context_max_tokens
        window = 200_000 if ("anthropic" in self.model_id or "claude" in self.model_id) else 128_000
        return max(1024, window - self.max_tokens)

    def allowed_host_names(self) -> frozenset[str] | None:
        """Host names a request may name (lower case, no port); None accepts any.

        By default the loopback names, the address the service listens on and the hosts of
        ``AGENT_ALLOWED_ORIGINS``; listening on every address (``0.0.0.0``, ``::``) accepts any
        host unless ``AGENT_ALLOWED_HOSTS`` lists them. ``*`` in the list accepts any.
        """
        if "*" in self.allowed_hosts:
            return None
        if not self.allowed_hosts and self.host in WILDCARD_HOSTS:
            return None
        names = {host_name(name) for name in self.allowed_hosts}
        if not self.allowed_hosts:
            names |= LOOPBACK_NAMES | {host_name(self.host)}
        names |= {host_name(urlsplit(origin).netloc) for origin in self.allowed_origins if origin != "*"}
        return frozenset(name for name in names if name)

    @field_validator(
        "api_keys",
        "allowed_origins",
        "allowed_hosts",
        "mcp_servers",
        "tools_require_approval",
        "jwt_audience",
        mode="before",
    )
    @classmethod
    def _split_commas(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("redis_url")
    @classmethod
    def _redis_url_scheme(cls, value: str) -> str:
        if value and value.partition("://")[0] not in {"redis", "rediss", "unix"}:
            raise ValueError("must be a redis://, rediss:// or unix:// URL")
        return value

    @field_validator("database_url")
    @classmethod
    def _database_url_scheme(cls, value: str | None) -> str | None:
        if value and value.partition("://")[0] not in {"sqlite+aiosqlite", "postgresql+asyncpg"}:
            raise ValueError("must be a sqlite+aiosqlite:/// or postgresql+asyncpg:// URL, or empty")
        return value

    @field_validator("jwks_url")
    @classmethod
    def _jwks_url_scheme(cls, value: str) -> str:
        if value and value.partition("://")[0] not in {"http", "https"}:
            raise ValueError("must be an http:// or https:// URL")
        return value

    @field_validator("jwt_secret")
    @classmethod
    def _jwt_secret_length(cls, value: str) -> str:
        # RFC 7518 §3.2: an HMAC key at least as long as the hash; shorter is guessable offline.
        if value and len(value.encode()) < 32:
            raise ValueError("must be at least 32 bytes (RFC 7518 asks a key as long as the hash)")
        return value

    @model_validator(mode="after")
    def _openai_needs_url(self) -> Settings:
        if self.provider == "openai" and not self.openai_base_url:
            raise ValueError("AGENT_OPENAI_BASE_URL is required when AGENT_PROVIDER=openai")
        return self

    @model_validator(mode="after")
    def _workers_share_sessions(self) -> Settings:
        if self.workers == 1:
            return self
        # Each process would keep its own sessions, and a client would find its session only on
        # the process its connection happened to reach.
        if not self.redis_url:
            raise ValueError(
                f"AGENT_WORKERS={self.workers} (or --workers) runs {self.workers} processes, which share "
                "sessions only through Redis: set AGENT_REDIS_URL, or run one worker"
            )
        if self.port == 0:
            raise ValueError(
                "AGENT_PORT=0 would give each of the AGENT_WORKERS processes a port of its own; "
                "give the port they share"
            )
        return self

    @model_validator(mode="after")
    def _no_open_service_off_loopback(self) -> Settings:
        # Listening beyond this machine with no keys would hand the model to anyone who finds it.
        if not self.authenticated and not self.allow_unauthenticated and not is_loopback(self.host):
            raise ValueError(
                f"AGENT_API_KEYS is empty while AGENT_HOST={self.host} is reachable from other machines; "
                "set AGENT_API_KEYS (or AGENT_JWT_SECRET / AGENT_JWKS_URL for signed-in users), or "
                "AGENT_ALLOW_UNAUTHENTICATED=true to run open on purpose"
            )
        return self


WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]"})
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def host_name(host: str) -> str:
    """A Host header's (or netloc's) name: lower case, without port or IPv6 brackets."""
    host = host.strip().lower().rpartition("@")[2]
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host[1:]
    if host.count(":") == 1:
        host = host.partition(":")[0]
    return host.rstrip(".")


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class SettingsError(Exception):
    """Raised when the environment holds a bad setting; the message names the variable."""


def describe_validation_error(error: ValidationError) -> str:
    """Turn pydantic's report into lines such as ``AGENT_PORT: Input should be a valid integer``."""
    lines = []
    for item in error.errors():
        names = [str(part) for part in item.get("loc", ()) if isinstance(part, str)]
        variable = "AGENT_" + names[0].upper() if names else "settings"
        message = item.get("msg", "invalid value")
        given = item.get("input")
        shown = f" (got {given!r})" if names and isinstance(given, (str, int, float)) else ""
        lines.append(f"{variable}: {message}{shown}")
    return "invalid settings:\n  " + "\n  ".join(lines)


def load_settings(**overrides: object) -> Settings:
    """Read the settings from the environment; raise :class:`SettingsError` naming a bad variable."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as error:
        raise SettingsError(describe_validation_error(error)) from None
