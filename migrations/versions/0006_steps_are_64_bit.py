"""steps, buckets and log offsets are 64-bit integers on every database

The API accepts steps up to 2**62 (flightdeck.contracts.STEP_LIMIT). SQLite's INTEGER is already 64-bit,
so its tables stay as they are (a type change there would rebuild the metric tables); PostgreSQL's
INTEGER is 32-bit, so the columns become BIGINT.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23 07:10:00.000000
"""

from alembic import op
import sqlalchemy as sa

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None

COLUMNS = (
    ("metric_points", "step"),
    ("metric_rollups", "bucket"),
    ("metric_rollups", "last_step"),
    ("log_chunks", "offset"),
    ("events", "step"),
    ("jobs", "last_step"),
)


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        return
    for table, column in COLUMNS:
        op.alter_column(table, column, type_=sa.BigInteger(), existing_type=sa.Integer())


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        return
    for table, column in COLUMNS:
        op.alter_column(table, column, type_=sa.Integer(), existing_type=sa.BigInteger())
