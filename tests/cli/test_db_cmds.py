"""`tpuctl db status` and `tpuctl db upgrade`: where the ledger's schema stands, read without changing it,
and brought to this tpuctl's newest revision on demand (a dry run changes nothing)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from tpuctl.store import migrations, schema
from tpuctl.testing.cli import Cli


def _ledger(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    db = tmp_path / "team" / "ledger.db"
    return db, {"TPUCTL_DATABASE_URL": f"sqlite:///{db}"}


def test_status_reads_a_new_ledger_without_creating_it(cli: Cli, tmp_path: Path) -> None:
    db, env = _ledger(tmp_path)
    doc = cli("db", "status", "-o", "json", env=env).json["database"]
    assert doc["revision"] is None and doc["pending"] == list(migrations.KNOWN)
    assert doc["newest"] == migrations.HEAD and doc["engine"] == "sqlite"
    assert not db.exists()


def test_a_dry_run_changes_nothing_and_an_upgrade_runs_what_it_said(cli: Cli, tmp_path: Path) -> None:
    db, env = _ledger(tmp_path)
    plan = cli("db", "upgrade", "--dry-run", "-o", "json", env=env)
    assert plan.code == 0 and plan.json["database"]["dry_run"] is True
    assert not db.exists()
    done = cli("db", "upgrade", env=env)
    assert done.code == 0 and f"ran {', '.join(migrations.KNOWN)}" in done.stdout
    after = cli("db", "status", "-o", "json", env=env).json["database"]
    assert (after["revision"], after["pending"]) == (migrations.HEAD, [])
    assert cli("db", "upgrade", env=env).stdout.startswith("up to date")


def test_a_ledger_from_before_the_history_is_adopted_not_rebuilt(cli: Cli, tmp_path: Path) -> None:
    db, env = _ledger(tmp_path)
    db.parent.mkdir()
    conn = sqlite3.connect(db, isolation_level=None)
    for migration in schema.MIGRATIONS:
        for statement in migration.statements:
            conn.execute(statement)
        if migration.backfill is not None:
            migration.backfill(conn)
    conn.execute(f"PRAGMA user_version = {schema.SCHEMA_VERSION}")
    conn.execute(
        "INSERT INTO runs (run_id, script, status, created_at, updated_at) "
        "VALUES ('r', 's', 'succeeded', 1, 1)"
    )
    conn.close()
    state = cli("db", "status", "-o", "json", env=env).json["database"]
    assert state["pending"] == list(migrations.KNOWN[1:])  # stamped with the baseline, not run
    assert cli("db", "upgrade", env=env).code == 0
    assert cli("runs", "list", "-o", "json", env=env).json["runs"][0]["run_id"] == "r"


def test_a_newer_ledger_is_refused_naming_the_fix(cli: Cli, tmp_path: Path) -> None:
    db, env = _ledger(tmp_path)
    assert cli("db", "upgrade", env=env).code == 0
    conn = sqlite3.connect(db)
    conn.execute("UPDATE alembic_version SET version_num = '0099_later'")
    conn.commit()
    conn.close()
    assert cli("db", "status", "-o", "json", env=env).json["database"]["newer_than_this_tpuctl"] is True
    refused = cli("db", "upgrade", "--dry-run", env=env)
    assert (
        refused.code != 0
        and "newer than this tpuctl" in refused.output
        and "upgrade tpuctl" in refused.output
    )


def test_a_postgresql_ledger_is_upgraded_and_used_by_the_commands(cli: Cli, postgres_url: str) -> None:
    env = {"TPUCTL_DATABASE_URL": postgres_url}
    before = cli("db", "status", "-o", "json", env=env).json["database"]
    assert (before["engine"], before["revision"], before["pending"]) == (
        "postgresql",
        None,
        list(migrations.KNOWN),
    )
    assert cli("db", "upgrade", env=env).code == 0
    after = cli("db", "status", "-o", "json", env=env).json["database"]
    assert (after["revision"], after["pending"]) == (migrations.HEAD, [])
    assert cli("runs", "list", "-o", "json", env=env).json["runs"] == []
    report = cli("cost", "report", "-o", "json", env=env)
    assert report.code == 0, report.output
