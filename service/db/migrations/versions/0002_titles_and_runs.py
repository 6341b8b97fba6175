"""Session titles (filled in from each session's first message) and a record of every run.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

TITLE_CHARS = 80


def _title(message: object) -> str:
    """The first text block of a stored message, on one line and shortened (as the service does)."""
    content = message.get("content") if isinstance(message, dict) else None
    texts = [block["text"] for block in content or [] if isinstance(block, dict) and "text" in block]
    line = " ".join(" ".join(texts[:1]).split())
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1].rstrip() + "…"


def upgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("title", sa.String(200), nullable=False, server_default=""))
    op.create_table(
        "runs",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("session_id", sa.String(64), sa.ForeignKey("sessions.id"), nullable=False),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column("started_at", sa.Float(precision=53), nullable=False),
        sa.Column("ended_at", sa.Float(precision=53)),
        sa.Column("outcome", sa.String(16), nullable=False, server_default="running"),
        sa.Column("error", sa.String(64), nullable=False, server_default=""),
    )
    op.create_index("ix_runs_session_id", "runs", ["session_id"])
    # Sessions stored before titles existed are named after their first message.
    sessions = sa.table("sessions", sa.column("id", sa.String), sa.column("title", sa.String))
    messages = sa.table(
        "messages",
        sa.column("session_id", sa.String),
        sa.column("seq", sa.Integer),
        sa.column("message", sa.JSON),
    )
    connection = op.get_bind()
    firsts = connection.execute(
        sa.select(messages.c.session_id, messages.c.message).where(messages.c.seq == 0)
    )
    for session_id, message in firsts.all():
        title = _title(message)
        if title:
            connection.execute(sessions.update().where(sessions.c.id == session_id).values(title=title))


def downgrade() -> None:
    op.drop_index("ix_runs_session_id", table_name="runs")
    op.drop_table("runs")
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("title")
