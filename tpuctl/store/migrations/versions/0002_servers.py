"""`tpuctl server`: the servers using the ledger (``server_replicas``) and the submissions they took
(``run_submissions``), as ``tpuctl.store.tables`` defines them (why: ``tables._servers``).
"""

from tpuctl.store.migrations.steps import create_added_tables, refuse_downgrade

revision = "0002_servers"
down_revision = "0001_ledger_v10"
branch_labels = None
depends_on = None


def upgrade() -> None:
    create_added_tables(revision)


def downgrade() -> None:
    refuse_downgrade()
