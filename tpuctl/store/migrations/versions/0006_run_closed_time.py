"""Closed time by run: ``run_closed_time``, per run, its closed slices' time at their recorded price, kept
by triggers on ``pods`` and filled here from the slices already recorded (``tpuctl.store.run_closed_time``
says why). ``tpuctl.store.tables._closed_time_by_run`` defines it.
"""

from tpuctl.store.migrations.steps import create_added_tables, refuse_downgrade
from tpuctl.store.run_closed_time import CLOSED_TIME

revision = "0006_run_closed_time"
down_revision = "0005_waste_by_run"
branch_labels = None
depends_on = None


def upgrade() -> None:
    CLOSED_TIME.create(create_added_tables(revision))


def downgrade() -> None:
    refuse_downgrade()
