"""Cost of the slices no run created: ``cost_rollup_norun``, the slices ``cost_rollup`` sums that no run
created, keyed by day, zone, type and capacity, kept by triggers on ``pods`` and filled here from the
slices already recorded (``tpuctl.store.norun_rollup`` says why). ``tpuctl.store.tables._cost_without_a_run``
defines it.
"""

from tpuctl.store.migrations.steps import create_added_tables, refuse_downgrade
from tpuctl.store.norun_rollup import NORUN

revision = "0007_cost_without_a_run"
down_revision = "0006_run_closed_time"
branch_labels = None
depends_on = None


def upgrade() -> None:
    NORUN.create(create_added_tables(revision))


def downgrade() -> None:
    refuse_downgrade()
