"""multi-node jobs: attempt_nodes (gangs and their nodes), jobs.req_nodes, attempts.nnodes, a node
rank in each log chunk's key

Columns are added with plain ALTER TABLE ADD COLUMN (SQLite supports it), not in batch mode: a batch
rebuild of `jobs` would lose ix_jobs_claim's DESC again (see 0007). log_chunks gains a key column, which
SQLite cannot add to a primary key in place: the table is copied into its new shape.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-23 10:00:00.000000
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None

_BIG = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.add_column('jobs', sa.Column('req_nodes', sa.Integer(), server_default='1', nullable=False))
    op.add_column('attempts', sa.Column('nnodes', sa.Integer(), server_default='1', nullable=False))
    op.create_table(
        'attempt_nodes',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('job_id', sa.Integer(), nullable=False),
        sa.Column('worker_id', sa.Integer(), nullable=False),
        sa.Column('attempt_id', sa.Integer(), nullable=True),
        sa.Column('node_rank', sa.Integer(), nullable=True),
        sa.Column('status', sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
        sa.Column('devices', sa.JSON(), nullable=False),
        sa.Column('joined_at', sa.Float(), nullable=False),
        sa.Column('until', sa.Float(), nullable=True),
        sa.Column('lease_expires_at', sa.Float(), nullable=True),
        sa.Column('address', sqlmodel.sql.sqltypes.AutoString(length=255), nullable=True),
        sa.Column('port', sa.Integer(), nullable=True),
        sa.Column('ready_at', sa.Float(), nullable=True),
        sa.Column('finished_at', sa.Float(), nullable=True),
        sa.Column('plan', sa.JSON(), nullable=True),
        sa.Column('report', sa.JSON(), nullable=True),
        sa.ForeignKeyConstraint(['job_id'], ['jobs.id']),
        sa.ForeignKeyConstraint(['worker_id'], ['workers.id']),
        sa.ForeignKeyConstraint(['attempt_id'], ['attempts.id']),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('attempt_id', 'node_rank', name='uq_attempt_nodes_rank'),
    )
    op.create_index('ix_attempt_nodes_job', 'attempt_nodes', ['job_id', 'status'])
    op.create_index('ix_attempt_nodes_worker', 'attempt_nodes', ['worker_id', 'status'])

    op.create_table(
        'log_chunks_by_node',
        sa.Column('attempt_id', sa.Integer(), nullable=False),
        sa.Column('node_rank', sa.Integer(), nullable=False),
        sa.Column('offset', _BIG, nullable=False),
        sa.Column('job_id', sa.Integer(), nullable=False),
        sa.Column('length', sa.Integer(), nullable=False),
        sa.Column('data', sa.LargeBinary(), nullable=False),
        sa.Column('time', sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint('attempt_id', 'node_rank', 'offset'),
        sqlite_with_rowid=False,
    )
    op.execute(
        'INSERT INTO log_chunks_by_node (attempt_id, node_rank, "offset", job_id, length, data, time) '
        'SELECT attempt_id, 0, "offset", job_id, length, data, time FROM log_chunks'
    )
    op.drop_index('ix_log_chunks_job_id', table_name='log_chunks')
    op.drop_table('log_chunks')
    op.rename_table('log_chunks_by_node', 'log_chunks')
    op.create_index('ix_log_chunks_job_id', 'log_chunks', ['job_id'])


def downgrade() -> None:
    op.create_table(
        'log_chunks_one_node',
        sa.Column('attempt_id', sa.Integer(), nullable=False),
        sa.Column('offset', _BIG, nullable=False),
        sa.Column('job_id', sa.Integer(), nullable=False),
        sa.Column('length', sa.Integer(), nullable=False),
        sa.Column('data', sa.LargeBinary(), nullable=False),
        sa.Column('time', sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint('attempt_id', 'offset'),
        sqlite_with_rowid=False,
    )
    op.execute(
        'INSERT INTO log_chunks_one_node (attempt_id, "offset", job_id, length, data, time) '
        'SELECT attempt_id, "offset", job_id, length, data, time FROM log_chunks WHERE node_rank = 0'
    )
    op.drop_index('ix_log_chunks_job_id', table_name='log_chunks')
    op.drop_table('log_chunks')
    op.rename_table('log_chunks_one_node', 'log_chunks')
    op.create_index('ix_log_chunks_job_id', 'log_chunks', ['job_id'])
    op.drop_index('ix_attempt_nodes_worker', table_name='attempt_nodes')
    op.drop_index('ix_attempt_nodes_job', table_name='attempt_nodes')
    op.drop_table('attempt_nodes')
    with op.batch_alter_table('attempts') as batch_op:
        batch_op.drop_column('nnodes')
    with op.batch_alter_table('jobs') as batch_op:
        batch_op.drop_column('req_nodes')
    op.execute("DROP INDEX ix_jobs_claim")
    op.execute("CREATE INDEX ix_jobs_claim ON jobs (status, priority DESC, id)")
