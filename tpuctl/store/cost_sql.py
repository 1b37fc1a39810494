"""What the cost report's SQL writes differently on each engine, beyond ``tpuctl.store.sql.Dialect``: the
one place that knows, so that the cost service (``tpuctl.services.cost``) writes its queries from these
fragments without asking which engine it reads.

Each helper returns SQLite's text unchanged (the 1,000,000-event report's speed was measured on it) and
PostgreSQL's equivalent: JSON arrays passed in as one text parameter (``jsonb_array_elements``, one way
everywhere), ``TOTAL``, a condition used as a number, SQLite's index hints (PostgreSQL's planner takes
none), ``INSERT OR IGNORE``, the subquery fence ``LIMIT -1``, an ISO 8601 time, and the report's working
tables (``TempTable``). The billing rules' fragments stay ``tpuctl.store.billing``'s (each takes the
dialect too).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from tpuctl.store import billing
from tpuctl.store.sql import POSTGRESQL, SQLITE, Dialect


def null_key(dialect: Dialect) -> str:
    """The value standing for NULL in a group key: the rollup tables' own (``billing.null_key``), so
    that rows summed from them and from the slices meet in one key. SQLite's is a NUL character;
    PostgreSQL text cannot hold one."""
    return billing.null_key(dialect)


#: What stands for NULL in a group key on any engine (a report's rows, read back, are told apart by it).
NULL_KEYS: Final = frozenset({billing.null_key(SQLITE), billing.null_key(POSTGRESQL)})


def is_pg(dialect: Dialect) -> bool:
    return dialect.name == "postgresql"


def upsert_groups_first(dialect: Dialect) -> bool:
    """Whether rows added to a keyed working table are grouped by key first: on PostgreSQL, whose upsert
    refuses to meet one key twice in a statement, and where a ``summed_by_key`` table is appended to (few
    rows, grouped); not on SQLite, whose upsert adds up as it goes (grouping there sorts every row)."""
    return is_pg(dialect)


def add_to_rows(table: TempTable, columns: tuple[str, ...], dialect: Dialect) -> str:
    """The clause of an ``INSERT INTO`` ``table`` (``summed_by_key``) that adds ``columns`` to the row
    already there with the same key: SQLite's upsert; nothing on PostgreSQL, whose table takes the rows
    as they come and is summed where it is read."""
    if is_pg(dialect):
        return ""
    return f"ON CONFLICT ({table.primary_key}) DO UPDATE SET " + ", ".join(
        f"{c} = {c} + excluded.{c}" for c in columns
    )


def conflict_column(table: str, column: str, dialect: Dialect) -> str:
    """``column`` of the row already there, in an ``ON CONFLICT DO UPDATE`` of ``table`` (PostgreSQL
    wants it named by its table; SQLite takes the bare name)."""
    return f"{table}.{column}" if is_pg(dialect) else column


def json_path_is_false(document: str, path: tuple[str, ...], dialect: Dialect) -> str:
    """Whether the JSON text ``document`` holds ``false`` at ``path`` (SQLite reads JSON false as 0)."""
    if is_pg(dialect):
        steps = "".join(f" -> '{key}'" for key in path)
        return f"(CAST({document} AS jsonb){steps}) = 'false'::jsonb"
    return f"json_extract({document}, '$.{'.'.join(path)}') = 0"


def label_value(labels: str, dialect: Dialect) -> str:
    """The value of the label named by parameter ``:label_key`` (SQLite: its JSON path ``:label_path``)
    in the JSON object text ``labels``."""
    if is_pg(dialect):
        return f"(CAST({labels} AS jsonb) ->> :label_key)"
    return f"json_extract({labels}, :label_path)"


def round_exact(value: str, dialect: Dialect) -> str:
    """``ROUND(value, 6)`` (PostgreSQL rounds only exact numbers)."""
    if is_pg(dialect):
        return f"ROUND(CAST({value} AS NUMERIC), 6)"
    return f"ROUND({value}, 6)"


def slice_id(key: str, dialect: Dialect) -> str:
    """A group key (``key_text``) that holds a slice's id, as the id again."""
    if is_pg(dialect):
        return f"CAST({key} AS BIGINT)"
    return key


def json_elements(param: str, alias: str, dialect: Dialect) -> str:
    """A FROM item: the elements of the JSON array in text parameter ``param``, as ``alias.value``."""
    if is_pg(dialect):
        return f"jsonb_array_elements(CAST({param} AS jsonb)) AS {alias}(value)"
    return f"json_each({param}) AS {alias}"


def json_int(value: str, index: int, dialect: Dialect) -> str:
    """Element ``index`` of JSON array ``value`` (an element of ``json_elements``) as an integer."""
    if is_pg(dialect):
        return f"CAST({value} ->> {index} AS BIGINT)"
    return f"CAST(json_extract({value}, '$[{index}]') AS INTEGER)"


def json_id(value: str, index: int, dialect: Dialect) -> str:
    """Element ``index`` of JSON array ``value``, a row's id, as an integer (SQLite's JSON integer is one
    already: no cast)."""
    if is_pg(dialect):
        return f"CAST({value} ->> {index} AS BIGINT)"
    return f"json_extract({value}, '$[{index}]')"


def json_real(value: str, index: int, dialect: Dialect) -> str:
    """Element ``index`` of JSON array ``value`` as a number (NULL for JSON null)."""
    if is_pg(dialect):
        return f"CAST({value} ->> {index} AS DOUBLE PRECISION)"
    return f"json_extract({value}, '$[{index}]')"


def json_array_agg(value: str, dialect: Dialect) -> str:
    """The JSON text of an array of the elements ``value`` (NULL when there are none)."""
    if is_pg(dialect):
        return f"CAST(jsonb_agg({value}) AS TEXT)"
    return f"json_group_array(json({value}))"


def json_values(param: str, sql_type: str, dialect: Dialect) -> str:
    """A subquery of the scalars in the JSON array in text parameter ``param`` (``sql_type``: INTEGER or
    TEXT), for ``x IN (...)``."""
    if is_pg(dialect):
        pg_type = "BIGINT" if sql_type == "INTEGER" else "TEXT"
        elements = f"jsonb_array_elements_text(CAST({param} AS jsonb)) AS j(value)"
        return f"SELECT CAST(j.value AS {pg_type}) FROM {elements}"
    return f"SELECT value FROM json_each({param})"


def total(value: str, dialect: Dialect) -> str:
    """SQLite's ``TOTAL``: the sum as a float, 0.0 over no rows or only NULLs."""
    if is_pg(dialect):
        return f"COALESCE(SUM({value}), 0.0)"
    return f"TOTAL({value})"


def as_int(condition: str, dialect: Dialect) -> str:
    """A condition as 1 or 0 (SQLite's conditions are numbers; PostgreSQL's booleans are not)."""
    if is_pg(dialect) and condition not in ("0", "1"):
        return f"CAST(({condition}) AS INTEGER)"
    return condition


def true(dialect: Dialect) -> str:
    return "TRUE" if is_pg(dialect) else "1"


def indexed(index: str, dialect: Dialect) -> str:
    """SQLite's ``INDEXED BY`` hint (its planner's choice measured wrong there); nothing on PostgreSQL."""
    return "" if is_pg(dialect) else f"INDEXED BY {index}"


def not_indexed(dialect: Dialect) -> str:
    return "" if is_pg(dialect) else "NOT INDEXED"


def insert_ignore(into: str, select: str, dialect: Dialect) -> str:
    """``INSERT INTO {into} {select}``, keeping the rows already there on a conflict."""
    if is_pg(dialect):
        return f"INSERT INTO {into} {select} ON CONFLICT DO NOTHING"
    return f"INSERT OR IGNORE INTO {into} {select}"


def among(column: str, ids: str, dialect: Dialect) -> str:
    """Whether ``column`` (a primary key) is one of the ids the subquery ``ids`` gives. PostgreSQL looks a
    few thousand up as one index scan over the sorted ids (``= ANY`` of an array: 15 ms for 4,484
    slices), where ``IN`` joined them one descent each (50 ms); SQLite's ``IN`` is its own such scan."""
    return f"{column} = ANY(ARRAY({ids}))" if is_pg(dialect) else f"{column} IN ({ids})"


def fence(dialect: Dialect) -> str:
    """Keeps a subquery from being flattened into its user (which would evaluate its expressions once
    per use): SQLite's ``LIMIT -1``, PostgreSQL's ``OFFSET 0``."""
    return "OFFSET 0" if is_pg(dialect) else "LIMIT -1"


def limit(param: str, dialect: Dialect) -> str:
    """``LIMIT`` a parameter where -1 means none (SQLite's convention; PostgreSQL's is NULL)."""
    if is_pg(dialect):
        return f"LIMIT NULLIF({param}, -1)"
    return f"LIMIT {param}"


def iso(instant: str, dialect: Dialect) -> str:
    """ISO 8601 UTC with a Z of epoch seconds ``instant``, seconds truncated (``window.iso``'s form);
    NULL stays NULL."""
    if is_pg(dialect):
        return f"""to_char(to_timestamp(trunc({instant})) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')"""
    # Truncated before strftime, which would round a fraction to the millisecond first (x:42.9996 as :43):
    # the second printed must be the one PostgreSQL's trunc and Python's window.iso print.
    return f"strftime('%Y-%m-%dT%H:%M:%SZ', CAST({instant} AS INTEGER), 'unixepoch')"


def key_text(key: str, dialect: Dialect) -> str:
    """A group key as stored in the working tables: as is on SQLite (untyped columns), text on
    PostgreSQL (a slice's id, a day's number and a run's id share one column there)."""
    if is_pg(dialect) and key != "NULL":
        return f"CAST({key} AS TEXT)"
    return key


def trunc_int(value: str, dialect: Dialect) -> str:
    """``value`` truncated toward zero to an integer (SQLite's CAST truncates; PostgreSQL's rounds)."""
    if is_pg(dialect):
        return f"CAST(trunc({value}) AS BIGINT)"
    return f"CAST({value} AS INTEGER)"


def cross_join(dialect: Dialect) -> str:
    """A join kept in the order written: SQLite's ``CROSS JOIN ... ON`` (its planner's hint); a plain
    ``JOIN`` on PostgreSQL, whose ``CROSS JOIN`` takes no ``ON``."""
    return "JOIN" if is_pg(dialect) else "CROSS JOIN"


#: A working table's column types, each engine's: ``KEY`` a group key (a slice's id, a day's number or a
#: run's id: untyped on SQLite, values kept as computed; text on PostgreSQL), ``NUM`` a figure kept as
#: computed on SQLite (an int stays one), ``WHOLE`` a count kept as computed there.
_TYPES: Final = {
    "INT": ("INTEGER", "BIGINT"),
    "REAL": ("REAL", "float8"),
    "TEXT": ("TEXT", "TEXT"),
    "KEY": ("", "TEXT"),
    "NUM": ("", "float8"),
    "WHOLE": ("", "BIGINT"),
}


@dataclass(frozen=True, slots=True)
class TempTable:
    """A working table of a report, declared once in engine-neutral column types (``_TYPES``):
    ``columns`` as ``"name TYPE [DEFAULT 0], ..."``, ``primary_key`` the key's columns, ``without_rowid``
    SQLite's clustered table (nothing on PostgreSQL, whose tables are heaps).

    ``summed_by_key``: rows of one key are added up (``add_to_rows``), and every reader sums them by key.
    SQLite keeps one row per key, by an upsert into the primary key (its GROUP BY would sort every row);
    PostgreSQL appends them to a table with no key, as an upsert there costs an index look-up and a
    speculative insertion per row (thousands of rollup rows: most of a report's time at 100,000 events).

    ``statistics``: False where PostgreSQL's planner needs none of the table's statistics, and none are
    gathered: a table the report only sums (one GROUP BY, never a join; ``ANALYZE`` of the first-day sums
    took 0.03 s of a 1,000,000-event report, longer than summing them), or one whose row count (which the
    planner reads off its size) is all it needs."""

    name: str
    columns: str
    primary_key: str = ""
    without_rowid: bool = False
    summed_by_key: bool = False
    statistics: bool = True

    def __post_init__(self) -> None:
        for column in self.columns.split(", "):
            words = column.split()
            if len(words) < 2 or words[1] not in _TYPES:
                raise ValueError(
                    f"{self.name}: a column needs a name and one of {sorted(_TYPES)}: {column!r}"
                )

    def ddl(self, dialect: Dialect) -> str:
        """The ``CREATE TEMP TABLE`` statement on ``dialect``'s engine."""
        engine = 1 if is_pg(dialect) else 0
        primary_key = "" if self.summed_by_key and engine else self.primary_key
        single_key = "," not in primary_key and primary_key != ""
        columns = []
        for column in self.columns.split(", "):
            name, kind, *rest = column.split()
            declared = " ".join(w for w in (name, _TYPES[kind][engine], *rest) if w)
            if single_key and name == primary_key:
                declared += " PRIMARY KEY"
            columns.append(declared)
        if primary_key and not single_key:
            columns.append(f"PRIMARY KEY ({primary_key})")
        rowid = " WITHOUT ROWID" if self.without_rowid and not engine else ""
        return f"CREATE TEMP TABLE {self.name} ({', '.join(columns)}){rowid}"
