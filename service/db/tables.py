"""The database's tables, as SQLAlchemy Core sees them at the newest migration.

Times are epoch seconds (double precision), so an injected clock is stored as it is and the same
query reads them on SQLite and PostgreSQL. The migrations under ``migrations/versions`` create
these; a change here needs a new migration beside them.
"""

from __future__ import annotations

import sqlalchemy as sa

from service.core.records import DEFAULT_AGENT

metadata = sa.MetaData()
# The longest session id a client may choose (service.core.sessions.CLIENT_ID).
SESSION_ID_CHARS = 128
# The longest agent name a session can be bound to.
AGENT_CHARS = 64

sessions = sa.Table(
    "sessions",
    metadata,
    sa.Column("id", sa.String(SESSION_ID_CHARS), primary_key=True),
    sa.Column("owner", sa.String(128), nullable=False),
    sa.Column("title", sa.String(200), nullable=False, server_default=""),
    sa.Column("created_at", sa.Float(precision=53), nullable=False),
    sa.Column("updated_at", sa.Float(precision=53), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("run_id", sa.String(64), nullable=False, server_default=""),
    sa.Column("input_tokens", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("output_tokens", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("total_tokens", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("last_event_id", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("ids_reserved_until", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("agent", sa.String(AGENT_CHARS), nullable=False, server_default=DEFAULT_AGENT),
    sa.Index("ix_sessions_owner_updated", "owner", "updated_at", "id"),
    sa.Index("ix_sessions_updated", "updated_at"),
)

messages = sa.Table(
    "messages",
    metadata,
    sa.Column("session_id", sa.String(SESSION_ID_CHARS), sa.ForeignKey("sessions.id"), primary_key=True),
    sa.Column("seq", sa.Integer, primary_key=True),
    sa.Column("run_id", sa.String(64), nullable=False),
    sa.Column("message", sa.JSON, nullable=False),
)

runs = sa.Table(
    "runs",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column(
        "session_id", sa.String(SESSION_ID_CHARS), sa.ForeignKey("sessions.id"), nullable=False, index=True
    ),
    sa.Column("message", sa.Text, nullable=False),
    sa.Column("started_at", sa.Float(precision=53), nullable=False),
    sa.Column("ended_at", sa.Float(precision=53)),
    sa.Column("outcome", sa.String(16), nullable=False, server_default="running"),
    sa.Column("error", sa.String(64), nullable=False, server_default=""),
)
