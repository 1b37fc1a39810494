"""`tpuctl server`: the servers using the ledger (``server_replicas``) and the submissions they took
(``run_submissions``), as ``tpuctl.store.tables`` defines them (why: ``tables._servers``).
"""

from alembic import op

from tpuctl.store.tables import added_by

revision = "0002_servers"
down_revision = "0001_ledger_v10"
branch_labels = None
depends_on = None


def upgrade() -> None:
    bind = op.get_bind()
    for table in added_by(revision):
        table.create(bind)


def downgrade() -> None:
    raise NotImplementedError("the ledger is never migrated down: restore a copy instead")
