"""metric rollups for downsampled reads; the claim index in the claim's order

metric_rollups: per-bucket min, max, count and last value at several widths.
ix_jobs_claim: (status, priority DESC, id), the ORDER BY of the claim, so a claim is one probe.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21 23:05:00
"""

from alembic import op
import sqlalchemy as sa
import sqlmodel


revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None

# Bucket widths 2**level steps; must match flightdeck.service.reports.metric_rollups.ROLLUP_LEVELS.
LEVELS = (4, 6, 8, 10, 12, 14, 16)


def upgrade() -> None:
    # The claim orders by priority DESC, id ASC: with the index in that order the first row is one
    # probe; with (status, priority, id) SQLite sorts every queued job of a priority on each claim.
    op.execute("DROP INDEX ix_jobs_claim")
    op.execute("CREATE INDEX ix_jobs_claim ON jobs (status, priority DESC, id)")
    op.create_table('metric_rollups',
    sa.Column('attempt_id', sa.Integer(), nullable=False),
    sa.Column('key', sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
    sa.Column('level', sa.Integer(), nullable=False),
    sa.Column('bucket', sa.Integer(), nullable=False),
    sa.Column('lo', sa.Float(), nullable=True),
    sa.Column('hi', sa.Float(), nullable=True),
    sa.Column('n', sa.Integer(), nullable=False),
    sa.Column('last_step', sa.Integer(), nullable=False),
    sa.Column('last_value', sa.Float(), nullable=True),
    sa.PrimaryKeyConstraint('attempt_id', 'key', 'level', 'bucket'),
    sqlite_with_rowid=False
    )
    # Points stored before this revision get their rollups, level by level, each from the one below.
    op.execute(
        f"INSERT INTO metric_rollups (attempt_id, key, level, bucket, lo, hi, n, last_step, last_value) "
        f"SELECT g.attempt_id, g.key, {LEVELS[0]}, g.b, g.lo, g.hi, g.n, g.ls, "
        f"(SELECT p.value FROM metric_points p WHERE p.attempt_id = g.attempt_id AND p.key = g.key "
        f"AND p.step = g.ls) "
        f"FROM (SELECT attempt_id, key, step >> {LEVELS[0]} AS b, min(value) AS lo, max(value) AS hi, "
        f"count(*) AS n, max(step) AS ls FROM metric_points GROUP BY attempt_id, key, b) AS g"
    )
    for below, level in zip(LEVELS, LEVELS[1:]):
        op.execute(
            f"INSERT INTO metric_rollups (attempt_id, key, level, bucket, lo, hi, n, last_step, last_value) "
            f"SELECT g.attempt_id, g.key, {level}, g.b, g.lo, g.hi, g.n, g.ls, "
            f"(SELECT r.last_value FROM metric_rollups r WHERE r.attempt_id = g.attempt_id AND r.key = g.key "
            f"AND r.level = {below} AND r.bucket = g.lb) "
            f"FROM (SELECT attempt_id, key, bucket >> {level - below} AS b, min(lo) AS lo, max(hi) AS hi, "
            f"sum(n) AS n, max(last_step) AS ls, max(bucket) AS lb FROM metric_rollups "
            f"WHERE level = {below} GROUP BY attempt_id, key, b) AS g"
        )


def downgrade() -> None:
    op.execute("DROP INDEX ix_jobs_claim")
    op.execute("CREATE INDEX ix_jobs_claim ON jobs (status, priority, id)")
    op.drop_table('metric_rollups')
