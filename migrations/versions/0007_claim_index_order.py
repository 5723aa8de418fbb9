"""the claim index in the claim's order again: (status, priority DESC, id)

On SQLite, migrations 0004 and 0005 altered `jobs` in batch mode, which rebuilds the table and its
indexes from reflection; reflection drops DESC, so ix_jobs_claim became (status, priority, id). The
claim (ORDER BY priority DESC, id) then sorted every queued job of the top priority on each claim:
4 ms per claim with 2,000 jobs queued, against one index probe. Any later batch migration of `jobs`
must recreate this index the same way (tests/service/test_claims.py checks the query plan).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23 07:40:00.000000
"""

from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("DROP INDEX ix_jobs_claim")
    op.execute("CREATE INDEX ix_jobs_claim ON jobs (status, priority DESC, id)")


def downgrade() -> None:
    pass  # the DESC order is what 0002 meant; there is nothing to go back to
