"""Cost of the slices no run created: ``cost_rollup_norun``, the slices ``cost_rollup`` sums that no run
created, keyed by day, zone, type and capacity, kept by triggers on ``pods`` and filled here from the
slices already recorded (``tpuctl.store.norun_rollup`` says why). ``tpuctl.store.tables._cost_without_a_run``
defines it.
"""

from alembic import op

from tpuctl.store.norun_rollup import NORUN
from tpuctl.store.sql import SqlAlchemyConnection
from tpuctl.store.tables import added_by

revision = "0007_cost_without_a_run"
down_revision = "0006_run_closed_time"
branch_labels = None
depends_on = None


def upgrade() -> None:
    bind = op.get_bind()
    for table in added_by(revision):
        table.create(bind)
    NORUN.create(SqlAlchemyConnection.of(bind))


def downgrade() -> None:
    raise NotImplementedError("the ledger is never migrated down: restore a copy instead")
