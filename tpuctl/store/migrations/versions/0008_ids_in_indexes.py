"""Ids in the covering indexes: on PostgreSQL, each index of ``tables.COVERING_WITH_ID`` made again with
the row's ``id`` included (SQLite's already hold the rowid: nothing to do there), and on both engines the
partial index of the slices billed past a second midnight, ``tables.MULTI_DAY_INDEX``. Why: the comments
on both names in ``tpuctl.store.tables``.
"""

from tpuctl.store.migrations.steps import create_added_tables, make_indexes, refuse_downgrade
from tpuctl.store.sql import POSTGRESQL
from tpuctl.store.tables import COVERING_WITH_ID, MULTI_DAY_INDEX

revision = "0008_ids_in_indexes"
down_revision = "0007_cost_without_a_run"
branch_labels = None
depends_on = None


def upgrade() -> None:
    conn = create_added_tables(revision)
    changed = (*COVERING_WITH_ID, MULTI_DAY_INDEX) if conn.dialect is POSTGRESQL else (MULTI_DAY_INDEX,)
    make_indexes(revision, changed)


def downgrade() -> None:
    refuse_downgrade()
