"""database identity: each database holds the id it was given when created; run directories live under it

Job and attempt ids start again at 1 in a fresh database, so a run directory named only by them
(`runs/job-1-attempt-1`) was reused by the first job of a new database in a workspace an earlier one had
used: its files ahead of the new job's, its checkpoints there to resume from. The id is made here, once:
the day and 8 random hex digits (`20261127-3f9a2c1b`), to read as a folder name.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-27 16:00:00.000000
"""

import secrets
import time

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    table = op.create_table(
        "database_identity",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("database_id", sa.String(length=64), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    made = time.strftime("%Y%m%d", time.gmtime()) + "-" + secrets.token_hex(4)
    op.bulk_insert(table, [{"id": 1, "database_id": made}])


def downgrade() -> None:
    op.drop_table("database_identity")
