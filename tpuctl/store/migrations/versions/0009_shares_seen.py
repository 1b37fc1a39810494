"""Whether a run ever ran on a slice no run created: the ``ledger_meta`` row ``shares_seen``, set by
triggers on ``pods`` and ``run_segments`` and here where the ledger already holds such a share
(``tpuctl.store.shares_seen`` says why).
"""

from tpuctl.store import shares_seen
from tpuctl.store.migrations.steps import create_added_tables, refuse_downgrade

revision = "0009_shares_seen"
down_revision = "0008_ids_in_indexes"
branch_labels = None
depends_on = None


def upgrade() -> None:
    shares_seen.create(create_added_tables(revision))


def downgrade() -> None:
    refuse_downgrade()
