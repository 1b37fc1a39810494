"""Waste by run: ``run_waste``, per run, the quota its preempted slices held until deleted and their
recomputed work, kept by triggers on ``pods`` and filled here from the slices already recorded
(``tpuctl.store.run_waste`` says why). ``tpuctl.store.tables._waste_by_run`` defines it.
"""

from alembic import op

from tpuctl.store.run_waste import WASTE
from tpuctl.store.sql import SqlAlchemyConnection
from tpuctl.store.tables import added_by

revision = "0005_waste_by_run"
down_revision = "0004_cost_by_owner"
branch_labels = None
depends_on = None


def upgrade() -> None:
    bind = op.get_bind()
    for table in added_by(revision):
        table.create(bind)
    WASTE.create(SqlAlchemyConnection.of(bind))


def downgrade() -> None:
    raise NotImplementedError("the ledger is never migrated down: restore a copy instead")
