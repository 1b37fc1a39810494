"""Whether a run ever ran on a slice no run created (revision 0009): the ``ledger_meta`` row ``KEY``.

A report by run gives such a run a share of the slice's time, and takes it from "(none)"; where no run
ever did, it skips every pass that looks for shares (``services.cost.Query.shares``). Finding out that
there are none read every slice no run created and looked up its segments (39,512 slices at 1,000,000
events: 0.02 s on either engine, on every money page by run). The row says it in one look-up.

Triggers set it, on both engines, in the transaction of the write that makes a share possible: a segment
recorded on (or moved to) a slice no run created, a slice no run created recorded (or relieved of its run,
or renamed) where segments already name it. It is never unset: a share that goes away (a segment deleted,
a slice given a run) leaves it set, and a report then looks the shares up as before. So the row is a
bound, never a count: unset, no run ran on a slice no run created. ``check_view`` reports a ledger where
one did and the row is unset.
"""

from __future__ import annotations

from typing import Final

from tpuctl.store.cost_sql import indexed
from tpuctl.store.derived import RowTrigger, row_trigger_statements
from tpuctl.store.sql import Dialect, SqlConnection

KEY: Final = "shares_seen"
#: Whether the row is set (1) or not (0).
SEEN_SQL: Final = f"SELECT COUNT(*) FROM ledger_meta WHERE key = '{KEY}'"
_MARK: Final = f"INSERT INTO ledger_meta (key, value) VALUES ('{KEY}', '1') ON CONFLICT (key) DO NOTHING;"
_ON_A_NORUN_SLICE: Final = (
    "EXISTS (SELECT 1 FROM pods WHERE zone = NEW.zone AND name = NEW.pod AND run_id IS NULL)"
)
_UNDER_A_SEGMENT: Final = "EXISTS (SELECT 1 FROM run_segments WHERE zone = NEW.zone AND pod = NEW.name)"
_TRIGGERS: Final = (
    RowTrigger("run_segments_shares_insert", "INSERT ON run_segments", "NEW.pod IS NOT NULL", _MARK,
               _ON_A_NORUN_SLICE),
    RowTrigger("run_segments_shares_move", "UPDATE OF zone, pod ON run_segments", "NEW.pod IS NOT NULL",
               _MARK, _ON_A_NORUN_SLICE),
    RowTrigger("pods_shares_insert", "INSERT ON pods", "NEW.run_id IS NULL", _MARK, _UNDER_A_SEGMENT),
    RowTrigger("pods_shares_move", "UPDATE OF run_id, zone, name ON pods", "NEW.run_id IS NULL", _MARK,
               _UNDER_A_SEGMENT),
)  # fmt: skip
TRIGGERS: Final = tuple(t.name for t in _TRIGGERS)


def shared_slice_sql(dialect: Dialect) -> str:
    """Whether a slice (alias p) is one no run created that some run's segment ran on now (that run has a
    share of its time): a look-up of its segments by slice (``run_segments_pod``)."""
    by_pod = indexed("run_segments_pod", dialect)
    return f"""(p.run_id IS NULL AND EXISTS (SELECT 1 FROM run_segments AS rs {by_pod}
                                  WHERE rs.zone = p.zone AND rs.pod = p.name))"""


def create(conn: SqlConnection) -> None:
    """The revision's statements: the triggers, then the row where a run already ran on a slice no run
    created (in the migration's transaction: no write can come between them)."""
    for statement in row_trigger_statements(_TRIGGERS, conn.dialect):
        conn.execute(statement)
    conn.execute(
        f"INSERT INTO ledger_meta (key, value) SELECT '{KEY}', '1' WHERE EXISTS (SELECT 1 FROM pods AS p "
        f"WHERE {shared_slice_sql(conn.dialect)})"
    )


def problems(conn: SqlConnection) -> list[str]:
    """What is wrong with the row: unset where a run's segment is on a slice no run created."""
    shared_sql = f"SELECT p.zone, p.name FROM pods AS p WHERE {shared_slice_sql(conn.dialect)} LIMIT 1"
    shared = conn.execute(shared_sql).fetchone()
    seen = int(conn.execute(SEEN_SQL).fetchone()[0])
    if shared is None or seen:
        return []
    return [
        f"ledger_meta: no {KEY} row, but a run's segment is on slice {shared[1]} ({shared[0]}), "
        + "which no run created"
    ]
