"""Cost by owner: ``cost_rollup_owner``, the billed slices of ``cost_rollup`` keyed by day, workspace,
principal, zone, type and capacity, kept by triggers on ``pods`` and filled here from the slices already
recorded; and covering indexes by owner of the slices such a report reads one by one
(``tpuctl.store.owner_rollup.OWNER_INDEXES`` says why). ``tpuctl.store.tables._cost_by_owner``
defines them.
"""

from alembic import op

from tpuctl.store import owner_rollup
from tpuctl.store.sql import SqlAlchemyConnection
from tpuctl.store.tables import added_by, build_metadata

revision = "0004_cost_by_owner"
down_revision = "0003_teams"
branch_labels = None
depends_on = None


def upgrade() -> None:
    bind = op.get_bind()
    for table in added_by(revision):
        table.create(bind)
    for index in build_metadata(revision).tables["pods"].indexes:
        if index.name in owner_rollup.OWNER_INDEXES:
            index.create(bind)
    owner_rollup.OWNER.create(SqlAlchemyConnection.of(bind))


def downgrade() -> None:
    raise NotImplementedError("the ledger is never migrated down: restore a copy instead")
