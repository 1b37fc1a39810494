"""The billing rules: the one place they are written, in Python and as the SQL fragments made from them.

The ledger's view function (``tpuctl.store.view``) applies them as events arrive, the ledger's triggers
(``tpuctl.store.schema``) roll up what they produce, and the cost report's queries
(``tpuctl.services.cost``) bill a window with them; all three take their constants, predicates and SQL
expressions from here, so a rule changed here changes everywhere at once. (This module sits in the store
layer because the store may not import services; the services import it.)

Rules, applied to each incarnation of a slice (a row of the ledger's ``pods``; GCP's billing model):

* **Billed from READY until the end.** Billing starts at the first READY (``ready_at``) and ends at the
  first of the events in ``END_KINDS`` (preempted, failed, deleted, gone: ``ended_at``), or runs on to
  now while the slice is alive. A slice never READY, or whose chip count was never known, costs nothing.
* **Per second.** Time is billed to the second, as a real number: no rounding to minutes or hours.
  cost = chips x USD per chip-hour x seconds / 3600. Sums are kept exact (USD x 3600, "usd_s") and only
  rounded for display, to 6 decimals (``round_usd``).
* **A spot or preemptible slice preempted in its first minute is free**: ``end_reason = 'preempted'``,
  capacity in ``PREEMPTIBLE_CAPACITIES``, and ``ended_at - ready_at < FREE_PREEMPTION_S`` (60 s) bill
  nothing at all (``is_free_preemption``, ``free_preemption_sql``).
* **The price in force.** A slice is billed at the price per chip-hour recorded with it. A
  ``price_change`` event recorded while the slice is open splits its billed time: each price is billed for
  its own part. One recorded after the slice ended (an event arriving late) changes nothing. A slice with
  no recorded price is billed at the catalog's current list price at report time.
* **UTC days.** Per-day figures cut a slice's billed time at UTC midnight (``day_sql``); a slice's
  first billed day is the day of ``ready_at``, and its end day is ``ended_at`` rounded *up* to the next
  midnight (``ceil_day_sql``: an exact midnight stays where it is).
* **Quota held.** A preempted slice holds its quota from the preemption until it is deleted (or until
  now): not billed by GCP, but reported (chip-hours, and USD at the slice's price) as waste. A slice only
  holding quota in a window (not billed in it) still counts as a slice of its group there.
* **Recomputed work.** A run segment that redid steps after a preemption wasted the share
  ``steps_recomputed / steps_completed`` (capped at 1; ``steps_completed`` counts every step the segment
  ran) of the slice time it overlaps (``recompute_fraction_sql``), reported as waste at the slice's price.

Everything a report shows is clipped to its window ``[since, until)``.
"""

from __future__ import annotations

from typing import Final

from tpuctl.catalog import CapacityType
from tpuctl.store.records import EventKind
from tpuctl.store.sql import SQLITE, Dialect

#: A spot/preemptible slice preempted within this many seconds of READY is not charged (GCP's rule).
FREE_PREEMPTION_S: Final = 60.0
#: The capacity types (``pods.capacity`` values) that can be preempted, and so can be free, and whose
#: time is compared with the on-demand price for savings.
PREEMPTIBLE_CAPACITIES: Final = (CapacityType.SPOT.value, CapacityType.PREEMPTIBLE.value)
#: The event kinds that end a slice's billing, in ``tpuctl.store.view``'s order.
END_KINDS: Final = (EventKind.PREEMPTED.value, EventKind.FAILED.value, EventKind.DELETED.value,
                    EventKind.GONE.value)  # fmt: skip
#: Seconds in a (UTC) day: days are numbered from the epoch.
DAY_S: Final = 86400
#: Display rounding of USD and hour figures: exact to a millionth.
DISPLAY_DECIMALS: Final = 6


def _sql_list(values: tuple[str, ...]) -> str:
    return "(" + ", ".join(f"'{v}'" for v in values) + ")"


#: ``END_KINDS`` as an SQL list.
END_KINDS_SQL: Final = _sql_list(END_KINDS)


# --- Python ------------------------------------------------------------------------------------------


def is_preemptible(capacity: str | None) -> bool:
    return capacity in PREEMPTIBLE_CAPACITIES


def is_free_preemption(
    end_reason: str | None, capacity: str | None, ready_at: float, ended_at: float
) -> bool:
    """Whether a slice READY at ``ready_at`` and ended at ``ended_at`` is billed nothing."""
    return (
        end_reason == EventKind.PREEMPTED.value
        and is_preemptible(capacity)
        and ended_at - ready_at < FREE_PREEMPTION_S
    )


def round_usd(value: float) -> float:
    """A figure as shown: 6 decimals (64 x 0.245 x 1.5 prints as 23.52, not 23.519999), never -0.0."""
    out = round(value, DISPLAY_DECIMALS)
    return 0.0 if out == 0 else out


# --- SQL (``r``: the alias of a pods row, e.g. "p" or "NEW") -------------------------------------------
#
# Each fragment is written for SQLite (the default: its text is what existing ledgers' triggers hold, so it
# never changes) and, with ``dialect=POSTGRESQL``, for PostgreSQL, giving the same value for every input:
# a day is SQLite's truncating CAST (``trunc`` there, not PostgreSQL's rounding CAST), a condition is a
# boolean where PostgreSQL will not take a number, and a midnight is a double (PostgreSQL's ``86400.0`` is
# an exact numeric, which would leak into results as a Decimal).


def null_key_sql(dialect: Dialect = SQLITE) -> str:
    """What stands for a NULL type or capacity in a rollup's key (a key column cannot be NULL: NULLs
    never conflict in a primary key, so each NULL slice would get a row of its own). SQLite: ``char(0)``.
    PostgreSQL text cannot hold a NUL character: ``chr(1)`` there, equally never a real type or capacity.
    Queries that read the rollups compare with this (or pass ``null_key(dialect)``)."""
    return "char(0)" if dialect.name == "sqlite" else "chr(1)"


def null_key(dialect: Dialect = SQLITE) -> str:
    """``null_key_sql``'s value, as a query parameter or to recognise it in a row read back."""
    return "\x00" if dialect.name == "sqlite" else "\x01"


def preemptible_sql(r: str) -> str:
    return f"{r}.capacity IN {_sql_list(PREEMPTIBLE_CAPACITIES)}"


def free_if_preempted_sql(r: str) -> str:
    """For a slice known to be preempted (e.g. read from an index of preempted slices only): whether the
    preemption is free (NULL when ``ready_at`` is: never READY, never billed)."""
    return f"{preemptible_sql(r)}\n                  AND {r}.ended_at - {r}.ready_at < {FREE_PREEMPTION_S!r}"


def free_preemption_sql(r: str, dialect: Dialect = SQLITE) -> str:
    """Whether a slice is a free preemption, never NULL (a NULL end_reason must not make ``NOT`` of it
    NULL): 1 or 0 on SQLite, a boolean on PostgreSQL (whose ``NOT`` takes no number). Use it as a
    condition (``NOT ...``), not as a number."""
    otherwise = "0" if dialect.name == "sqlite" else "FALSE"
    preempted = f"{r}.end_reason = '{EventKind.PREEMPTED.value}'"
    return f"COALESCE({preempted} AND {free_if_preempted_sql(r)}, {otherwise})"


def day_sql(t: str, dialect: Dialect = SQLITE) -> str:
    """The UTC day number of the instant ``t``: SQLite's CAST truncates toward zero; PostgreSQL's CAST
    rounds, so ``trunc`` first there (not ``floor``: the same number as SQLite's for every instant, even
    one before the epoch)."""
    if dialect.name == "postgresql":
        return f"CAST(trunc({t} / {DAY_S}) AS BIGINT)"
    return f"CAST({t} / {DAY_S} AS INTEGER)"


def ceil_day_sql(t: str, dialect: Dialect = SQLITE) -> str:
    """The day after the one holding the instant ``t`` (rounded up to midnight; an exact midnight stays).
    SQLite adds the comparison (0 or 1); PostgreSQL's boolean is cast to an integer first."""
    day = day_sql(t, dialect)
    if dialect.name == "postgresql":
        return f"({day} + CAST({t} > {midnight_sql(day, dialect)} AS INTEGER))"
    return f"({day} + ({t} > {day} * {DAY_S}.0))"


def midnight_sql(day: str, dialect: Dialect = SQLITE) -> str:
    """The instant (epoch seconds) the UTC day numbered ``day`` begins, as a float on both engines."""
    if dialect.name == "postgresql":
        return f"(CAST(({day}) AS DOUBLE PRECISION) * {DAY_S})"
    return f"({day}) * {DAY_S}.0"


def midnight_after_sql(t: str, dialect: Dialect = SQLITE) -> str:
    """The first midnight after the day holding ``t``, as epoch seconds."""
    return midnight_sql(f"{day_sql(t, dialect)} + 1", dialect)


def first_day_sql(r: str, dialect: Dialect = SQLITE) -> str:
    """A slice's first billed day (as the rollups key it)."""
    return day_sql(f"{r}.ready_at", dialect)


def end_day_sql(r: str, dialect: Dialect = SQLITE) -> str:
    """The day after the last one a closed slice was billed in (its end rounded up to midnight)."""
    return ceil_day_sql(f"{r}.ended_at", dialect)


def crosses_midnight_sql(r: str, dialect: Dialect = SQLITE) -> str:
    """A closed slice billed past the midnight after its READY (``r`` "": the columns unqualified, as in
    an index's WHERE)."""
    col = f"{r}." if r else ""
    return f"{col}ended_at > {midnight_after_sql(f'{col}ready_at', dialect)}"


def multi_day_sql(r: str, dialect: Dialect = SQLITE) -> str:
    """A closed slice billed past the second midnight after its READY (``r`` "": the columns unqualified, as
    in an index's WHERE): its time after its first two days is not in the pass over its first days."""
    col = f"{r}." if r else ""
    return (
        f"{col}ended_at IS NOT NULL AND {col}ready_at IS NOT NULL "
        f"AND {col}ended_at > {midnight_after_sql(f'{col}ready_at', dialect)} + {DAY_S}.0"
    )


def recompute_fraction_sql(rs: str, dialect: Dialect = SQLITE) -> str:
    """The share of a run segment's (alias ``rs``) slice time whose work was recomputed (NULL when
    ``steps_recomputed`` is).

    The divisor is at least the dividend, so the share never exceeds 1 and SQLite's ``MIN(1.0, ...)`` only
    ever passes the share or its NULL on; PostgreSQL's ``LEAST`` would turn that NULL into 1.0, so the
    PostgreSQL text leaves the cap out. Its ``GREATEST`` skips a NULL where SQLite's ``MAX`` returns NULL:
    only when ``steps_recomputed`` is NULL, and then the share is NULL on both."""
    if dialect.name == "postgresql":
        return (
            f"(CAST({rs}.steps_recomputed AS DOUBLE PRECISION) / "
            f"GREATEST(COALESCE({rs}.steps_completed, 0), {rs}.steps_recomputed, 1))"
        )
    return (
        f"MIN(1.0, CAST({rs}.steps_recomputed AS REAL) / MAX(COALESCE({rs}.steps_completed, 0), "
        f"{rs}.steps_recomputed, 1))"
    )
