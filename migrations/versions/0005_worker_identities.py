"""worker identities: each registered worker holds its own token (its SHA-256 digest is kept)

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23 05:45:00.000000
"""

from alembic import op
import sqlalchemy as sa


revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('workers', schema=None) as batch_op:
        batch_op.add_column(sa.Column('token_hash', sa.String(length=64), nullable=True))
        batch_op.create_index(batch_op.f('ix_workers_token_hash'), ['token_hash'], unique=True)


def downgrade() -> None:
    with op.batch_alter_table('workers', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_workers_token_hash'))
        batch_op.drop_column('token_hash')
