"""The agent a session is bound to: the service runs several named agents, and a session keeps
the one it was made for, across restarts and on every instance.

Every session stored before has the one agent there was then, ``default`` (the server default
fills the existing rows, so the upgrade needs no pass over them).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("agent", sa.String(64), nullable=False, server_default="default"))


def downgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("agent")
