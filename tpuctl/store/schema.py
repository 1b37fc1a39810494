"""The ledger's SQLite schema and its forward migrations.

``PRAGMA user_version`` is the number of migrations applied. ``MIGRATIONS[i]`` takes a ledger from
version ``i`` to ``i + 1``. To add a table (runs accounting, price caches, ...): append one
``Migration`` with its ``CREATE TABLE``/``CREATE INDEX`` statements, never edit a released one. All
pending migrations run in one ``BEGIN IMMEDIATE`` transaction together with the ``user_version`` bump,
so a tpuctl killed half way leaves the old schema, and two tpuctl processes opening a fresh ledger at the
same moment migrate it once (the second re-reads the version under the write lock).

Design notes (what the later features need):

* ``events`` is append-only. ``pod_id`` ties an event to the pod incarnation it applied to, so per-slice
  scans (``pod describe``, billed time per slice) are an index range, not a scan of the log.
  ``events_ts`` serves time windows (``cost report --since``), ``events_run`` per-run scans, and the
  small partial ``events_price`` index finds every ``price_change`` without reading the log.
* ``pods`` is the current view, one row per incarnation of zone+name (a name may be reused after a
  delete, and the earlier life's cost must survive). It carries everything a cost report groups by
  (zone, type, capacity, run, labels) and the billing times (ready_at .. ended_at), so a report over a
  1,000,000-event ledger reads the pods table (one row per slice) plus the price changes, not the log.
  ``pods_open`` guarantees at most one open incarnation per zone+name.
* ``run_segments`` has at most one open segment per run (``run_segments_open``).
* Tables are STRICT so a wrong type is an error at write time rather than a surprise in a report.
  JSON columns (labels, detail, args) are TEXT holding compact JSON; ``json_extract`` works on them.
* Foreign keys are DEFERRABLE INITIALLY DEFERRED: the bulk path inserts events before the pod rows
  they point to and the constraint is checked at COMMIT.
"""

from __future__ import annotations

import secrets
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from tpuctl.store import billing
from tpuctl.store.records import LedgerError
from tpuctl.store.sql import SQLITE, Dialect


@dataclass(frozen=True)
class Migration:
    version: int  # the user_version after this migration
    summary: str
    statements: tuple[str, ...]
    #: Run after the statements, in the same transaction: fills what SQL alone cannot compute.
    backfill: Callable[[sqlite3.Connection], None] | None = None


POD_COLUMNS: tuple[str, ...] = (
    "id",
    "zone",
    "name",
    "incarnation",
    "state",
    "accelerator_type",
    "chips",
    "hosts",
    "capacity",
    "price_per_chip_hour",
    "labels",
    "request_id",
    "run_id",
    "queued_resource",
    "slice_index",
    "backend",
    "project",
    "requested_at",
    "created_at",
    "ready_at",
    "ended_at",
    "end_reason",
    "deleted_at",
    "updated_at",
    "last_event_id",
    "bill_mark",
    "billed_s",
    "billed_chip_s",
    "billed_usd_s",
    "billed_unpriced_chip_s",
)

EVENT_COLUMNS: tuple[str, ...] = (
    "id",
    "ts",
    "kind",
    "pod",
    "zone",
    "pod_id",
    "accelerator_type",
    "chips",
    "capacity",
    "price_per_chip_hour",
    "labels",
    "run_id",
    "request_id",
    "detail",
    "hosts",
    "queued_resource",
    "slice_index",
    "backend",
    "project",
)

ATTEMPT_COLUMNS: tuple[str, ...] = (
    "id",
    "request_id",
    "ts",
    "zone",
    "capacity",
    "outcome",
    "message",
    "duration_s",
    "pod",
    "accelerator_type",
    "event_id",
    "detail",
)

RUN_COLUMNS: tuple[str, ...] = (
    "run_id",
    "script",
    "args",
    "status",
    "pod",
    "zone",
    "accelerator_type",
    "capacity",
    "created_at",
    "ended_at",
    "exit_code",
    "restarts",
    "preemptions",
    "steps",
    "labels",
    "detail",
    "updated_at",
)

SEGMENT_COLUMNS: tuple[str, ...] = (
    "id",
    "run_id",
    "kind",
    "started_at",
    "ended_at",
    "pod",
    "zone",
    "capacity",
    "steps_completed",
    "steps_recomputed",
    "detail",
)

_V1 = Migration(
    1,
    "events, pods, attempts, runs, run_segments",
    (
        """
        CREATE TABLE pods (
            id                  INTEGER PRIMARY KEY,
            zone                TEXT    NOT NULL,
            name                TEXT    NOT NULL,
            incarnation         INTEGER NOT NULL,
            state               TEXT    NOT NULL,
            accelerator_type    TEXT,
            chips               INTEGER,
            hosts               INTEGER,
            capacity            TEXT,
            price_per_chip_hour REAL,
            labels              TEXT    NOT NULL DEFAULT '{}',
            request_id          TEXT,
            run_id              TEXT,
            queued_resource     TEXT,
            slice_index         INTEGER,
            backend             TEXT,
            project             TEXT,
            requested_at        REAL,
            created_at          REAL,
            ready_at            REAL,
            ended_at            REAL,
            end_reason          TEXT,
            deleted_at          REAL,
            updated_at          REAL    NOT NULL,
            last_event_id       INTEGER NOT NULL,
            UNIQUE (zone, name, incarnation)
        ) STRICT
        """,
        "CREATE UNIQUE INDEX pods_open ON pods (zone, name) WHERE ended_at IS NULL",
        "CREATE INDEX pods_name ON pods (name)",
        "CREATE INDEX pods_run ON pods (run_id) WHERE run_id IS NOT NULL",
        "CREATE INDEX pods_request ON pods (request_id) WHERE request_id IS NOT NULL",
        """
        CREATE TABLE events (
            id                  INTEGER PRIMARY KEY,
            ts                  REAL    NOT NULL,
            kind                TEXT    NOT NULL,
            pod                 TEXT,
            zone                TEXT,
            pod_id              INTEGER REFERENCES pods (id) DEFERRABLE INITIALLY DEFERRED,
            accelerator_type    TEXT,
            chips               INTEGER,
            capacity            TEXT,
            price_per_chip_hour REAL,
            labels              TEXT,
            run_id              TEXT,
            request_id          TEXT,
            detail              TEXT,
            hosts               INTEGER,
            queued_resource     TEXT,
            slice_index         INTEGER,
            backend             TEXT,
            project             TEXT
        ) STRICT
        """,
        "CREATE INDEX events_ts ON events (ts)",
        "CREATE INDEX events_pod ON events (pod_id, ts) WHERE pod_id IS NOT NULL",
        "CREATE INDEX events_run ON events (run_id, ts) WHERE run_id IS NOT NULL",
        "CREATE INDEX events_price ON events (ts) WHERE kind = 'price_change'",
        """
        CREATE TABLE attempts (
            id                  INTEGER PRIMARY KEY,
            request_id          TEXT    NOT NULL,
            ts                  REAL    NOT NULL,
            zone                TEXT    NOT NULL,
            capacity            TEXT,
            outcome             TEXT    NOT NULL,
            message             TEXT,
            duration_s          REAL,
            pod                 TEXT,
            accelerator_type    TEXT,
            event_id            INTEGER NOT NULL REFERENCES events (id) DEFERRABLE INITIALLY DEFERRED,
            detail              TEXT
        ) STRICT
        """,
        "CREATE INDEX attempts_request ON attempts (request_id, ts)",
        """
        CREATE TABLE runs (
            run_id              TEXT    PRIMARY KEY,
            script              TEXT    NOT NULL,
            args                TEXT    NOT NULL DEFAULT '[]',
            status              TEXT    NOT NULL,
            pod                 TEXT,
            zone                TEXT,
            accelerator_type    TEXT,
            capacity            TEXT,
            created_at          REAL    NOT NULL,
            ended_at            REAL,
            exit_code           INTEGER,
            restarts            INTEGER NOT NULL DEFAULT 0,
            preemptions         INTEGER NOT NULL DEFAULT 0,
            steps               INTEGER NOT NULL DEFAULT 0,
            labels              TEXT    NOT NULL DEFAULT '{}',
            detail              TEXT,
            updated_at          REAL    NOT NULL
        ) STRICT
        """,
        "CREATE INDEX runs_created ON runs (created_at)",
        """
        CREATE TABLE run_segments (
            id                  INTEGER PRIMARY KEY,
            run_id              TEXT    NOT NULL REFERENCES runs (run_id) DEFERRABLE INITIALLY DEFERRED,
            kind                TEXT    NOT NULL,
            started_at          REAL    NOT NULL,
            ended_at            REAL,
            pod                 TEXT,
            zone                TEXT,
            capacity            TEXT,
            steps_completed     INTEGER,
            steps_recomputed    INTEGER,
            detail              TEXT
        ) STRICT
        """,
        "CREATE INDEX run_segments_run ON run_segments (run_id, started_at)",
        "CREATE UNIQUE INDEX run_segments_open ON run_segments (run_id) WHERE ended_at IS NULL",
    ),
)


def _backfill_billing(conn: sqlite3.Connection) -> None:
    """Compute the v2 billing facts of every existing pod by replaying the log through ``apply_event``
    (the function every write path uses), so ``check_view`` holds on a migrated ledger."""
    from tpuctl.store.view import Ev, replay_pods  # view imports nothing from here; late to keep it so

    events = (
        (r[0], Ev(r[1], r[2], r[3], r[4], *r[6:]))
        for r in conn.execute(f"SELECT {', '.join(EVENT_COLUMNS)} FROM events ORDER BY id")
    )
    rows = [
        (row.bill_mark, row.billed_s, row.billed_chip_s, row.billed_usd_s, row.billed_unpriced_chip_s, pod_id)
        for pod_id, row in replay_pods(events).items()
    ]
    conn.executemany(
        "UPDATE pods SET bill_mark = ?, billed_s = ?, billed_chip_s = ?, billed_usd_s = ?, "
        "billed_unpriced_chip_s = ? WHERE id = ?",
        rows,
    )


#: Per-slice billing facts, kept by the view function as events arrive: a report sums them instead of
#: re-deriving every slice's billed interval (and its price pieces from the log) on every run.
#: ``bill_mark`` is where the open price piece of a billed, still-open slice began (NULL otherwise);
#: ``billed_*`` hold the closed pieces (final once ``ended_at`` is set; 0 for a free preemption):
#: seconds, chip-seconds, chips x seconds x USD per chip-hour (USD x 3600, exact like the old sums) and
#: chip-seconds with no recorded price (priced from the catalog at report time).
_V2 = Migration(
    2,
    "pods billing facts (billed seconds, chip-seconds, USD at the prices in force) and report indexes",
    (
        "ALTER TABLE pods ADD COLUMN bill_mark REAL",
        "ALTER TABLE pods ADD COLUMN billed_s REAL NOT NULL DEFAULT 0",
        "ALTER TABLE pods ADD COLUMN billed_chip_s REAL NOT NULL DEFAULT 0",
        "ALTER TABLE pods ADD COLUMN billed_usd_s REAL NOT NULL DEFAULT 0",
        "ALTER TABLE pods ADD COLUMN billed_unpriced_chip_s REAL NOT NULL DEFAULT 0",
    ),
    _backfill_billing,
)

#: Indexes for cost reports. ``pods_closed`` covers everything a report groups and sums for a slice whose
#: billing is over (so the common report reads this narrow index in group order, never the wide rows);
#: ``pods_preempted`` covers the quota-held and preemption figures; ``pods_ended`` finds
#: the few slices still open or cut by a --since/--until window, which need interval arithmetic.
_V3 = Migration(
    3,
    "cost report indexes over the billing facts",
    (
        """CREATE INDEX pods_closed ON pods (
            zone, accelerator_type, capacity, ready_at, ended_at, end_reason, chips, price_per_chip_hour,
            billed_s, billed_chip_s, billed_usd_s, billed_unpriced_chip_s, labels
        ) WHERE ended_at IS NOT NULL AND ready_at IS NOT NULL""",
        """CREATE INDEX pods_preempted ON pods (
            zone, accelerator_type, capacity, ended_at, deleted_at, ready_at, end_reason, chips,
            price_per_chip_hour, labels, run_id
        ) WHERE end_reason = 'preempted'""",
        "CREATE INDEX pods_ended ON pods (ended_at, ready_at) WHERE ended_at IS NOT NULL",
    ),
)

# --- The rollups' SQL, for either engine -------------------------------------------------------------
#
# Every function below gives SQLite's text by default: the very text (byte for byte) the released
# migrations put in ledgers' triggers, so that a new ledger (``tpuctl.store.derived``) holds the same
# statements as an old one. With ``dialect=POSTGRESQL`` it gives PostgreSQL's, with the same values (the
# engines' differences are in ``tpuctl.store.billing``'s fragments, and here: two-argument MAX/MIN,
# TOTAL, an upsert's conflict target). ``r`` is the alias of a pods row ("p", "NEW", "pods").

#: Each rollup's key columns (its primary key: what an upsert conflicts on).
_GROUP_COLUMNS = ("zone", "accelerator_type", "capacity", "labels")
ROLLUP_KEYS: dict[str, tuple[str, ...]] = {
    "cost_rollup": ("day", *_GROUP_COLUMNS),
    "cost_rollup_x": ("first_day", "end_day", *_GROUP_COLUMNS),
    "cost_rollup_xdays": ("day", "first_day", "end_day", *_GROUP_COLUMNS),
    "cost_rollup_held": ("end_day", "deleted_day", *_GROUP_COLUMNS),
}


def _max_min(dialect: Dialect) -> tuple[str, str]:
    """The larger and smaller of several values. SQLite's scalar MAX/MIN are NULL if any argument is,
    PostgreSQL's GREATEST/LEAST skip NULLs: every use below passes values that are never NULL there."""
    return ("MAX", "MIN") if dialect.name == "sqlite" else ("GREATEST", "LEAST")


def _upsert_sums(table: str, columns: tuple[str, ...], dialect: Dialect) -> str:
    """Add a new row's ``columns`` to the existing row of its key. PostgreSQL requires the conflict
    target for DO UPDATE (SQLite's is the one key there is); the existing row is named by the table."""
    if dialect.name == "sqlite":
        return "ON CONFLICT DO UPDATE SET " + ", ".join(f"{c} = {c} + excluded.{c}" for c in columns)
    return f"ON CONFLICT ({', '.join(ROLLUP_KEYS[table])}) DO UPDATE SET " + ", ".join(
        f"{c} = {table}.{c} + excluded.{c}" for c in columns
    )


def _groups_sql(r: str, dialect: Dialect) -> str:
    """Zone, type, capacity, labels of a rollup's key (a NULL as ``billing.null_key_sql``)."""
    null = billing.null_key_sql(dialect)
    return f"{r}.zone, COALESCE({r}.accelerator_type, {null}), COALESCE({r}.capacity, {null}), {r}.labels"


def rolled_sql(r: str, dialect: Dialect = SQLITE) -> str:
    """A closed, billed slice whose billing stayed within one UTC day (most slices; not a free
    preemption): what ``cost_rollup`` sums."""
    return f"""{r}.ended_at IS NOT NULL AND {r}.ready_at IS NOT NULL AND {r}.chips IS NOT NULL
    AND {r}.ended_at >= {r}.ready_at
    AND {r}.ended_at <= {billing.midnight_after_sql(f"{r}.ready_at", dialect)}
    AND NOT {billing.free_preemption_sql(r, dialect)}"""


def rollup_key_sql(r: str, dialect: Dialect = SQLITE) -> str:
    """``cost_rollup``'s key of a slice: its first day, zone, type, capacity, labels."""
    return f"{billing.first_day_sql(r, dialect)}, {_groups_sql(r, dialect)}"


#: What ``cost_rollup`` (and each rollup of the same slices under another key) sums of its slices.
ROLLUP_SUMS: Final = ("slices", "billed_s", "billed_chip_s", "billed_usd_s", "billed_unpriced_chip_s")


def rollup_add_sql(dialect: Dialect = SQLITE) -> str:
    """A trigger's statement adding the slice NEW to ``cost_rollup``."""
    key = rollup_key_sql("NEW", dialect)
    insert = f"""INSERT INTO cost_rollup VALUES ({key}, 1, NEW.billed_s, NEW.billed_chip_s, NEW.billed_usd_s,
        NEW.billed_unpriced_chip_s)"""
    if dialect.name == "sqlite":
        return (
            insert
            + """
    ON CONFLICT DO UPDATE SET slices = slices + 1, billed_s = billed_s + excluded.billed_s,
        billed_chip_s = billed_chip_s + excluded.billed_chip_s,
        billed_usd_s = billed_usd_s + excluded.billed_usd_s,
        billed_unpriced_chip_s = billed_unpriced_chip_s + excluded.billed_unpriced_chip_s;"""
        )
    return f"{insert}\n    {_upsert_sums('cost_rollup', ROLLUP_SUMS, dialect)};"


#: The common report reads a few thousand rows, not one per slice: ``cost_rollup`` sums the billing
#: facts of every slice whose billing closed within one UTC day, per (day, zone, type, capacity, labels).
#: Triggers on ``pods`` add a slice the moment its billing closes, in the transaction of the event that
#: closed it (single, bulk and migrated writes alike; a closed slice's facts never change again), so it
#: always equals ``ROLLUP_CHECK_SQL`` over ``pods`` (tests check it; ``pods`` itself is what
#: ``check_view`` verifies by replay). Slices crossing midnight (a few percent) are read per slice
#: through the partial index ``pods_crossing``; ``pods_closed`` is rebuilt to lead with ready_at for the
#: window's boundary days.
_V4 = Migration(
    4,
    "cost_rollup: billing facts per day, zone, type, capacity and labels, kept by triggers",
    (
        """CREATE TABLE cost_rollup (
            day                    INTEGER NOT NULL,
            zone                   TEXT    NOT NULL,
            accelerator_type       TEXT    NOT NULL,
            capacity               TEXT    NOT NULL,
            labels                 TEXT    NOT NULL,
            slices                 INTEGER NOT NULL,
            billed_s               REAL    NOT NULL,
            billed_chip_s          REAL    NOT NULL,
            billed_usd_s           REAL    NOT NULL,
            billed_unpriced_chip_s REAL    NOT NULL,
            PRIMARY KEY (day, zone, accelerator_type, capacity, labels)
        ) STRICT, WITHOUT ROWID""",
        f"""CREATE TRIGGER pods_rollup_insert AFTER INSERT ON pods WHEN {rolled_sql("NEW")}
        BEGIN {rollup_add_sql()} END""",
        f"""CREATE TRIGGER pods_rollup_close AFTER UPDATE ON pods
        WHEN OLD.ended_at IS NULL AND {rolled_sql("NEW")}
        BEGIN {rollup_add_sql()} END""",
        f"""INSERT INTO cost_rollup
        SELECT {rollup_key_sql("p")}, COUNT(*), SUM(billed_s), SUM(billed_chip_s), SUM(billed_usd_s),
               SUM(billed_unpriced_chip_s)
        FROM pods AS p WHERE {rolled_sql("p")} GROUP BY 1, 2, 3, 4, 5""",
        "DROP INDEX pods_closed",
        """CREATE INDEX pods_closed ON pods (
            ready_at, ended_at, zone, accelerator_type, capacity, end_reason, chips, price_per_chip_hour,
            billed_s, billed_chip_s, billed_usd_s, billed_unpriced_chip_s, labels
        ) WHERE ended_at IS NOT NULL AND ready_at IS NOT NULL""",
        """CREATE INDEX pods_crossing ON pods (
            ready_at, ended_at, zone, accelerator_type, capacity, end_reason, chips, price_per_chip_hour,
            billed_s, billed_chip_s, billed_usd_s, billed_unpriced_chip_s, labels
        ) WHERE ended_at IS NOT NULL AND ready_at IS NOT NULL
            AND """
        + billing.crosses_midnight_sql(""),
    ),
)


def rollup_check_sql(dialect: Dialect = SQLITE) -> str:
    """What ``cost_rollup`` must hold, recomputed from ``pods`` (rows in key order; for checks and
    tests)."""
    return f"""SELECT {rollup_key_sql("p", dialect)}, COUNT(*), SUM(billed_s), SUM(billed_chip_s),
    SUM(billed_usd_s), SUM(billed_unpriced_chip_s)
FROM pods AS p WHERE {rolled_sql("p", dialect)} GROUP BY 1, 2, 3, 4, 5 ORDER BY 1, 2, 3, 4, 5"""


ROLLUP_CHECK_SQL = rollup_check_sql()

#: What a cost report reads of a slice to bill it in a window (``tpuctl.services.cost.items``: its billed
#: time, price, quota held), after the index's own key columns.
_BILLING_COLUMNS = (
    "ready_at, ended_at, end_reason, deleted_at, chips, capacity, accelerator_type, price_per_chip_hour"
)

#: Indexes for the per-run and per-slice report groups (and the totals' recomputed work). Without them
#: every report scanned all of ``run_segments`` twice (the segments that recomputed steps, and the
#: segments on slices no run created) and all of ``pods`` for the slices no run created, and ranking the
#: runs looked up every slice's row from ``pods_run``; with them those are index-only ranges over the rows
#: that matter. ``pods_run`` (was run_id alone) and ``pods_norun`` (slices no run created, "(none)" of
#: --group-by run) cover what billing a slice reads. ``run_segments_pod``: the segments that ran on a
#: slice. ``run_segments_recomputed``: covers the segments that redid steps (a small share, often none).
_V5 = Migration(
    5,
    "report indexes: runs' slices (covering), slices no run created, segments by slice, recomputing segments",
    (
        "DROP INDEX pods_run",
        f"CREATE INDEX pods_run ON pods (run_id, {_BILLING_COLUMNS}, zone) WHERE run_id IS NOT NULL",
        # run_id (always NULL here) too: SQLite evaluates "run_id IS NULL" from the index, not the row.
        f"CREATE INDEX pods_norun ON pods (zone, name, {_BILLING_COLUMNS}, run_id) WHERE run_id IS NULL",
        "CREATE INDEX run_segments_pod ON run_segments (zone, pod) WHERE pod IS NOT NULL",
        """CREATE INDEX run_segments_recomputed ON run_segments (
            zone, pod, run_id, started_at, ended_at, steps_completed, steps_recomputed
        ) WHERE steps_recomputed > 0""",
    ),
)

#: The costliest slices without reading every slice: ``pods_cost`` orders the closed ones by the USD
#: their stored facts hold (with what decides whether one is billed inside a window), so a report that
#: shows the N costliest walks it from the top; ``pods_unpriced`` finds the (usually no) slices with time
#: at no recorded price, whose cost the catalog decides and the order above does not know.
_V6 = Migration(
    6,
    "cost ranking indexes: closed slices by billed USD, slices with unpriced time",
    (
        """CREATE INDEX pods_cost ON pods (billed_usd_s, ready_at, ended_at, chips, capacity, end_reason)
        WHERE ended_at IS NOT NULL AND ready_at IS NOT NULL""",
        "CREATE INDEX pods_unpriced ON pods (billed_unpriced_chip_s) WHERE billed_unpriced_chip_s > 0",
    ),
)


#: A closed slice's recomputed work, as ``tpuctl.services.cost.sql_intervals.SRC_RECOMPUTED`` computes it
#: for a slice billed wholly inside a report's window: for every segment on it (zone + name) that redid
#: steps, the recomputed share of the time the segment and the slice's billing overlap, at the slice's
#: recorded price (priced: chips x seconds x share x USD per chip-hour, i.e. USD x 3600) or, with none
#: recorded, as chip-seconds the catalog prices at report time (unpriced). 0 for a slice not billed (never
#: READY, a free preemption). An open segment on a closed slice counts up to the slice's end, as it does in
#: the report.
def _rec_sum(value: str, dialect: Dialect) -> str:
    """The sum of ``value`` over the recomputing segments on the closed slice ``pods`` (0.0 for none:
    SQLite's TOTAL, PostgreSQL's COALESCE of SUM)."""
    total = f"TOTAL({value})" if dialect.name == "sqlite" else f"COALESCE(SUM({value}), 0.0)"
    return f"""(SELECT {total} FROM run_segments AS rs
        WHERE rs.zone = pods.zone AND rs.pod = pods.name AND rs.steps_recomputed > 0
          AND pods.ready_at IS NOT NULL AND pods.chips IS NOT NULL
          AND NOT {billing.free_preemption_sql("pods", dialect)})"""


def _rec_part(dialect: Dialect) -> str:
    """One segment's recomputed chip-seconds on the slice. No MAX/MIN argument is NULL: the slice is
    closed (``ended_at``), READY (the WHERE of ``_rec_sum``), and a segment always has ``started_at``."""
    greatest, least = _max_min(dialect)
    return f"""pods.chips * {greatest}(0.0, {least}(pods.ended_at, COALESCE(rs.ended_at, pods.ended_at))
                    - {greatest}(pods.ready_at, rs.started_at))
        * {billing.recompute_fraction_sql("rs", dialect)}"""


def rec_priced_sql(dialect: Dialect = SQLITE) -> str:
    return _rec_sum(f"{_rec_part(dialect)} * pods.price_per_chip_hour", dialect)


def rec_unpriced_sql(dialect: Dialect = SQLITE) -> str:
    return _rec_sum(
        f"CASE WHEN pods.price_per_chip_hour IS NULL THEN {_rec_part(dialect)} ELSE 0 END", dialect
    )


def _rec_set(dialect: Dialect) -> str:
    return f"rec_priced = {rec_priced_sql(dialect)}, rec_unpriced = {rec_unpriced_sql(dialect)}"


#: The columns of ``pods`` a closed slice's recomputed work depends on (an update of one re-derives it).
REC_WATCHED_COLUMNS = ("ended_at", "ready_at", "chips", "price_per_chip_hour", "end_reason", "capacity")


def rec_update_sql(zone: str, name: str, dialect: Dialect = SQLITE) -> str:
    """Re-derive the facts of the closed incarnations of one zone + name (SQL expressions)."""
    return (
        f"UPDATE pods SET {_rec_set(dialect)} WHERE zone = {zone} AND name = {name} AND ended_at IS NOT NULL;"
    )


#: Recomputed work stored per closed slice, kept by triggers (a segment recorded or updated, a slice
#: closed or its billing facts changed), so that a report sums one stored figure per slice that redid
#: work instead of joining every recomputing segment to its slice and cutting their intervals: that join
#: was a third of a report's time on a 1,000,000-event ledger. ``pods_rec`` covers what a report groups
#: these figures by. Price-changed slices, slices still open or cut by the window are still computed from
#: their segments at report time (``sql_intervals.recomputed_sql``); ``REC_CHECK_SQL`` re-derives every stored
#: figure for checks and tests.
_V7 = Migration(
    7,
    "recomputed work per closed slice (rec_priced, rec_unpriced), kept by triggers, and its index",
    (
        "ALTER TABLE pods ADD COLUMN rec_priced REAL NOT NULL DEFAULT 0",
        "ALTER TABLE pods ADD COLUMN rec_unpriced REAL NOT NULL DEFAULT 0",
        f"""CREATE TRIGGER pods_rec_insert AFTER INSERT ON pods WHEN NEW.ended_at IS NOT NULL
        BEGIN {rec_update_sql("NEW.zone", "NEW.name")} END""",
        f"""CREATE TRIGGER pods_rec_update
        AFTER UPDATE OF {", ".join(REC_WATCHED_COLUMNS)} ON pods
        WHEN NEW.ended_at IS NOT NULL
        BEGIN {rec_update_sql("NEW.zone", "NEW.name")} END""",
        f"""CREATE TRIGGER run_segments_rec_insert AFTER INSERT ON run_segments WHEN NEW.pod IS NOT NULL
        BEGIN {rec_update_sql("NEW.zone", "NEW.pod")} END""",
        f"""CREATE TRIGGER run_segments_rec_update AFTER UPDATE ON run_segments
        BEGIN {rec_update_sql("NEW.zone", "NEW.pod")}
              {rec_update_sql("OLD.zone", "OLD.pod")} END""",
        f"""CREATE TRIGGER run_segments_rec_delete AFTER DELETE ON run_segments WHEN OLD.pod IS NOT NULL
        BEGIN {rec_update_sql("OLD.zone", "OLD.pod")} END""",
        f"UPDATE pods SET {_rec_set(SQLITE)} WHERE ended_at IS NOT NULL",
        """CREATE INDEX pods_rec ON pods (
            zone, accelerator_type, capacity, ready_at, ended_at, run_id, labels, rec_priced, rec_unpriced
        ) WHERE rec_priced != 0 OR rec_unpriced != 0""",
    ),
)


def rec_check_sql(dialect: Dialect = SQLITE) -> str:
    """Every closed slice's stored recomputed figures next to what the triggers should have made of them
    (id, stored priced, stored unpriced, derived priced, derived unpriced); for checks and tests."""
    return (
        f"SELECT id, rec_priced, rec_unpriced, {rec_priced_sql(dialect)}, {rec_unpriced_sql(dialect)} "
        "FROM pods WHERE ended_at IS NOT NULL ORDER BY id"
    )


REC_CHECK_SQL = rec_check_sql()

#: The event kinds that end a slice's billing (as ``tpuctl.store.view`` applies them), as SQL.
END_KINDS_SQL = billing.END_KINDS_SQL
#: The longest billed life (in UTC days) whose per-day pieces ``cost_rollup_xdays`` holds; a longer one
#: is billed slice by slice at report time.
ROLLUP_MAX_DAYS = 3660
#: For the report's queries (``{r}``: the pods alias): a slice's first billed day and the day after its
#: last, as the rollups key them (SQLite's; ``billing.first_day_sql`` and ``end_day_sql`` for either).
FIRST_DAY_SQL = billing.first_day_sql("{r}")
#: The day after the last one the slice was billed in (its end rounded up to midnight).
END_DAY_SQL = billing.end_day_sql("{r}")


def crossing_billed_sql(r: str, dialect: Dialect = SQLITE) -> str:
    """A closed, billed slice crossing midnight, not longer than ROLLUP_MAX_DAYS: what may be rolled up
    (no subquery: PostgreSQL's trigger WHEN takes none)."""
    first, end = billing.first_day_sql(r, dialect), billing.end_day_sql(r, dialect)
    return f"""{r}.ended_at IS NOT NULL AND {r}.ready_at IS NOT NULL AND {r}.chips IS NOT NULL
    AND {billing.crosses_midnight_sql(r, dialect)}
    AND {end} - {first} <= {ROLLUP_MAX_DAYS}
    AND NOT {billing.free_preemption_sql(r, dialect)}"""


def price_never_changed_sql(r: str) -> str:
    """No price change recorded for the slice (the same text on both engines)."""
    return f"NOT EXISTS (SELECT 1 FROM events AS e WHERE e.pod_id = {r}.id AND e.kind = 'price_change')"


def rolled_x_sql(r: str, dialect: Dialect = SQLITE) -> str:
    """A crossing slice that is rolled up: no price change at all (a price-changed slice crossing
    midnight needs its pieces, at report time; one stamped at or after the end still sets the slice's
    last price, which its days would then be cut at)."""
    return f"""{crossing_billed_sql(r, dialect)}
    AND {price_never_changed_sql(r)}"""


def x_key_sql(r: str, dialect: Dialect = SQLITE) -> str:
    """``cost_rollup_x``'s key of a slice: first day, end day, zone, type, capacity, labels."""
    first, end = billing.first_day_sql(r, dialect), billing.end_day_sql(r, dialect)
    return f"{first}, {end}, {_groups_sql(r, dialect)}"


def _x_values(r: str, dialect: Dialect) -> list[str]:
    """A rolled slice's row of cost_rollup_x after the key: 1 slice, its billing facts, its first day's
    share (it is billed at one price)."""
    d0 = f"({billing.midnight_after_sql(f'{r}.ready_at', dialect)} - {r}.ready_at)"
    return [
        "1", f"{r}.billed_s", f"{r}.billed_chip_s", f"{r}.billed_usd_s", f"{r}.billed_unpriced_chip_s",
        d0, f"{r}.chips * {d0}", f"COALESCE({r}.chips * {d0} * {r}.price_per_chip_hour, 0)",
        f"CASE WHEN {r}.price_per_chip_hour IS NULL THEN {r}.chips * {d0} ELSE 0 END",
    ]  # fmt: skip


def _xdays_values(r: str, dialect: Dialect) -> list[str]:
    """Day first_day + o.n (n >= 1) of a rolled slice: the day, its key, 1 piece, the piece's figures
    (``ended_at`` is never NULL in MIN: the slice is closed)."""
    fd = billing.first_day_sql(r, dialect)
    day_start = billing.midnight_sql(f"{fd} + o.n", dialect)
    day_end = billing.midnight_sql(f"{fd} + o.n + 1", dialect)
    piece = f"({_max_min(dialect)[1]}({r}.ended_at, {day_end}) - {day_start})"
    return [
        "1", piece, f"{r}.chips * {piece}", f"COALESCE({r}.chips * {piece} * {r}.price_per_chip_hour, 0)",
        f"CASE WHEN {r}.price_per_chip_hour IS NULL THEN {r}.chips * {piece} ELSE 0 END",
    ]  # fmt: skip


def _xdays_from(r: str, dialect: Dialect) -> str:
    first, end = billing.first_day_sql(r, dialect), billing.end_day_sql(r, dialect)
    return f"cost_day_offsets AS o WHERE o.n >= 1 AND o.n < {end} - {first}"


def _xday_sql(r: str, dialect: Dialect) -> str:
    return f"{billing.first_day_sql(r, dialect)} + o.n"


_X_SUMS = ("slices", "billed_s", "billed_chip_s", "billed_usd_s", "billed_unpriced_chip_s", "d0_s",
           "d0_chip_s", "d0_usd_s", "d0_unpriced_chip_s")  # fmt: skip
_XDAYS_SUMS = ("slices", "s", "chip_s", "usd_s", "unpriced_chip_s")


def roll_x_sql(dialect: Dialect = SQLITE) -> str:
    """A trigger's statements adding the crossing slice NEW to ``cost_rollup_x`` and its later days to
    ``cost_rollup_xdays``, and marking it rolled."""
    x_upsert = _upsert_sums("cost_rollup_x", _X_SUMS, dialect)
    xdays_upsert = _upsert_sums("cost_rollup_xdays", _XDAYS_SUMS, dialect)
    key = x_key_sql("NEW", dialect)
    values, day_values = ", ".join(_x_values("NEW", dialect)), ", ".join(_xdays_values("NEW", dialect))
    return f"""INSERT INTO cost_rollup_x VALUES ({key}, {values})
        {x_upsert};
    INSERT INTO cost_rollup_xdays
        SELECT {_xday_sql("NEW", dialect)}, {key}, {day_values}
        FROM {_xdays_from("NEW", dialect)}
        {xdays_upsert};
    UPDATE pods SET rolled = 1 WHERE id = NEW.id;"""


def held_final_sql(r: str) -> str:
    """A preempted slice deleted after its preemption: the quota it held, final (the same text on both
    engines)."""
    return f"""{r}.end_reason = 'preempted' AND {r}.chips IS NOT NULL AND {r}.deleted_at IS NOT NULL
    AND {r}.ended_at IS NOT NULL AND {r}.deleted_at > {r}.ended_at"""


def held_key_sql(r: str, dialect: Dialect = SQLITE) -> str:
    """Preemption day, the day after the deletion's (rounded up to midnight), zone, type, capacity,
    labels."""
    ended = billing.day_sql(f"{r}.ended_at", dialect)
    deleted = billing.ceil_day_sql(f"{r}.deleted_at", dialect)
    return f"{ended}, {deleted}, {_groups_sql(r, dialect)}"


def _held_values(r: str, dialect: Dialect) -> list[str]:
    """A held slice's row of cost_rollup_held after the key: 1 if it was not billed at all (never READY,
    or a free preemption: it counts as a slice of its group for the quota it held), chip-seconds held,
    at its price (USD x 3600), and unpriced."""
    held = f"({r}.deleted_at - {r}.ended_at)"
    billed = f"({r}.ready_at IS NOT NULL AND NOT {billing.free_preemption_sql(r, dialect)})"
    return [
        f"CASE WHEN {billed} THEN 0 ELSE 1 END", f"{r}.chips * {held}",
        f"COALESCE({r}.chips * {held} * {r}.price_per_chip_hour, 0)",
        f"CASE WHEN {r}.price_per_chip_hour IS NULL THEN {r}.chips * {held} ELSE 0 END",
    ]  # fmt: skip


_HELD_SUMS = ("slices", "held_chip_s", "held_usd_s", "held_unpriced_chip_s")


def roll_held_sql(dialect: Dialect = SQLITE) -> str:
    """A trigger's statement adding the quota the slice NEW held to ``cost_rollup_held``."""
    return f"""INSERT INTO cost_rollup_held
        VALUES ({held_key_sql("NEW", dialect)}, {", ".join(_held_values("NEW", dialect))})
        {_upsert_sums("cost_rollup_held", _HELD_SUMS, dialect)};"""


def _sums(values: list[str]) -> str:
    return ", ".join(f"SUM({v})" for v in values)


def rollup_x_check_sql(dialect: Dialect = SQLITE) -> str:
    """What ``cost_rollup_x`` must hold, recomputed from ``pods`` (rows in key order)."""
    return f"""SELECT {x_key_sql("p", dialect)}, {_sums(_x_values("p", dialect))}
FROM pods AS p WHERE p.rolled = 1 GROUP BY 1, 2, 3, 4, 5, 6 ORDER BY 1, 2, 3, 4, 5, 6"""


def rollup_xdays_check_sql(dialect: Dialect = SQLITE) -> str:
    """What ``cost_rollup_xdays`` must hold, recomputed from ``pods`` (rows in key order)."""
    sums = _sums(_xdays_values("p", dialect))
    return f"""SELECT {_xday_sql("p", dialect)}, {x_key_sql("p", dialect)}, {sums}
FROM pods AS p CROSS JOIN {_xdays_from("p", dialect)} AND p.rolled = 1
GROUP BY 1, 2, 3, 4, 5, 6, 7 ORDER BY 1, 2, 3, 4, 5, 6, 7"""


def rollup_held_check_sql(dialect: Dialect = SQLITE) -> str:
    """What ``cost_rollup_held`` must hold, recomputed from ``pods`` (rows in key order)."""
    return f"""SELECT {held_key_sql("p", dialect)}, {_sums(_held_values("p", dialect))}
FROM pods AS p WHERE {held_final_sql("p")} GROUP BY 1, 2, 3, 4, 5, 6 ORDER BY 1, 2, 3, 4, 5, 6"""


def rollup_checks(dialect: Dialect = SQLITE) -> tuple[tuple[str, int, str], ...]:
    """(table, number of key columns, the SQL that recomputes it) of every rollup the triggers keep."""
    return (
        ("cost_rollup", len(ROLLUP_KEYS["cost_rollup"]), rollup_check_sql(dialect)),
        ("cost_rollup_x", len(ROLLUP_KEYS["cost_rollup_x"]), rollup_x_check_sql(dialect)),
        ("cost_rollup_xdays", len(ROLLUP_KEYS["cost_rollup_xdays"]), rollup_xdays_check_sql(dialect)),
        ("cost_rollup_held", len(ROLLUP_KEYS["cost_rollup_held"]), rollup_held_check_sql(dialect)),
    )


def rolled_check_sql(dialect: Dialect = SQLITE) -> str:
    """Rolled slices that should not be (an open, unbilled, or too long slice), for checks and tests.
    A rolled slice may have a price change recorded after it closed (the view ignored it too), but none
    recorded before its first end event."""
    return f"""SELECT id FROM pods AS p WHERE p.rolled = 1 AND (NOT ({crossing_billed_sql("p", dialect)})
    OR EXISTS (SELECT 1 FROM events AS e WHERE e.pod_id = p.id AND e.kind = 'price_change'
               AND e.id < (SELECT MIN(x.id) FROM events AS x WHERE x.pod_id = p.id
                           AND x.kind IN {END_KINDS_SQL})))"""


#: SQLite's checks (what ``Ledger.check_view`` runs on a SQLite ledger).
ROLLUP_X_CHECK_SQL = rollup_x_check_sql()
ROLLUP_XDAYS_CHECK_SQL = rollup_xdays_check_sql()
ROLLUP_HELD_CHECK_SQL = rollup_held_check_sql()
ROLLUP_CHECKS: tuple[tuple[str, int, str], ...] = rollup_checks()
ROLLED_CHECK_SQL = rolled_check_sql()

#: Slices crossing midnight (a few percent) and the quota preempted slices held until deleted were summed
#: slice by slice on every report: two thirds of a default report's time on a 1,000,000-event ledger
#: after v7. Triggers now add them to rollups as they close, in the transaction of the event, as
#: ``cost_rollup`` does for the rest: ``cost_rollup_x`` (per first day, end day, zone, type, capacity,
#: labels: their billing facts and first-day share), ``cost_rollup_xdays`` (their pieces of each later
#: day; ``cost_day_offsets`` numbers the days, as a trigger cannot recurse), ``cost_rollup_held`` (per
#: preemption day and deletion day: chip-seconds held, at the slice's price, and the slices not billed at
#: all). A report reads the rows whose slices lie in the window's whole days and bills the rest (window
#: edges, price-changed or very long slices, quota still held) slice by slice. ``pods.rolled`` marks the
#: slices in the first two (a price change recorded after the close must not bill one twice).
_V8 = Migration(
    8,
    "rollups of slices crossing midnight (totals, later days) and of quota held, kept by triggers",
    (
        "CREATE TABLE cost_day_offsets (n INTEGER PRIMARY KEY) STRICT",
        f"""INSERT INTO cost_day_offsets WITH RECURSIVE o(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM o
            WHERE n < {ROLLUP_MAX_DAYS}) SELECT n FROM o""",
        "ALTER TABLE pods ADD COLUMN rolled INTEGER NOT NULL DEFAULT 0",
        """CREATE TABLE cost_rollup_x (
            first_day INTEGER NOT NULL, end_day INTEGER NOT NULL, zone TEXT NOT NULL,
            accelerator_type TEXT NOT NULL, capacity TEXT NOT NULL, labels TEXT NOT NULL,
            slices INTEGER NOT NULL, billed_s REAL NOT NULL, billed_chip_s REAL NOT NULL,
            billed_usd_s REAL NOT NULL, billed_unpriced_chip_s REAL NOT NULL, d0_s REAL NOT NULL,
            d0_chip_s REAL NOT NULL, d0_usd_s REAL NOT NULL, d0_unpriced_chip_s REAL NOT NULL,
            PRIMARY KEY (first_day, end_day, zone, accelerator_type, capacity, labels)
        ) STRICT, WITHOUT ROWID""",
        """CREATE TABLE cost_rollup_xdays (
            day INTEGER NOT NULL, first_day INTEGER NOT NULL, end_day INTEGER NOT NULL, zone TEXT NOT NULL,
            accelerator_type TEXT NOT NULL, capacity TEXT NOT NULL, labels TEXT NOT NULL,
            slices INTEGER NOT NULL, s REAL NOT NULL, chip_s REAL NOT NULL, usd_s REAL NOT NULL,
            unpriced_chip_s REAL NOT NULL,
            PRIMARY KEY (day, first_day, end_day, zone, accelerator_type, capacity, labels)
        ) STRICT, WITHOUT ROWID""",
        """CREATE TABLE cost_rollup_held (
            end_day INTEGER NOT NULL, deleted_day INTEGER NOT NULL, zone TEXT NOT NULL,
            accelerator_type TEXT NOT NULL, capacity TEXT NOT NULL, labels TEXT NOT NULL,
            slices INTEGER NOT NULL, held_chip_s REAL NOT NULL, held_usd_s REAL NOT NULL,
            held_unpriced_chip_s REAL NOT NULL,
            PRIMARY KEY (end_day, deleted_day, zone, accelerator_type, capacity, labels)
        ) STRICT, WITHOUT ROWID""",
        f"""CREATE TRIGGER pods_rollup_x_insert AFTER INSERT ON pods WHEN {rolled_x_sql("NEW")}
        BEGIN {roll_x_sql()} END""",
        f"""CREATE TRIGGER pods_rollup_x_close AFTER UPDATE ON pods
        WHEN OLD.ended_at IS NULL AND {rolled_x_sql("NEW")}
        BEGIN {roll_x_sql()} END""",
        f"""CREATE TRIGGER pods_rollup_held_insert AFTER INSERT ON pods WHEN {held_final_sql("NEW")}
        BEGIN {roll_held_sql()} END""",
        f"""CREATE TRIGGER pods_rollup_held_delete AFTER UPDATE ON pods
        WHEN OLD.deleted_at IS NULL AND {held_final_sql("NEW")}
        BEGIN {roll_held_sql()} END""",
        f"UPDATE pods SET rolled = 1 WHERE {rolled_x_sql('pods')}",
        f"INSERT INTO cost_rollup_x {ROLLUP_X_CHECK_SQL}",
        f"INSERT INTO cost_rollup_xdays {ROLLUP_XDAYS_CHECK_SQL}",
        f"INSERT INTO cost_rollup_held {ROLLUP_HELD_CHECK_SQL}",
        "CREATE INDEX pods_held ON pods (deleted_at, ended_at) WHERE end_reason = 'preempted'",
        # The preemptions in a window, counted from a narrow range (pods_preempted is wide and whole).
        "CREATE INDEX pods_preemptions ON pods (ended_at, ready_at, capacity) WHERE end_reason = 'preempted'",
        # Every report reads all price changes: from this index alone, not a row of the log each; and
        # whether each was recorded before its slice ended, from the narrow index of the end events.
        "CREATE INDEX events_price_facts ON events (pod_id, ts, price_per_chip_hour, kind) "
        "WHERE kind = 'price_change'",
        f"CREATE INDEX events_end ON events (pod_id) WHERE kind IN {END_KINDS_SQL}",
        """CREATE INDEX pods_unrolled_crossing ON pods (ready_at)
        WHERE ended_at IS NOT NULL AND ready_at IS NOT NULL
          AND """
        + billing.crosses_midnight_sql("")
        + " AND rolled = 0",
    ),
)


def _new_identity(conn: sqlite3.Connection) -> None:
    # Random, not $USER: two machines of one user (USER=root on both) must not take each other's
    # slices for their own. 16 hex digits fit a GCP label value.
    conn.execute("INSERT INTO ledger_meta (key, value) VALUES ('identity', ?)", (secrets.token_hex(8),))


#: The ledger's identity: a random id stamped on every slice this ledger's tpuctl creates (the
#: ``tpuctl-ledger`` label), so `pod gc` deletes a live slice only when it can prove this ledger made it.
_V9 = Migration(
    9,
    "the ledger's identity, stamped on the slices it creates",
    ("CREATE TABLE ledger_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) STRICT",),
    backfill=_new_identity,
)

#: Runs as leased records: everything a supervisor needs to take a run over on any machine, and who may
#: act on it (``tpuctl.store.leases``). ``run_leases``: one row per run ever claimed (``token`` NULL: free;
#: the generation survives a release, so it only ever grows). ``run_lease_history``: every claim, takeover,
#: renewal, loss and release (never the token). ``run_intents``: the slice creates and deletes an owner
#: recorded, fenced, before asking the cloud. ``run_state``: phase, attempt and slices. ``run_blobs``: the
#: saved request and the bundle. ``run_secrets``: secrets, Fernet-encrypted (the key is never here).
#: ``run_log_lines``: the hosts' lines, one row each, idempotent on (run, worker, seq), with the time each
#: arrived at its supervisor. ``run_cancel_requests``: a cancel asked from any machine. Every other time in
#: these tables is the ledger's clock.
_V10 = Migration(
    10,
    "runs as leased records: leases, lease history, intents, run state, blobs, secrets, log lines, cancels",
    (
        """CREATE TABLE run_leases (
            run_id      TEXT    PRIMARY KEY REFERENCES runs (run_id) DEFERRABLE INITIALLY DEFERRED,
            generation  INTEGER NOT NULL,
            token       TEXT,
            owner_id    TEXT,
            host        TEXT,
            pid         INTEGER,
            start_ticks INTEGER,
            claimed_at  REAL,
            renewed_at  REAL,
            expires_at  REAL,
            CHECK ((token IS NULL) = (expires_at IS NULL) AND (token IS NULL) = (owner_id IS NULL))
        ) STRICT""",
        """CREATE TABLE run_lease_history (
            id          INTEGER PRIMARY KEY,
            run_id      TEXT    NOT NULL REFERENCES runs (run_id) DEFERRABLE INITIALLY DEFERRED,
            at          REAL    NOT NULL,
            action      TEXT    NOT NULL,
            generation  INTEGER NOT NULL,
            owner_id    TEXT    NOT NULL,
            host        TEXT    NOT NULL,
            pid         INTEGER NOT NULL,
            start_ticks INTEGER,
            expires_at  REAL,
            detail      TEXT
        ) STRICT""",
        "CREATE INDEX run_lease_history_run ON run_lease_history (run_id, id)",
        """CREATE TABLE run_cancel_requests (
            run_id       TEXT PRIMARY KEY REFERENCES runs (run_id) DEFERRABLE INITIALLY DEFERRED,
            requested_at REAL NOT NULL,
            requested_by TEXT NOT NULL
        ) STRICT""",
        """CREATE TABLE run_intents (
            id         INTEGER PRIMARY KEY,
            run_id     TEXT    NOT NULL REFERENCES runs (run_id) DEFERRABLE INITIALLY DEFERRED,
            at         REAL    NOT NULL,
            action     TEXT    NOT NULL CHECK (action IN ('create', 'delete')),
            pod        TEXT    NOT NULL,
            zone       TEXT    NOT NULL,
            generation INTEGER NOT NULL,
            owner_id   TEXT    NOT NULL,
            detail     TEXT
        ) STRICT""",
        "CREATE INDEX run_intents_run ON run_intents (run_id, id)",
        """CREATE TABLE run_state (
            run_id     TEXT    PRIMARY KEY REFERENCES runs (run_id) DEFERRABLE INITIALLY DEFERRED,
            phase      TEXT,
            attempt    INTEGER,
            slices     TEXT    NOT NULL DEFAULT '[]',
            generation INTEGER NOT NULL,
            updated_at REAL    NOT NULL
        ) STRICT""",
        """CREATE TABLE run_blobs (
            run_id   TEXT    NOT NULL REFERENCES runs (run_id) DEFERRABLE INITIALLY DEFERRED,
            name     TEXT    NOT NULL,
            sha256   TEXT    NOT NULL,
            size     INTEGER NOT NULL,
            data     BLOB    NOT NULL,
            saved_at REAL    NOT NULL,
            PRIMARY KEY (run_id, name)
        ) STRICT""",
        """CREATE TABLE run_secrets (
            run_id     TEXT NOT NULL REFERENCES runs (run_id) DEFERRABLE INITIALLY DEFERRED,
            name       TEXT NOT NULL,
            key_id     TEXT NOT NULL,
            ciphertext BLOB NOT NULL,
            saved_at   REAL NOT NULL,
            PRIMARY KEY (run_id, name)
        ) STRICT""",
        """CREATE TABLE run_log_lines (
            run_id TEXT    NOT NULL REFERENCES runs (run_id) DEFERRABLE INITIALLY DEFERRED,
            worker INTEGER NOT NULL,
            seq    INTEGER NOT NULL,
            at     REAL    NOT NULL,
            text   TEXT    NOT NULL,
            PRIMARY KEY (run_id, worker, seq)
        ) STRICT, WITHOUT ROWID""",
    ),
)

#: The hand-written migrations end here: later changes of the schema are revisions of the Alembic history
#: (``tpuctl.store.migrations``), whose baseline is where these leave a ledger.
MIGRATIONS: tuple[Migration, ...] = (_V1, _V2, _V3, _V4, _V5, _V6, _V7, _V8, _V9, _V10)
SCHEMA_VERSION: int = len(MIGRATIONS)


def _check_migrations() -> None:
    # A misnumbered migration would silently skip or repeat one; cheap enough to check on every open.
    for index, migration in enumerate(MIGRATIONS):
        if migration.version != index + 1:
            raise AssertionError(f"migration #{index} declares version {migration.version}")


def schema_version(conn: sqlite3.Connection) -> int:
    row = conn.execute("PRAGMA user_version").fetchone()
    return int(row[0])


def migrate(conn: sqlite3.Connection, *, where: str, newest: int = SCHEMA_VERSION) -> int:
    """Bring the schema up to ``SCHEMA_VERSION``; return the version found before. Idempotent. A ledger
    already past it, up to ``newest`` (the later revisions of the Alembic history, which take it from
    here), is left as it is; one past ``newest`` is refused.

    ``conn`` must be in autocommit mode (``isolation_level=None``): the transaction is ours.
    """
    _check_migrations()
    found = schema_version(conn)
    if found >= SCHEMA_VERSION:
        _refuse_newer(found, where, newest)
        return found  # the common case: no write lock taken at all
    conn.execute("BEGIN IMMEDIATE")
    try:
        # Another process may have migrated while we waited, and even gone on through the history.
        found = schema_version(conn)
        if found >= SCHEMA_VERSION:
            _refuse_newer(found, where, newest)
            conn.execute("COMMIT")
            return found
        for migration in MIGRATIONS[found:]:
            for statement in migration.statements:
                conn.execute(statement)
            if migration.backfill is not None:
                migration.backfill(conn)
        # user_version lives in the database header, which is written as part of this transaction.
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION:d}")
        conn.execute("COMMIT")
    except BaseException:
        # Some errors (disk full, I/O) already rolled the transaction back.
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return found


def _refuse_newer(found: int, where: str, newest: int) -> None:
    if found > newest:
        refuse_newer(found, where, newest)


def refuse_newer(found: int, where: str, known: int) -> None:
    """Raise: the ledger's schema version ``found`` is past ``known``, the newest this tpuctl knows."""
    raise LedgerError(
        f"the ledger at {where} has schema version {found}, newer than this tpuctl understands ({known})",
        fix="upgrade tpuctl, or point --state-dir at another directory",
    )
