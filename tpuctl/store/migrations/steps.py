"""What the revisions of the ledger's history do alike: create the tables a revision adds, and refuse to
migrate down. Imported by the revisions only (Alembic is not imported where a ledger is merely opened)."""

from __future__ import annotations

from typing import Any, NoReturn

from alembic import op

from tpuctl.store.sql import SqlAlchemyConnection
from tpuctl.store.tables import added_by


def create_added_tables(revision: str) -> SqlAlchemyConnection:
    """Create the tables ``revision`` adds (``tables.added_by``, in creation order) on the migration's
    connection; that connection, to run the revision's further statements on."""
    bind: Any = op.get_bind()
    for table in added_by(revision):
        table.create(bind)
    return SqlAlchemyConnection.of(bind)


def refuse_downgrade() -> NoReturn:
    raise NotImplementedError("the ledger is never migrated down: restore a copy instead")
