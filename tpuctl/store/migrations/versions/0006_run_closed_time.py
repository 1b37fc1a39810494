"""Closed time by run: ``run_closed_time``, per run, its closed slices' time at their recorded price, kept
by triggers on ``pods`` and filled here from the slices already recorded (``tpuctl.store.run_closed_time``
says why). ``tpuctl.store.tables._closed_time_by_run`` defines it.
"""

from alembic import op

from tpuctl.store.run_closed_time import CLOSED_TIME
from tpuctl.store.sql import SqlAlchemyConnection
from tpuctl.store.tables import added_by

revision = "0006_run_closed_time"
down_revision = "0005_waste_by_run"
branch_labels = None
depends_on = None


def upgrade() -> None:
    bind = op.get_bind()
    for table in added_by(revision):
        table.create(bind)
    CLOSED_TIME.create(SqlAlchemyConnection.of(bind))


def downgrade() -> None:
    raise NotImplementedError("the ledger is never migrated down: restore a copy instead")
