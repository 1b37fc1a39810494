"""Teams on the control plane: who did what (principal and workspace on runs, slices, attempts and cost
events), the server's run queue (priority, queued and admitted instants, the reason a run waits) and the
audit log, as ``tpuctl.store.tables._teams`` defines them. Existing rows keep NULL: the implicit local
workspace, an unknown principal.
"""

from alembic import op

from tpuctl.store.tables import (
    ATTRIBUTED_TABLES,
    added_by,
    attribution_columns,
    build_metadata,
    run_queue_columns,
)

revision = "0003_teams"
down_revision = "0002_servers"
branch_labels = None
depends_on = None


def upgrade() -> None:
    bind = op.get_bind()
    for name in ATTRIBUTED_TABLES:
        for column in attribution_columns():
            op.add_column(name, column)
    for column in run_queue_columns():
        op.add_column("runs", column)
    for table in added_by(revision):
        table.create(bind)
    runs = build_metadata(revision).tables["runs"]
    for index in runs.indexes:
        if index.name in ("runs_workspace", "runs_queued"):
            index.create(bind)


def downgrade() -> None:
    raise NotImplementedError("the ledger is never migrated down: restore a copy instead")
