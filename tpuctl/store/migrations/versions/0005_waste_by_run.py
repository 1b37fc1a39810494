"""Waste by run: ``run_waste``, per run, the quota its preempted slices held until deleted and their
recomputed work, kept by triggers on ``pods`` and filled here from the slices already recorded
(``tpuctl.store.run_waste`` says why). ``tpuctl.store.tables._waste_by_run`` defines it.
"""

from tpuctl.store.migrations.steps import create_added_tables, refuse_downgrade
from tpuctl.store.run_waste import WASTE

revision = "0005_waste_by_run"
down_revision = "0004_cost_by_owner"
branch_labels = None
depends_on = None


def upgrade() -> None:
    WASTE.create(create_added_tables(revision))


def downgrade() -> None:
    refuse_downgrade()
