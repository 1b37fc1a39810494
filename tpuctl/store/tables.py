"""The ledger's schema, once, for both engines: every table, key and index as SQLAlchemy Core metadata.

Alembic's history (``tpuctl.store.migrations``) creates it from here on a new database, SQLite or
PostgreSQL. Why each table and index exists is told where it was added, in the hand-written migrations
that made SQLite ledgers before Alembic (``tpuctl.store.schema``); a ledger they made is adopted by the
history as it is, and a test checks that it has exactly the tables, columns and indexes defined here.

Types map to what both engines hold exactly: TEXT, 64-bit integers, 8-byte floats (SQLite's REAL,
PostgreSQL's double precision), bytes. SQLite tables are STRICT (a wrong type is an error at write time)
and keys of rowid-less tables are ``WITHOUT ROWID``; an ``INTEGER`` primary key on SQLite is the rowid.
A single-column key is declared nullable, as the hand-written migrations declared it: SQLite then
records no NOT NULL on it (an ``INTEGER`` key is the rowid, never NULL anyway), and PostgreSQL makes
every key column NOT NULL whatever the declaration. Foreign keys are ``DEFERRABLE INITIALLY DEFERRED``
on both: the bulk path inserts events before the pod rows they point to, and the constraint is checked
at commit.

What is not a table (the triggers that keep the rollups, the day offsets' rows, the ledger's identity)
is in ``tpuctl.store.derived``, per engine.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from tpuctl.store import billing
from tpuctl.store.sql import POSTGRESQL, SQLITE

if TYPE_CHECKING:
    import sqlalchemy as sa

    from tpuctl.store.run_sums import RunSums
    from tpuctl.store.slice_rollup import SliceRollup


def build_metadata(upto: str | None = None) -> sa.MetaData:
    """The ledger's tables at revision ``upto`` of the history (default: its head) in a ``MetaData``
    built on first call (SQLAlchemy is imported only by code that creates or migrates a database, never
    at tpuctl's start) and the same one after: every migration of a new ledger asks for each revision's
    tables again, and building them took most of a new SQLite ledger's time. Read it, never change it.
    Each group of tables belongs to the revision that added it, which creates exactly those
    (``added_by``); a revision that changes a table already made writes its own ``op`` calls."""
    from tpuctl.store import migrations

    return _metadata_at(migrations.HEAD if upto is None else upto)


@functools.cache
def _metadata_at(upto: str) -> sa.MetaData:
    import sqlalchemy as sa

    from tpuctl.store import migrations

    metadata = sa.MetaData()
    for revision, define in _GROUPS:
        if migrations.KNOWN.index(revision) <= migrations.KNOWN.index(upto):
            define(metadata)
    return metadata


def added_by(revision: str) -> list[sa.Table]:
    """The tables ``revision`` adds to the ledger, in creation order."""
    from tpuctl.store import migrations

    now = build_metadata(revision)
    index = migrations.KNOWN.index(revision)
    before = set() if index == 0 else set(build_metadata(migrations.KNOWN[index - 1]).tables)
    return [t for t in now.sorted_tables if t.name not in before]


def _ledger_meta(metadata: sa.MetaData) -> None:
    import sqlalchemy as sa

    sa.Table("ledger_meta", metadata, _text("key", primary_key=True, nullable=True),
             _text("value", nullable=False), sqlite_strict=True)  # fmt: skip


def _integer(name: str, *args: Any, **kwargs: Any) -> sa.Column[Any]:
    import sqlalchemy as sa

    # INTEGER on SQLite (so an integer primary key is the rowid alias); 64-bit on PostgreSQL.
    return sa.Column(name, sa.BigInteger().with_variant(sa.Integer(), "sqlite"), *args, **kwargs)


def _real(name: str, *args: Any, **kwargs: Any) -> sa.Column[Any]:
    import sqlalchemy as sa

    # REAL on SQLite (the only float a STRICT table takes); double precision on PostgreSQL.
    from sqlalchemy.dialects import sqlite

    return sa.Column(name, sa.Double().with_variant(sqlite.REAL(), "sqlite"), *args, **kwargs)


def _text(name: str, *args: Any, **kwargs: Any) -> sa.Column[Any]:
    import sqlalchemy as sa

    return sa.Column(name, sa.Text(), *args, **kwargs)


def _fk(target: str) -> sa.ForeignKey:
    import sqlalchemy as sa

    return sa.ForeignKey(target, deferrable=True, initially="DEFERRED")


def _where(sqlite_sql: str, postgresql_sql: str | None = None) -> dict[str, Any]:
    import sqlalchemy as sa

    """A partial index's condition on each engine (the same text unless the engines spell it apart)."""
    return {
        "sqlite_where": sa.text(sqlite_sql),
        "postgresql_where": sa.text(sqlite_sql if postgresql_sql is None else postgresql_sql),
    }


def _pods_and_events(metadata: sa.MetaData) -> None:
    import sqlalchemy as sa

    zero = sa.text("0")
    pods = sa.Table(
        "pods", metadata,
        _integer("id", primary_key=True, nullable=True, autoincrement=False),
        _text("zone", nullable=False), _text("name", nullable=False),
        _integer("incarnation", nullable=False), _text("state", nullable=False),
        _text("accelerator_type"), _integer("chips"), _integer("hosts"), _text("capacity"),
        _real("price_per_chip_hour"), _text("labels", nullable=False, server_default=sa.text("'{}'")),
        _text("request_id"), _text("run_id"), _text("queued_resource"),
        _integer("slice_index"), _text("backend"), _text("project"),
        _real("requested_at"), _real("created_at"), _real("ready_at"), _real("ended_at"),
        _text("end_reason"), _real("deleted_at"), _real("updated_at", nullable=False),
        _integer("last_event_id", nullable=False), _real("bill_mark"),
        _real("billed_s", nullable=False, server_default=zero),
        _real("billed_chip_s", nullable=False, server_default=zero),
        _real("billed_usd_s", nullable=False, server_default=zero),
        _real("billed_unpriced_chip_s", nullable=False, server_default=zero),
        _real("rec_priced", nullable=False, server_default=zero),
        _real("rec_unpriced", nullable=False, server_default=zero),
        _integer("rolled", nullable=False, server_default=zero),
        sa.UniqueConstraint("zone", "name", "incarnation"),
        sqlite_strict=True,
    )  # fmt: skip
    closed = "ended_at IS NOT NULL AND ready_at IS NOT NULL"
    crossing = {
        engine: f"{closed} AND {billing.crosses_midnight_sql('', dialect=engine)}"
        for engine in (SQLITE, POSTGRESQL)
    }
    billed = ("billed_s", "billed_chip_s", "billed_usd_s", "billed_unpriced_chip_s", "labels")
    closed_cols = ("ready_at", "ended_at", "zone", "accelerator_type", "capacity", "end_reason", "chips",
                   "price_per_chip_hour", *billed)  # fmt: skip
    billing_cols = ("ready_at", "ended_at", "end_reason", "deleted_at", "chips", "capacity",
                    "accelerator_type", "price_per_chip_hour")  # fmt: skip
    preempted = "end_reason = 'preempted'"
    c = pods.c
    indexes = [
        ("pods_open", ("zone", "name"), "ended_at IS NULL", True),
        ("pods_name", ("name",), None, False),
        ("pods_run", ("run_id", *billing_cols, "zone"), "run_id IS NOT NULL", False),
        ("pods_request", ("request_id",), "request_id IS NOT NULL", False),
        ("pods_closed", closed_cols, closed, False),
        ("pods_preempted", ("zone", "accelerator_type", "capacity", "ended_at", "deleted_at", "ready_at",
                            "end_reason", "chips", "price_per_chip_hour", "labels", "run_id"),
         preempted, False),
        ("pods_ended", ("ended_at", "ready_at"), "ended_at IS NOT NULL", False),
        ("pods_norun", ("zone", "name", *billing_cols, "run_id"), "run_id IS NULL", False),
        ("pods_cost", ("billed_usd_s", "ready_at", "ended_at", "chips", "capacity", "end_reason"),
         closed, False),
        ("pods_unpriced", ("billed_unpriced_chip_s",), "billed_unpriced_chip_s > 0", False),
        ("pods_rec", ("zone", "accelerator_type", "capacity", "ready_at", "ended_at", "run_id", "labels",
                      "rec_priced", "rec_unpriced"), "rec_priced != 0 OR rec_unpriced != 0", False),
        ("pods_held", ("deleted_at", "ended_at"), preempted, False),
        ("pods_preemptions", ("ended_at", "ready_at", "capacity"), preempted, False),
    ]  # fmt: skip
    for name, columns, where, unique in indexes:
        options = {} if where is None else _where(where)
        sa.Index(name, *(c[col] for col in columns), unique=unique, **options)
    sa.Index("pods_crossing", *(c[col] for col in closed_cols),
             **_where(crossing[SQLITE], crossing[POSTGRESQL]))  # fmt: skip
    sa.Index("pods_unrolled_crossing", c.ready_at,
             **_where(f"{crossing[SQLITE]} AND rolled = 0",
                      f"{crossing[POSTGRESQL]} AND rolled = 0"))  # fmt: skip

    events = sa.Table(
        "events", metadata,
        _integer("id", primary_key=True, nullable=True, autoincrement=False),
        _real("ts", nullable=False), _text("kind", nullable=False), _text("pod"), _text("zone"),
        _integer("pod_id", _fk("pods.id")), _text("accelerator_type"), _integer("chips"),
        _text("capacity"), _real("price_per_chip_hour"), _text("labels"), _text("run_id"),
        _text("request_id"), _text("detail"), _integer("hosts"), _text("queued_resource"),
        _integer("slice_index"), _text("backend"), _text("project"),
        sqlite_strict=True,
    )  # fmt: skip
    e = events.c
    price_change = "kind = 'price_change'"
    sa.Index("events_ts", e.ts)
    sa.Index("events_pod", e.pod_id, e.ts, **_where("pod_id IS NOT NULL"))
    sa.Index("events_run", e.run_id, e.ts, **_where("run_id IS NOT NULL"))
    sa.Index("events_price", e.ts, **_where(price_change))
    sa.Index("events_price_facts", e.pod_id, e.ts, e.price_per_chip_hour, e.kind, **_where(price_change))
    sa.Index("events_end", e.pod_id, **_where(f"kind IN {billing.END_KINDS_SQL}"))

    attempts = sa.Table(
        "attempts", metadata,
        _integer("id", primary_key=True, nullable=True),
        _text("request_id", nullable=False), _real("ts", nullable=False), _text("zone", nullable=False),
        _text("capacity"), _text("outcome", nullable=False), _text("message"), _real("duration_s"),
        _text("pod"), _text("accelerator_type"),
        _integer("event_id", _fk("events.id"), nullable=False), _text("detail"),
        sqlite_strict=True,
    )  # fmt: skip
    sa.Index("attempts_request", attempts.c.request_id, attempts.c.ts)


def _runs(metadata: sa.MetaData) -> None:
    import sqlalchemy as sa

    zero = sa.text("0")
    runs = sa.Table(
        "runs", metadata,
        _text("run_id", primary_key=True, nullable=True), _text("script", nullable=False),
        _text("args", nullable=False, server_default=sa.text("'[]'")), _text("status", nullable=False),
        _text("pod"), _text("zone"), _text("accelerator_type"), _text("capacity"),
        _real("created_at", nullable=False), _real("ended_at"), _integer("exit_code"),
        _integer("restarts", nullable=False, server_default=zero),
        _integer("preemptions", nullable=False, server_default=zero),
        _integer("steps", nullable=False, server_default=zero),
        _text("labels", nullable=False, server_default=sa.text("'{}'")), _text("detail"),
        _real("updated_at", nullable=False),
        sqlite_strict=True,
    )  # fmt: skip
    sa.Index("runs_created", runs.c.created_at)
    segments = sa.Table(
        "run_segments", metadata,
        _integer("id", primary_key=True, nullable=True),
        _text("run_id", _fk("runs.run_id"), nullable=False), _text("kind", nullable=False),
        _real("started_at", nullable=False), _real("ended_at"), _text("pod"), _text("zone"),
        _text("capacity"), _integer("steps_completed"), _integer("steps_recomputed"),
        _text("detail"),
        sqlite_strict=True,
    )  # fmt: skip
    s = segments.c
    sa.Index("run_segments_run", s.run_id, s.started_at)
    sa.Index("run_segments_open", s.run_id, unique=True, **_where("ended_at IS NULL"))
    sa.Index("run_segments_pod", s.zone, s.pod, **_where("pod IS NOT NULL"))
    sa.Index("run_segments_recomputed", s.zone, s.pod, s.run_id, s.started_at, s.ended_at, s.steps_completed,
             s.steps_recomputed, **_where("steps_recomputed > 0"))  # fmt: skip


def _key(*names: str) -> list[sa.Column[Any]]:
    """A rollup's key columns: a day (a number) or a group (text), NOT NULL as every key column is."""
    return [
        (_integer if n.endswith("day") else _text)(n, primary_key=True, autoincrement=False) for n in names
    ]


def _sums(*names: str) -> list[sa.Column[Any]]:
    """A rollup's sums: a count of slices, and seconds or USD-seconds."""
    return [(_integer if n == "slices" else _real)(n, nullable=False) for n in names]


def _rollups(metadata: sa.MetaData) -> None:
    import sqlalchemy as sa

    from tpuctl.store.schema import ROLLUP_SUMS as billed

    groups = ("zone", "accelerator_type", "capacity", "labels")
    rowless: dict[str, Any] = {"sqlite_strict": True, "sqlite_with_rowid": False}
    sa.Table("cost_rollup", metadata, *_key("day", *groups), *_sums(*billed), **rowless)
    sa.Table("cost_day_offsets", metadata,
             _integer("n", primary_key=True, nullable=True, autoincrement=False),
             sqlite_strict=True)  # fmt: skip
    sa.Table("cost_rollup_x", metadata, *_key("first_day", "end_day", *groups),
             *_sums(*billed, "d0_s", "d0_chip_s", "d0_usd_s", "d0_unpriced_chip_s"), **rowless)  # fmt: skip
    sa.Table("cost_rollup_xdays", metadata, *_key("day", "first_day", "end_day", *groups),
             *_sums("slices", "s", "chip_s", "usd_s", "unpriced_chip_s"), **rowless)  # fmt: skip
    sa.Table("cost_rollup_held", metadata, *_key("end_day", "deleted_day", *groups),
             *_sums("slices", "held_chip_s", "held_usd_s", "held_unpriced_chip_s"), **rowless)  # fmt: skip


def _run_records(metadata: sa.MetaData) -> None:
    import sqlalchemy as sa

    run = _fk("runs.run_id")
    sa.Table(
        "run_leases", metadata,
        _text("run_id", _fk("runs.run_id"), primary_key=True, nullable=True),
        _integer("generation", nullable=False),
        _text("token"), _text("owner_id"), _text("host"), _integer("pid"),
        _integer("start_ticks"), _real("claimed_at"), _real("renewed_at"), _real("expires_at"),
        sa.CheckConstraint("(token IS NULL) = (expires_at IS NULL) AND (token IS NULL) = (owner_id IS NULL)"),
        sqlite_strict=True,
    )  # fmt: skip
    history = sa.Table(
        "run_lease_history", metadata,
        _integer("id", primary_key=True, nullable=True), _text("run_id", run, nullable=False),
        _real("at", nullable=False), _text("action", nullable=False),
        _integer("generation", nullable=False), _text("owner_id", nullable=False),
        _text("host", nullable=False), _integer("pid", nullable=False), _integer("start_ticks"),
        _real("expires_at"), _text("detail"),
        sqlite_strict=True,
    )  # fmt: skip
    sa.Index("run_lease_history_run", history.c.run_id, history.c.id)
    sa.Table(
        "run_cancel_requests", metadata,
        _text("run_id", _fk("runs.run_id"), primary_key=True, nullable=True),
        _real("requested_at", nullable=False), _text("requested_by", nullable=False),
        sqlite_strict=True,
    )  # fmt: skip
    intents = sa.Table(
        "run_intents", metadata,
        _integer("id", primary_key=True, nullable=True), _text("run_id", _fk("runs.run_id"), nullable=False),
        _real("at", nullable=False),
        _text("action", sa.CheckConstraint("action IN ('create', 'delete')"), nullable=False),
        _text("pod", nullable=False), _text("zone", nullable=False),
        _integer("generation", nullable=False), _text("owner_id", nullable=False), _text("detail"),
        sqlite_strict=True,
    )  # fmt: skip
    sa.Index("run_intents_run", intents.c.run_id, intents.c.id)
    sa.Table(
        "run_state", metadata,
        _text("run_id", _fk("runs.run_id"), primary_key=True, nullable=True), _text("phase"),
        _integer("attempt"),
        _text("slices", nullable=False, server_default=sa.text("'[]'")),
        _integer("generation", nullable=False), _real("updated_at", nullable=False),
        sqlite_strict=True,
    )  # fmt: skip
    sa.Table(
        "run_blobs", metadata,
        _text("run_id", _fk("runs.run_id"), primary_key=True), _text("name", primary_key=True),
        _text("sha256", nullable=False), _integer("size", nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False), _real("saved_at", nullable=False),
        sqlite_strict=True,
    )  # fmt: skip
    sa.Table(
        "run_secrets", metadata,
        _text("run_id", _fk("runs.run_id"), primary_key=True), _text("name", primary_key=True),
        _text("key_id", nullable=False), sa.Column("ciphertext", sa.LargeBinary(), nullable=False),
        _real("saved_at", nullable=False),
        sqlite_strict=True,
    )  # fmt: skip
    sa.Table(
        "run_log_lines", metadata,
        _text("run_id", _fk("runs.run_id"), primary_key=True),
        _integer("worker", primary_key=True, autoincrement=False),
        _integer("seq", primary_key=True, autoincrement=False),
        _real("at", nullable=False), _text("text", nullable=False),
        sqlite_strict=True, sqlite_with_rowid=False,
    )  # fmt: skip


def _servers(metadata: sa.MetaData) -> None:
    """`tpuctl server` (revision 0002): the servers using the ledger (one row per live server, renewed
    while it lives, its expiry on the ledger's clock) and the submissions they took (a client's
    idempotency key and the run it created, written before the run is, so no ``runs`` reference).
    ``tpuctl.store.servers``."""
    import sqlalchemy as sa

    sa.Table(
        "server_replicas", metadata,
        _text("replica_id", primary_key=True, nullable=True), _text("host", nullable=False),
        _integer("pid", nullable=False), _integer("start_ticks"), _text("listen", nullable=False),
        _real("started_at", nullable=False), _real("renewed_at", nullable=False),
        _real("expires_at", nullable=False),
        sqlite_strict=True,
    )  # fmt: skip
    sa.Table(
        "run_submissions", metadata,
        _text("idempotency_key", primary_key=True, nullable=True), _text("run_id", nullable=False),
        _text("request_sha256", nullable=False), _real("submitted_at", nullable=False),
        sqlite_strict=True,
    )  # fmt: skip


#: Who did it (revision 0003): the principal (an email; a local user's name without a server) and the
#: workspace each run, slice, attempt and cost event belongs to. NULL on rows written before: read as the
#: implicit local workspace (``tpuctl.teams.workspaces.LOCAL_WORKSPACE``) and an unknown principal.
ATTRIBUTED_TABLES: Final = ("runs", "pods", "events", "attempts")


def attribution_columns() -> list[sa.Column[Any]]:
    """The columns revision 0003 adds to each of ``ATTRIBUTED_TABLES`` (new objects on each call)."""
    return [_text("principal"), _text("workspace")]


def run_queue_columns() -> list[sa.Column[Any]]:
    """The columns revision 0003 adds to ``runs`` for the server's queue: the priority band
    (``production``, ``interactive``, ``batch``; NULL: batch), when the run entered the queue and when it
    was admitted (the ledger's clock; NULL: never queued / not yet), and why it waits now (NULL once
    admitted)."""
    return [_text("priority"), _real("queued_at"), _real("admitted_at"), _text("queue_reason")]


def _teams(metadata: sa.MetaData) -> None:
    """Teams on the control plane (revision 0003): attribution and queue columns on existing tables
    (``op.add_column`` in the revision, appended here so that the head's metadata has them) and the audit
    log of every mutating request the server took: who, what, on which target, when, and the answer."""
    import sqlalchemy as sa

    for name in ATTRIBUTED_TABLES:
        for column in attribution_columns():
            metadata.tables[name].append_column(column)
    for column in run_queue_columns():
        metadata.tables["runs"].append_column(column)
    audit = sa.Table(
        "audit_log", metadata,
        _integer("id", primary_key=True, nullable=True), _real("at", nullable=False),
        _text("principal", nullable=False), _text("workspace"), _text("method", nullable=False),
        _text("path", nullable=False), _text("action", nullable=False), _text("target"),
        _integer("status", nullable=False), _text("detail"),
        sqlite_strict=True,
    )  # fmt: skip
    sa.Index("audit_log_at", audit.c.at)
    sa.Index("runs_workspace", metadata.tables["runs"].c.workspace, metadata.tables["runs"].c.created_at)
    sa.Index(
        "runs_queued",
        metadata.tables["runs"].c.workspace,
        metadata.tables["runs"].c.queued_at,
        **_where("admitted_at IS NULL AND queued_at IS NOT NULL"),
    )


def _cost_by_owner(metadata: sa.MetaData) -> None:
    """Cost by owner (revision 0004): ``cost_rollup_owner`` sums the slices ``cost_rollup`` sums, keyed by
    day, workspace, principal, zone, type and capacity (no labels), so that cost grouped by workspace or
    principal reads a row per owner and day instead of every slice; and three covering indexes by owner
    of the slices such a report reads one by one (``owner_rollup.OWNER_INDEXES``). Triggers keep the table
    (``tpuctl.store.owner_rollup``, which says why each exists)."""
    import sqlalchemy as sa

    from tpuctl.store import owner_rollup

    _slice_rollup_table(metadata, owner_rollup.OWNER)
    pods = metadata.tables["pods"].c
    owner = ("workspace", "principal", "zone", "accelerator_type", "capacity")
    closed = "ended_at IS NOT NULL AND ready_at IS NOT NULL"
    crossing = {e: f"{closed} AND {billing.crosses_midnight_sql('', e)}" for e in (SQLITE, POSTGRESQL)}
    preempted, crossing_slices, recomputing = owner_rollup.OWNER_INDEXES
    held_columns = (
        *owner,
        "ended_at",
        "deleted_at",
        "ready_at",
        "chips",
        "price_per_chip_hour",
        "end_reason",
    )
    sa.Index(preempted, *(pods[col] for col in held_columns), **_where("end_reason = 'preempted'"))
    crossing_columns = ("workspace", "principal", "ready_at", "ended_at", "zone", "accelerator_type",
                        "capacity", "end_reason", "chips", "price_per_chip_hour")  # fmt: skip
    sa.Index(crossing_slices, *(pods[col] for col in crossing_columns),
             **_where(crossing[SQLITE], crossing[POSTGRESQL]))  # fmt: skip
    rec_columns = (*owner, "ready_at", "ended_at", "rec_priced", "rec_unpriced")
    sa.Index(
        recomputing, *(pods[col] for col in rec_columns), **_where("rec_priced != 0 OR rec_unpriced != 0")
    )


def _slice_rollup_table(metadata: sa.MetaData, rollup: SliceRollup) -> None:
    """A rollup of slices under a key of its own (``slice_rollup.SliceRollup``): its key, then its sums."""
    import sqlalchemy as sa

    from tpuctl.store.schema import ROLLUP_SUMS

    sa.Table(rollup.table, metadata, *_key(*rollup.key), *_sums(*ROLLUP_SUMS),
             sqlite_strict=True, sqlite_with_rowid=False)  # fmt: skip


def _cost_without_a_run(metadata: sa.MetaData) -> None:
    """Cost of the slices no run created (revision 0007): ``cost_rollup_norun``, the slices
    ``cost_rollup`` sums that no run created, keyed by day, zone, type and capacity
    (``tpuctl.store.norun_rollup``, which says why and what keeps it)."""
    from tpuctl.store.norun_rollup import NORUN

    _slice_rollup_table(metadata, NORUN)


def _waste_by_run(metadata: sa.MetaData) -> None:
    """Waste by run (revision 0005): ``run_waste``, per run, the quota its preempted slices held until
    deleted and their recomputed work (``tpuctl.store.run_waste``, which says why and what keeps it)."""
    from tpuctl.store.run_waste import WASTE

    _run_sums_table(metadata, WASTE)


def _closed_time_by_run(metadata: sa.MetaData) -> None:
    """Closed time by run (revision 0006): ``run_closed_time``, per run, its closed slices' time at their
    recorded price (``tpuctl.store.run_closed_time``, which says why and what keeps it)."""
    from tpuctl.store.run_closed_time import CLOSED_TIME

    _run_sums_table(metadata, CLOSED_TIME)


def _run_sums_table(metadata: sa.MetaData, sums: RunSums) -> None:
    """A table of sums per run (``run_sums.RunSums``): the run id, then a float per sum."""
    import sqlalchemy as sa

    sa.Table(sums.table, metadata, _text("run_id", primary_key=True, nullable=True),
             *(_real(c, nullable=False) for c in sums.sums), sqlite_strict=True)  # fmt: skip


#: The covering indexes of ``pods`` and ``events`` that a report reads rows' ids from besides the columns
#: they cover. SQLite's indexes hold the rowid; PostgreSQL's do not, so there each holds ``id`` too (as
#: ``INCLUDE``): without it, an index-only pass fetched every row from the table for its id (on a
#: 1,000,000-event ledger, 16,090 table pages for the 32,083 slices that redid steps).
COVERING_WITH_ID: Final = (
    "pods_closed", "pods_cost", "pods_crossing", "pods_crossing_owner", "pods_ended", "pods_held",
    "pods_norun", "pods_preempted", "pods_preempted_owner", "pods_preemptions", "pods_rec",
    "pods_rec_owner", "pods_run", "events_end", "events_price_facts",
)  # fmt: skip
#: The slices billed past a second midnight after their READY (``billing.multi_day_sql``): a report's
#: pass over the days after the first two reads these few by their own index.
MULTI_DAY_INDEX: Final = "pods_multiday"


def _ids_in_indexes(metadata: sa.MetaData) -> None:
    """Ids in the covering indexes (revision 0008): each of ``COVERING_WITH_ID`` made again with ``id``
    included on PostgreSQL (the same index on SQLite), and ``MULTI_DAY_INDEX``."""
    import sqlalchemy as sa

    for table in (metadata.tables["pods"], metadata.tables["events"]):
        for index in sorted(
            (i for i in table.indexes if i.name in COVERING_WITH_ID), key=lambda i: str(i.name)
        ):
            table.indexes.discard(index)
            where = {
                f"{engine}_where": index.dialect_options[engine]["where"]
                for engine in ("sqlite", "postgresql")
            }
            sa.Index(index.name, *index.expressions, unique=index.unique, postgresql_include=["id"], **where)
    pods = metadata.tables["pods"]
    sa.Index(MULTI_DAY_INDEX, pods.c.ready_at, postgresql_include=["id"],
             **_where(billing.multi_day_sql("", SQLITE), billing.multi_day_sql("", POSTGRESQL)))  # fmt: skip


#: Each group of tables with the revision of the history that added it, in order.
_GROUPS: Final[tuple[tuple[str, Callable[[sa.MetaData], None]], ...]] = (
    ("0001_ledger_v10", _pods_and_events),
    ("0001_ledger_v10", _runs),
    ("0001_ledger_v10", _rollups),
    ("0001_ledger_v10", _run_records),
    ("0001_ledger_v10", _ledger_meta),
    ("0002_servers", _servers),
    ("0003_teams", _teams),
    ("0004_cost_by_owner", _cost_by_owner),
    ("0005_waste_by_run", _waste_by_run),
    ("0006_run_closed_time", _closed_time_by_run),
    ("0007_cost_without_a_run", _cost_without_a_run),
    ("0008_ids_in_indexes", _ids_in_indexes),
)
