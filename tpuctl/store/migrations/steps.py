"""What the revisions of the ledger's history do alike: create the tables a revision adds, make indexes
as it defines them, and refuse to migrate down. Imported by the revisions only (Alembic is not
imported where a ledger is merely opened)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NoReturn

from alembic import op

from tpuctl.store.sql import SqlAlchemyConnection
from tpuctl.store.tables import added_by, build_metadata


def create_added_tables(revision: str) -> SqlAlchemyConnection:
    """Create the tables ``revision`` adds (``tables.added_by``, in creation order) on the migration's
    connection; that connection, to run the revision's further statements on."""
    bind: Any = op.get_bind()
    for table in added_by(revision):
        table.create(bind)
    return SqlAlchemyConnection.of(bind)


def make_indexes(revision: str, names: Sequence[str]) -> None:
    """Make each index of ``names`` as ``revision``'s tables define it: dropped where it exists (an earlier
    revision's form of it), then created."""
    bind: Any = op.get_bind()
    metadata = build_metadata(revision)
    wanted = set(names)
    found = [i for t in metadata.sorted_tables for i in t.indexes if i.name in wanted]
    missing = wanted - {str(i.name) for i in found}
    if missing:
        raise ValueError(f"{revision} defines no index {sorted(missing)}")
    for index in sorted(found, key=lambda i: str(i.name)):
        op.execute(f"DROP INDEX IF EXISTS {index.name}")
        index.create(bind)


def refuse_downgrade() -> NoReturn:
    raise NotImplementedError("the ledger is never migrated down: restore a copy instead")
