"""Event ids reserved by the query in flight, so that none is handed out twice after a crash.

A query's events are not stored, only its end is; when a query starts, the ids it may use are
reserved (``ids_reserved_until``), and a session loaded after its process died continues after
that reservation. Sessions stored before have none (0): they continue after their last id.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("ids_reserved_until", sa.BigInteger, nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("ids_reserved_until")
