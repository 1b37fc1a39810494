"""The ledger as the hand-written SQLite migrations left it at their version 10: events, pods, attempts,
runs and segments, the cost rollups and their triggers, the ledger's identity, and runs as leased records.

On a new database: the tables of ``tpuctl.store.tables`` this revision adds, then the engine's triggers
and fixed rows (``tpuctl.store.derived``) and the ledger's identity. A SQLite ledger the hand-written
migrations made is stamped with this revision instead of running it (``tpuctl.store.migrate``).
"""

from tpuctl.store import derived
from tpuctl.store.migrations.steps import create_added_tables, refuse_downgrade

revision = "0001_ledger_v10"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    conn = create_added_tables(revision)
    for statement in derived.statements(conn.dialect):
        conn.execute(statement)
    derived.seed_identity(conn)


def downgrade() -> None:
    refuse_downgrade()
