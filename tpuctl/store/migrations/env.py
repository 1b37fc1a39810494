"""Alembic's environment for the ledger: always handed a connection by ``tpuctl.store.migrate`` (in
``config.attributes["connection"]``), inside the transaction and the lock its caller holds; never run
from a URL in a config file."""

from alembic import context

from tpuctl.store.migrate import on_revision_applied

connection = context.config.attributes["connection"]
context.configure(connection=connection, transactional_ddl=True, on_version_apply=on_revision_applied)
with context.begin_transaction():
    context.run_migrations()
