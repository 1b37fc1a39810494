"""`tpuctl db status` and `tpuctl db upgrade`: where the ledger's schema stands, read without changing it,
and brought to this tpuctl's newest revision on demand (a dry run changes nothing); `tpuctl db copy`:
its document, its progress on stderr, its dry run and its refusal (the copy itself: tests/store)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from tpuctl.store import EventKind, Ledger, RunStatus, migrations, schema
from tpuctl.store.url import sqlite_url
from tpuctl.testing.cli import Cli

T0 = 1_780_000_000.0  # 2026-05-28: before the real clock the command reports until


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


def _laptop(path: Path) -> str:
    """A small quiet ledger: one finished run whose slice was created, billed for an hour and deleted."""
    url = sqlite_url(path)
    with Ledger.open(url) as ledger:
        ledger.create_run("run-1", script="train.py", ts=T0)
        ledger.record_event(EventKind.REQUESTED, pod="s1", zone="us-central1-a",
                            accelerator_type="v5litepod-8", chips=8, price_per_chip_hour=1.2, run_id="run-1",
                            ts=T0)  # fmt: skip
        ledger.record_event(EventKind.READY, pod="s1", zone="us-central1-a", ts=T0 + 60)
        ledger.record_event(EventKind.DELETED, pod="s1", zone="us-central1-a", ts=T0 + 3660)
        ledger.update_run("run-1", status=RunStatus.SUCCEEDED, ended_at=T0 + 3660)
    return url.text


def test_db_copy_says_what_it_copied_and_checked_and_a_second_copy_writes_nothing(
    cli: Cli, tmp_path: Path
) -> None:
    source, target = _laptop(tmp_path / "laptop.db"), f"sqlite:///{tmp_path / 'team.db'}"
    plan = cli("db", "copy", source, target, "--dry-run", "-o", "json")
    assert plan.code == 0, plan.output
    assert plan.json["copy"]["plan"]["events"] == 3 and not (tmp_path / "team.db").exists()
    done = cli("db", "copy", source, target, "-o", "json")
    assert done.code == 0, done.output
    doc = done.json["copy"]
    assert doc["verified"] == "ledger" and doc["copied"]["runs_copied"] == 1
    assert doc["rows"]["source"] == doc["rows"]["target"] and doc["rows"]["target"]["events"] == 3
    assert doc["cost_totals"]["target"]["cost_usd"] == doc["cost_totals"]["source"]["cost_usd"] == 9.6
    assert "db copy: events: 3 of 3" in done.stderr  # progress as plain lines when stderr is no terminal
    again = cli("db", "copy", source, target)
    assert again.code == 0 and "every table and the cost totals match" in again.stdout
    assert "events_copied" in again.stdout and "runs_present" in again.stdout


def test_db_copy_refuses_a_ledger_with_a_run_still_going(cli: Cli, tmp_path: Path) -> None:
    source = _laptop(tmp_path / "laptop.db")
    with Ledger.open(source) as ledger:
        ledger.create_run("run-2", script="train.py", status=RunStatus.RUNNING)
    refused = cli("db", "copy", source, f"sqlite:///{tmp_path / 'team.db'}", "-o", "json")
    assert refused.code == 2 and "run-2 (running)" in refused.json["message"]
    assert not (tmp_path / "team.db").exists()
    bad = cli("db", "copy", source, "team.db")
    assert bad.code == 2 and "target" in bad.output
    missing = cli("db", "copy", f"sqlite:///{tmp_path / 'typo.db'}", f"sqlite:///{tmp_path / 'team.db'}")
    assert missing.code == 2 and "no ledger at" in missing.output and not (tmp_path / "typo.db").exists()
