"""An engine for a ledger URL, on both engines: the ledger's SQLite settings, and a PostgreSQL connection
that outlives a server restart."""

from __future__ import annotations

import stat
from pathlib import Path

import sqlalchemy
from sqlalchemy import text

from tpuctl.store.engine import APPLICATION_NAME, create_engine
from tpuctl.store.url import parse_database_url, sqlite_url
from tpuctl.testing.postgres import PostgresCluster


def round_trip(engine: sqlalchemy.engine.Engine) -> list[tuple[int, str]]:
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE notes (id integer PRIMARY KEY, body text NOT NULL)"))
        conn.execute(text("INSERT INTO notes (id, body) VALUES (:id, :body)"), [{"id": 1, "body": "één"}])
    with engine.connect() as conn:
        return [(int(row.id), str(row.body)) for row in conn.execute(text("SELECT id, body FROM notes"))]


def test_a_sqlite_engine_has_the_ledgers_settings(tmp_path: Path) -> None:
    path = tmp_path / "new-dir" / "ledger.db"
    engine = create_engine(sqlite_url(path), busy_timeout_s=7.5)
    try:
        assert round_trip(engine) == [(1, "één")]
        with engine.connect() as conn:
            pragmas = {
                name: conn.exec_driver_sql(f"PRAGMA {name}").scalar()
                for name in (
                    "journal_mode",
                    "synchronous",
                    "foreign_keys",
                    "cache_size",
                    "journal_size_limit",
                )
            }
            busy_ms = conn.exec_driver_sql("PRAGMA busy_timeout").scalar()
    finally:
        engine.dispose()
    assert pragmas == {
        "journal_mode": "wal",
        "synchronous": 2,  # FULL
        "foreign_keys": 1,
        "cache_size": -16_384,
        "journal_size_limit": 67_108_864,
    }
    assert busy_ms == 7500
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    for suffix in ("-wal", "-shm"):
        sidecar = Path(f"{path}{suffix}")
        assert not sidecar.exists() or stat.S_IMODE(sidecar.stat().st_mode) == 0o600


def test_a_postgresql_engine_round_trips_and_survives_a_restart(
    postgres_cluster: PostgresCluster, postgres_url: str
) -> None:
    engine = create_engine(parse_database_url(postgres_url))
    try:
        assert engine.dialect.name == "postgresql" and engine.dialect.driver == "psycopg"
        assert round_trip(engine) == [(1, "één")]
        with engine.connect() as conn:
            assert conn.execute(text("SHOW application_name")).scalar() == APPLICATION_NAME
        # The pooled connection died with the old server; pre-ping replaces it instead of failing.
        postgres_cluster.restart()
        with engine.connect() as conn:
            assert conn.execute(text("SELECT body FROM notes")).scalar() == "één"
    finally:
        engine.dispose()


def test_a_postgresql_engine_takes_the_urls_own_parameters(postgres_url: str) -> None:
    engine = create_engine(parse_database_url(f"{postgres_url}?application_name=ci-runner"))
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SHOW application_name")).scalar() == "ci-runner"
    finally:
        engine.dispose()


def test_the_engines_url_hides_the_password() -> None:
    url = parse_database_url("postgresql://alice:hunter2@team-db.invalid/tpuctl")
    engine = create_engine(url)  # connects lazily: nothing is tried here
    assert "hunter2" not in repr(engine) and "hunter2" not in str(engine.url)
    assert engine.url.password == "hunter2"


def test_nothing_imports_the_database_libraries_before_an_engine_is_made() -> None:
    """CLI start time: parsing a URL, the settings, the store package and ``--help`` load none of them."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from tpuctl.cli.main import run\n"
        "import tpuctl.store, tpuctl.store.engine, tpuctl.store.ledger\n"
        "from tpuctl.settings import load_settings\n"
        "load_settings({'database': 'postgresql://alice:pw@team-db/tpuctl'})\n"
        "try:\n    run(['--help'])\nexcept SystemExit:\n    pass\n"
        "print([m for m in ('sqlalchemy', 'psycopg', 'alembic') if m in sys.modules])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip().splitlines()[-1] == "[]"
