"""Teams on the control plane: who did what (principal and workspace on runs, slices, attempts and cost
events), the server's run queue (priority, queued and admitted instants, the reason a run waits) and the
audit log, as ``tpuctl.store.tables._teams`` defines them. Existing rows keep NULL: the implicit local
workspace, an unknown principal.
"""

from alembic import op

from tpuctl.store.migrations.steps import create_added_tables, make_indexes, refuse_downgrade
from tpuctl.store.tables import ATTRIBUTED_TABLES, attribution_columns, run_queue_columns

revision = "0003_teams"
down_revision = "0002_servers"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for name in ATTRIBUTED_TABLES:
        for column in attribution_columns():
            op.add_column(name, column)
    for column in run_queue_columns():
        op.add_column("runs", column)
    create_added_tables(revision)
    make_indexes(revision, ("runs_workspace", "runs_queued"))


def downgrade() -> None:
    refuse_downgrade()
