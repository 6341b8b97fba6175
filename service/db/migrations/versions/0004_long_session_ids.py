"""Session ids up to 128 characters: a client may choose one that long (an AI SDK chat id, an
AG-UI thread id; see ``service.core.sessions.CLIENT_ID``), and 64 refused them on PostgreSQL.

Every column that holds a session id widens: the session's own and the ones keyed by it
(messages, runs). SQLite does not enforce a VARCHAR's length, so there is nothing to change
there, and its copy-and-move ALTER would rewrite every message for nothing.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

SESSION_ID_COLUMNS = (("sessions", "id"), ("messages", "session_id"), ("runs", "session_id"))


def _retype(old: int, new: int) -> None:
    if op.get_bind().dialect.name == "sqlite":
        return
    for table, column in SESSION_ID_COLUMNS:
        op.alter_column(table, column, type_=sa.String(new), existing_type=sa.String(old))


def upgrade() -> None:
    _retype(64, 128)


def downgrade() -> None:
    # Fails on PostgreSQL while a longer id is stored, rather than cutting one short.
    _retype(128, 64)
