"""The ledger's schema history: one definition (``store.tables``), Alembic's revisions over it, and the
adoption of ledgers the hand-written migrations made."""

from __future__ import annotations

import re
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tpuctl.catalog import CapacityType
from tpuctl.store import Ledger, migrate, migrations, schema
from tpuctl.store.records import EventKind, LedgerError


def _schema_of(db: Path) -> dict[str, Any]:
    """Every table's columns (name, type, not null, default, key), foreign keys and indexes (columns,
    unique, partial condition), and the triggers' names: what two ledgers must share to be the same."""
    conn = sqlite3.connect(db)
    try:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name != 'alembic_version' "
                "ORDER BY name"
            )
        ]
        out: dict[str, Any] = {}
        for table in tables:
            columns = [
                (r[1], r[2].upper(), r[3], r[4], r[5]) for r in conn.execute(f"PRAGMA table_xinfo({table})")
            ]
            fks = sorted(tuple(r[2:5]) for r in conn.execute(f"PRAGMA foreign_key_list({table})"))
            sql = conn.execute("SELECT sql FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0]
            options = (" STRICT" in sql.upper().replace(",", " "), "WITHOUT ROWID" in sql.upper())
            indexes = {}
            for _seq, name, unique, origin, partial in conn.execute(f"PRAGMA index_list({table})"):
                cols = [r[2] for r in conn.execute(f"PRAGMA index_info({name})")]
                if origin == "c":
                    index_sql = conn.execute(
                        "SELECT sql FROM sqlite_master WHERE name = ?", (name,)
                    ).fetchone()[0]
                    where = _normalized(index_sql.split(" WHERE ", 1)[1]) if partial else None
                    indexes[name] = (cols, unique, where)
                else:  # the primary key's or a UNIQUE constraint's own index (named by SQLite)
                    indexes[f"{origin}:{','.join(cols)}"] = (cols, unique, None)
            out[table] = (columns, fks, options, indexes)
        out["triggers"] = sorted(
            r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")
        )
        return out
    finally:
        conn.close()


def _normalized(sql: str) -> str:
    return re.sub(r"\s+", " ", sql).replace("( ", "(").replace(" )", ")").strip()


def _legacy_ledger(db: Path, version: int = schema.SCHEMA_VERSION) -> None:
    """A ledger as the hand-written migrations (the release before the history) leave it at ``version``."""
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        for migration in schema.MIGRATIONS[:version]:
            for statement in migration.statements:
                conn.execute(statement)
            if migration.backfill is not None:
                migration.backfill(conn)
        conn.execute(f"PRAGMA user_version = {version:d}")
        conn.execute("COMMIT")
    finally:
        conn.close()


def _by_alembic(db: Path, revision: str = migrations.HEAD) -> None:
    """A new ledger made by Alembic's history from the metadata, up to ``revision`` (the path a
    PostgreSQL ledger takes)."""
    from alembic import command

    raw = sqlite3.connect(db, isolation_level=None)
    try:
        raw.execute("BEGIN IMMEDIATE")
        with migrate._sqlalchemy_on(raw) as conn:
            command.upgrade(migrate._config(conn), revision)
        if raw.in_transaction:
            raw.execute("COMMIT")
    finally:
        raw.close()


def test_the_metadata_is_the_schema_the_hand_written_migrations_made(tmp_path: Path) -> None:
    legacy, fresh = tmp_path / "legacy.db", tmp_path / "alembic.db"
    _legacy_ledger(legacy)
    _by_alembic(fresh, migrations.BASELINE)
    want, have = _schema_of(legacy), _schema_of(fresh)
    assert sorted(have) == sorted(want)
    for table in want:
        assert have[table] == want[table], table
    assert len(want["triggers"]) == 11


def test_a_ledger_alembic_made_bills_and_rolls_up_like_any_other(tmp_path: Path) -> None:
    _by_alembic(tmp_path / "ledger.db")
    with Ledger(tmp_path / "ledger.db") as ledger:
        ledger.record_event(EventKind.REQUESTED, pod="p", zone="z", accelerator_type="v5e-8", chips=8,
                            capacity=CapacityType.SPOT, price_per_chip_hour=1.2, ts=0.0)  # fmt: skip
        ledger.record_event(EventKind.READY, pod="p", zone="z", ts=100.0)
        ledger.record_event(EventKind.DELETED, pod="p", zone="z", ts=3700.0)
        assert ledger.check_view() == []
        pod = ledger.get_pod("p", "z")
        assert pod is not None and pod.ended_at == 3700.0
        assert len(ledger.identity) == 16


def test_alembic_stamps_a_legacy_ledger_as_migrate_does(tmp_path: Path) -> None:
    from alembic import command

    ours, theirs = tmp_path / "ours.db", tmp_path / "theirs.db"
    for db in (ours, theirs):
        _legacy_ledger(db)
    Ledger(ours).close()
    raw = sqlite3.connect(theirs, isolation_level=None)
    with migrate._sqlalchemy_on(raw) as conn:
        command.stamp(migrate._config(conn), migrations.BASELINE)
    raw.close()
    for db in (ours, theirs):
        conn = sqlite3.connect(db)
        row = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'alembic_version'").fetchone()
        versions = conn.execute("SELECT version_num FROM alembic_version").fetchall()
        conn.close()
        assert _normalized(row[0]) == _normalized(migrate.ALEMBIC_VERSION_TABLE_SQL)
        assert versions == [(migrations.HEAD if db == ours else migrations.BASELINE,)]


@pytest.mark.parametrize("version", [schema.SCHEMA_VERSION, 9, 1])
def test_a_ledger_of_the_release_before_the_history_is_adopted_without_loss(
    tmp_path: Path, version: int
) -> None:
    db = tmp_path / "ledger.db"
    _legacy_ledger(db, version)
    conn = sqlite3.connect(db)
    conn.execute(
        "INSERT INTO pods (id, zone, name, incarnation, state, chips, capacity, price_per_chip_hour, "
        "ready_at, "
        "ended_at, updated_at, last_event_id) VALUES (1, 'z', 'old', 1, 'DELETED', 8, 'on-demand', 1.2, 0, "
        "3600, 3600, 2)"
    )
    conn.execute("INSERT INTO events (id, ts, kind, pod, zone, pod_id) VALUES (1, 0, 'ready', 'old', 'z', 1)")
    conn.execute(
        "INSERT INTO events (id, ts, kind, pod, zone, pod_id) VALUES (2, 3600, 'deleted', 'old', 'z', 1)"
    )
    conn.commit()
    conn.close()
    with Ledger(db) as ledger:
        assert ledger.schema_version == migrate.sqlite_user_version()
        pod = ledger.get_pod("old", "z")
        assert pod is not None and (pod.chips, pod.ready_at, pod.ended_at) == (8, 0, 3600)
        assert [e.id for e in ledger.events()] == [1, 2]
        ledger.record_event(EventKind.REQUESTED, pod="new", zone="z", ts=4000.0)
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT version_num FROM alembic_version").fetchall() == [(migrations.HEAD,)]
    conn.close()
    fresh = tmp_path / "fresh"
    Ledger(fresh).close()
    assert _schema_of(db) == _schema_of(fresh / "ledger.db")


def test_opening_a_current_ledger_imports_no_sqlalchemy(tmp_path: Path) -> None:
    import subprocess
    import sys

    Ledger(tmp_path).close()  # made (and migrated) here; opened below by a new process
    code = (
        "import sys; from tpuctl.store import Ledger; "
        f"Ledger({str(tmp_path)!r}).close(); Ledger({str(tmp_path)!r}).close(); "
        "print(sorted(m for m in ('sqlalchemy', 'alembic') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_revision_this_tpuctl_does_not_know_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    Ledger(db).close()
    conn = sqlite3.connect(db)
    conn.execute("UPDATE alembic_version SET version_num = '0099_from_the_future'")
    conn.commit()
    conn.close()
    with pytest.raises(LedgerError, match="0099_from_the_future, newer than this tpuctl understands"):
        Ledger(db)


def test_known_revisions_are_alembics_history_in_order() -> None:
    from alembic.script import ScriptDirectory

    from tpuctl.store.migrate import _config

    scripts = ScriptDirectory.from_config(_config(None))
    walked = [s.revision for s in scripts.walk_revisions()]
    assert tuple(reversed(walked)) == migrations.KNOWN
    assert scripts.get_current_head() == migrations.HEAD


@pytest.fixture
def history_with(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str, str], None]:
    """Give the history one more revision, ``name``, whose upgrade runs ``statements`` (what a later
    change of the ledger does: add a revision file)."""

    def add(name: str, statements: str) -> None:
        target = tmp_path / "history"
        shutil.copytree(
            Path(migrations.__file__).parent, target, ignore=shutil.ignore_patterns("__pycache__")
        )
        body = "\n".join(f"    op.execute({line!r})" for line in statements.split(";"))
        (target / "versions" / f"{name}.py").write_text(
            f"from alembic import op\n\nrevision = {name!r}\ndown_revision = {migrations.HEAD!r}\n"
            f"branch_labels = None\ndepends_on = None\n\n\ndef upgrade() -> None:\n{body}\n"
        )
        monkeypatch.setattr(migrate, "SCRIPT_LOCATION", str(target))
        monkeypatch.setattr(migrations, "KNOWN", (*migrations.KNOWN, name))
        monkeypatch.setattr(migrations, "HEAD", name)

    return add


def test_a_new_revision_adds_a_table_and_an_older_tpuctl_then_refuses_the_ledger(
    tmp_path: Path, history_with: Callable[[str, str], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state"
    with Ledger(state) as ledger:
        ledger.record_event(EventKind.REQUESTED, pod="p", zone="us-central1-a", ts=1.0)
    history_with("0002_budgets", "CREATE TABLE budgets (run_id TEXT PRIMARY KEY, usd REAL NOT NULL) STRICT")
    with Ledger(state) as ledger:
        assert (
            ledger.schema_version
            == migrate.sqlite_user_version()
            == schema.SCHEMA_VERSION + len(migrations.KNOWN) - 1
        )
        assert [p.name for p in ledger.list_pods()] == ["p"]  # data kept
    conn = sqlite3.connect(state / "ledger.db")
    assert conn.execute("SELECT version_num FROM alembic_version").fetchall() == [("0002_budgets",)]
    assert conn.execute("SELECT name FROM sqlite_master WHERE name = 'budgets'").fetchone() is not None
    conn.close()
    monkeypatch.undo()  # the tpuctl of before the revision
    with pytest.raises(LedgerError, match="newer than this tpuctl understands"):
        Ledger(state)


def test_a_failing_revision_changes_nothing(
    tmp_path: Path, history_with: Callable[[str, str], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state"
    Ledger(state).close()
    history_with("0002_half", "CREATE TABLE first_half (x INTEGER) STRICT; CREATE TABLE oops (")
    with pytest.raises(LedgerError):
        Ledger(state)
    monkeypatch.undo()
    conn = sqlite3.connect(state / "ledger.db")
    assert conn.execute("SELECT name FROM sqlite_master WHERE name = 'first_half'").fetchone() is None
    assert conn.execute("SELECT version_num FROM alembic_version").fetchall() == [(migrations.HEAD,)]
    conn.close()
    with Ledger(state) as ledger:
        assert ledger.schema_version == migrate.sqlite_user_version()


def test_a_ledger_another_process_took_through_the_history_meanwhile_is_left_as_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two tpuctl processes open a new ledger at once: this one read version 0, then, waiting for the
    # write lock, the other made the ledger and ran the history's later revisions (user_version > 10).
    db = tmp_path / "ledger.db"
    Ledger(db).close()  # the other process's work
    real = schema.schema_version
    first_read = [0]
    monkeypatch.setattr(schema, "schema_version", lambda conn: first_read.pop() if first_read else real(conn))
    raw = sqlite3.connect(db, isolation_level=None)
    try:
        assert (
            schema.migrate(raw, where=str(db), newest=migrate.sqlite_user_version())
            == migrate.sqlite_user_version()
        )
        assert real(raw) == migrate.sqlite_user_version()  # neither refused nor set back to 10
    finally:
        raw.close()
    with Ledger(db) as ledger:
        assert ledger.schema_version == migrate.sqlite_user_version()
