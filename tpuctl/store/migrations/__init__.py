"""The ledger's migration history, run by Alembic on either engine (``tpuctl.store.migrate``).

``versions/`` holds the revisions; ``HEAD`` names the newest, so that opening a ledger checks it is
current with one query and without importing Alembic (a test keeps ``KNOWN`` equal to Alembic's view of
``versions/``, in order). ``BASELINE`` is the first revision: the schema the hand-written SQLite
migrations (``tpuctl.store.schema``) had reached, which a ledger they made is stamped with when adopted.
"""

from typing import Final

#: Every revision, oldest first.
KNOWN: Final = (
    "0001_ledger_v10",
    "0002_servers",
    "0003_teams",
    "0004_cost_by_owner",
    "0005_waste_by_run",
    "0006_run_closed_time",
    "0007_cost_without_a_run",
    "0008_ids_in_indexes",
    "0009_shares_seen",
)
BASELINE: Final = KNOWN[0]
HEAD: Final = KNOWN[-1]
