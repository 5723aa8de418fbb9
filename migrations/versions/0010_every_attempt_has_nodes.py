"""every attempt has node rows (a single-node attempt is a gang of one): the lease is the nodes'

An attempt claimed by one worker had no attempt_nodes row and kept its lease in
attempts.lease_expires_at; a multi-node attempt kept one lease per node row. Each attempt without node
rows gets node 0, held by its worker, in its status, with its lease; then the attempt's own lease
column goes, so the nodes' leases are the only ones.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-25 22:00:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # An empty JSON array: PostgreSQL's json column takes a cast; SQLite stores the text (a CAST to its
    # unknown type JSON would store the number 0).
    empty = "CAST('[]' AS JSON)" if op.get_bind().dialect.name == "postgresql" else "'[]'"
    op.execute(
        "INSERT INTO attempt_nodes (job_id, worker_id, attempt_id, node_rank, status, devices, joined_at, "
        "lease_expires_at, finished_at) "
        f"SELECT a.job_id, a.worker_id, a.id, 0, a.status, {empty}, a.started_at, "
        "CASE WHEN a.status = 'running' THEN a.lease_expires_at END, a.finished_at "
        "FROM attempts a WHERE a.worker_id IS NOT NULL "
        "AND NOT EXISTS (SELECT 1 FROM attempt_nodes n WHERE n.attempt_id = a.id)"
    )
    op.drop_index("ix_attempts_lease_expires_at", table_name="attempts")
    with op.batch_alter_table("attempts") as batch_op:
        batch_op.drop_column("lease_expires_at")


def downgrade() -> None:
    with op.batch_alter_table("attempts") as batch_op:
        batch_op.add_column(sa.Column("lease_expires_at", sa.Float(), nullable=True))
    op.create_index("ix_attempts_lease_expires_at", "attempts", ["lease_expires_at"])
    # One worker's attempts take their lease back and lose their node rows; gangs keep theirs.
    op.execute(
        "UPDATE attempts SET nnodes = 1, lease_expires_at = (SELECT min(n.lease_expires_at) "
        "FROM attempt_nodes n WHERE n.attempt_id = attempts.id) "
        "WHERE (SELECT count(DISTINCT n.worker_id) FROM attempt_nodes n WHERE n.attempt_id = attempts.id) = 1"
    )
    op.execute(
        "DELETE FROM attempt_nodes WHERE attempt_id IN (SELECT a.id FROM attempts a WHERE a.nnodes = 1)"
    )
