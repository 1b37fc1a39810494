"""The cost report's engine fragments: one declaration of a working table gives each engine's DDL, and the
fragments the cost service writes with keep each engine's spelling."""

from __future__ import annotations

import pytest

from tpuctl.store.cost_sql import TempTable, add_to_rows, conflict_column, upsert_groups_first
from tpuctl.store.sql import POSTGRESQL, SQLITE


def test_a_working_table_is_declared_once_and_rendered_per_engine() -> None:
    table = TempTable("cost_x", "k KEY, n INT DEFAULT 0, s NUM, usd REAL", primary_key="k, n")
    assert table.ddl(SQLITE) == (
        "CREATE TEMP TABLE cost_x (k, n INTEGER DEFAULT 0, s, usd REAL, PRIMARY KEY (k, n))"
    )
    assert table.ddl(POSTGRESQL) == (
        "CREATE TEMP TABLE cost_x (k TEXT, n BIGINT DEFAULT 0, s float8, usd float8, PRIMARY KEY (k, n))"
    )


def test_a_single_integer_key_is_sqlites_rowid_and_without_rowid_is_sqlites_alone() -> None:
    ids = TempTable("cost_ids", "id INT", primary_key="id")
    assert ids.ddl(SQLITE) == "CREATE TEMP TABLE cost_ids (id INTEGER PRIMARY KEY)"
    runs = TempTable("cost_r", "k TEXT, n INT", primary_key="k", without_rowid=True)
    assert runs.ddl(SQLITE) == "CREATE TEMP TABLE cost_r (k TEXT PRIMARY KEY, n INTEGER) WITHOUT ROWID"
    assert runs.ddl(POSTGRESQL) == "CREATE TEMP TABLE cost_r (k TEXT PRIMARY KEY, n BIGINT)"


def test_a_column_of_no_known_type_is_refused() -> None:
    with pytest.raises(ValueError, match="cost_bad: a column needs a name and one of"):
        TempTable("cost_bad", "k VARCHAR")
    with pytest.raises(ValueError, match="cost_bad"):
        TempTable("cost_bad", "k")


def test_an_upsert_is_spelled_as_each_engine_takes_it() -> None:
    assert conflict_column("cost_runs", "usd", SQLITE) == "usd"
    assert conflict_column("cost_runs", "usd", POSTGRESQL) == "cost_runs.usd"
    assert (upsert_groups_first(SQLITE), upsert_groups_first(POSTGRESQL)) == (False, True)


def test_a_table_summed_by_key_is_upserted_on_sqlite_and_appended_to_on_postgresql() -> None:
    table = TempTable("cost_s", "k KEY, n INT DEFAULT 0", primary_key="k", summed_by_key=True)
    assert table.ddl(SQLITE) == "CREATE TEMP TABLE cost_s (k PRIMARY KEY, n INTEGER DEFAULT 0)"
    assert table.ddl(POSTGRESQL) == "CREATE TEMP TABLE cost_s (k TEXT, n BIGINT DEFAULT 0)"
    assert add_to_rows(table, ("n",), SQLITE) == "ON CONFLICT (k) DO UPDATE SET n = n + excluded.n"
    assert add_to_rows(table, ("n",), POSTGRESQL) == ""
