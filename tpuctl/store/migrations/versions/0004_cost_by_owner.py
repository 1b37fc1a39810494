"""Cost by owner: ``cost_rollup_owner``, the billed slices of ``cost_rollup`` keyed by day, workspace,
principal, zone, type and capacity, kept by triggers on ``pods`` and filled here from the slices already
recorded; and covering indexes by owner of the slices such a report reads one by one
(``tpuctl.store.owner_rollup.OWNER_INDEXES`` says why). ``tpuctl.store.tables._cost_by_owner``
defines them.
"""

from tpuctl.store import owner_rollup
from tpuctl.store.migrations.steps import create_added_tables, make_indexes, refuse_downgrade

revision = "0004_cost_by_owner"
down_revision = "0003_teams"
branch_labels = None
depends_on = None


def upgrade() -> None:
    conn = create_added_tables(revision)
    make_indexes(revision, owner_rollup.OWNER_INDEXES)
    owner_rollup.OWNER.create(conn)


def downgrade() -> None:
    refuse_downgrade()
