"""metric_rollups keyed (attempt_id, level, bucket, key): a batch's new summaries are neighbours

Keyed (attempt_id, key, level, bucket), every (metric, level) pair of an attempt was its own range of
the table, and each batch added to the end of each: a 1,000-point batch of 10 metrics rewrote about 73
pages of it, each written to SQLite's WAL at the commit. Keyed by level and bucket first, the same
summaries are a few neighbouring runs: about 16 pages (bench/README.md).

SQLite stores a WITHOUT ROWID table in its key's order, so the table is copied into its new shape
(seconds for millions of summaries, once, at the service's start). PostgreSQL keeps rows in a heap
whatever the key: only the primary key's index is rebuilt.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-24 04:00:00.000000
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None

_BIG = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_COLUMNS = "attempt_id, key, level, bucket, lo, hi, n, last_step, last_value"
BY_LEVEL = ('attempt_id', 'level', 'bucket', 'key')
BY_METRIC = ('attempt_id', 'key', 'level', 'bucket')


def _rekey(primary_key: tuple[str, ...]) -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.drop_constraint('metric_rollups_pkey', 'metric_rollups', type_='primary')
        op.create_primary_key('metric_rollups_pkey', 'metric_rollups', list(primary_key))
        return
    op.create_table(
        'metric_rollups_rekeyed',
        sa.Column('attempt_id', sa.Integer(), nullable=False),
        sa.Column('key', sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column('level', sa.Integer(), nullable=False),
        sa.Column('bucket', _BIG, nullable=False),
        sa.Column('lo', sa.Float(), nullable=True),
        sa.Column('hi', sa.Float(), nullable=True),
        sa.Column('n', sa.Integer(), nullable=False),
        sa.Column('last_step', _BIG, nullable=False),
        sa.Column('last_value', sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint(*primary_key),
        sqlite_with_rowid=False,
    )
    op.execute(f"INSERT INTO metric_rollups_rekeyed ({_COLUMNS}) SELECT {_COLUMNS} FROM metric_rollups")
    op.drop_table('metric_rollups')
    op.rename_table('metric_rollups_rekeyed', 'metric_rollups')


def upgrade() -> None:
    _rekey(BY_LEVEL)


def downgrade() -> None:
    _rekey(BY_METRIC)
