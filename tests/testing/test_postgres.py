"""The throwaway PostgreSQL cluster the tests share: a real server, a database per test, claims that never
collide, and a server that goes down and comes back as a team's database may."""

from __future__ import annotations

import os
import pwd
import secrets
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from psycopg.rows import TupleRow

from tpuctl.testing.postgres import (
    UNPRIVILEGED_USER,
    PostgresCluster,
    PostgresError,
    PostgresMissingError,
    _check_reachable,
    _RunAs,
    find_postgres_bin,
)


@contextmanager
def connect(url: str, *, autocommit: bool = True) -> Iterator[psycopg.Connection[TupleRow]]:
    """A plain psycopg connection to the database of a SQLAlchemy URL (``postgresql+psycopg://``)."""
    with psycopg.connect(
        url.replace("postgresql+psycopg://", "postgresql://", 1), autocommit=autocommit
    ) as conn:
        yield conn


def scalar(conn: psycopg.Connection[TupleRow], query: str) -> object:
    row = conn.execute(query.encode()).fetchone()
    assert row is not None
    return row[0]


def test_each_test_gets_a_fresh_database_of_its_own(
    postgres_cluster: PostgresCluster, postgres_url: str
) -> None:
    assert postgres_url.startswith(f"postgresql+psycopg://postgres@127.0.0.1:{postgres_cluster.port}/test_")
    other_name = f"other_{secrets.token_hex(4)}"
    other_url = postgres_cluster.create_database(other_name)
    try:
        with connect(postgres_url) as mine, connect(other_url) as other:
            assert scalar(mine, "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'") == 0
            mine.execute(b"CREATE TABLE notes (body text)")
            mine.execute(b"INSERT INTO notes VALUES ('mine')")
            assert scalar(mine, "SELECT body FROM notes") == "mine"
            assert scalar(other, "SELECT to_regclass('notes') IS NULL") is True
    finally:
        postgres_cluster.drop_database(other_name)
    with connect(postgres_url) as mine:
        assert scalar(mine, f"SELECT count(*) FROM pg_database WHERE datname = '{other_name}'") == 0


def test_a_ledger_database_is_a_copy_of_the_migrated_template_and_its_own(
    postgres_cluster: PostgresCluster, postgres_ledger_url: str
) -> None:
    other_name = f"other_{secrets.token_hex(4)}"
    other_url = postgres_cluster.create_database(other_name, template="ledger_template")
    try:
        with connect(postgres_ledger_url) as mine, connect(other_url) as other:
            head = "SELECT version_num FROM alembic_version"
            assert scalar(mine, head) == scalar(other, head) != ""
            mine.execute(b"DELETE FROM alembic_version")
            assert scalar(other, "SELECT count(*) FROM alembic_version") == 1
    finally:
        postgres_cluster.drop_database(other_name)


def test_a_database_name_is_a_plain_identifier(postgres_cluster: PostgresCluster) -> None:
    for bad in ('x"; DROP DATABASE postgres; --', "Upper", "", "a-b"):
        with pytest.raises(ValueError, match="lower-case letters"):
            postgres_cluster.create_database(bad)


def test_the_server_listens_on_loopback_only(postgres_cluster: PostgresCluster, postgres_url: str) -> None:
    with connect(postgres_url) as conn:
        assert scalar(conn, "SHOW listen_addresses") == "127.0.0.1"
        assert scalar(conn, "SHOW port") == str(postgres_cluster.port)
        assert scalar(conn, "SHOW fsync") == "off"
        assert str(scalar(conn, "SHOW server_version")).split(".")[0].isdigit()


def test_the_server_never_runs_as_root(postgres_cluster: PostgresCluster) -> None:
    pid = postgres_cluster.pid
    assert pid is not None
    status = Path(f"/proc/{pid}/status").read_text()
    uids = [int(v) for v in status.split("\nUid:", 1)[1].split("\n", 1)[0].split()]
    expected = pwd.getpwnam(UNPRIVILEGED_USER).pw_uid if os.geteuid() == 0 else os.geteuid()
    assert expected != 0
    assert uids == [expected] * 4  # real, effective, saved and filesystem
    assert "postgres" in Path(f"/proc/{pid}/cmdline").read_text()


def test_two_claimers_with_skip_locked_never_take_the_same_row(postgres_url: str) -> None:
    rows = 300
    with connect(postgres_url) as conn:
        conn.execute(b"CREATE TABLE claims (id int PRIMARY KEY, claimed_by text)")
        conn.execute(b"INSERT INTO claims SELECT g, NULL FROM generate_series(1, %d) AS g" % rows)

    # The rule itself, step by step: a row locked by an open claim is skipped by the other, not waited on.
    with connect(postgres_url, autocommit=False) as first, connect(postgres_url, autocommit=False) as second:
        claim = b"SELECT id FROM claims ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED"
        assert scalar(first, claim.decode()) == 1
        assert scalar(second, claim.decode()) == 2
        first.rollback()
        second.rollback()

    claimed: dict[str, list[int]] = {"a": [], "b": []}
    start = threading.Barrier(2)
    errors: list[BaseException] = []

    def claimer(name: str) -> None:
        try:
            with connect(postgres_url, autocommit=False) as conn:
                start.wait(timeout=30)
                while True:
                    row = conn.execute(
                        b"SELECT id FROM claims WHERE claimed_by IS NULL ORDER BY id LIMIT 1 "
                        b"FOR UPDATE SKIP LOCKED"
                    ).fetchone()
                    if row is None:
                        conn.rollback()
                        return
                    conn.execute(b"UPDATE claims SET claimed_by = %s WHERE id = %s", (name, row[0]))
                    conn.commit()
                    claimed[name].append(int(row[0]))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=claimer, args=(name,)) for name in claimed]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors
    # Both took rows (about half each): the claims did run side by side, not one after the other.
    assert claimed["a"] and claimed["b"]
    assert not set(claimed["a"]) & set(claimed["b"])
    assert sorted(claimed["a"] + claimed["b"]) == list(range(1, rows + 1))
    with connect(postgres_url) as conn:
        by = dict(conn.execute(b"SELECT claimed_by, count(*) FROM claims GROUP BY claimed_by").fetchall())
    assert by == {name: len(ids) for name, ids in claimed.items() if ids}


def test_a_restart_keeps_the_data_and_drops_the_connections(
    postgres_cluster: PostgresCluster, postgres_url: str
) -> None:
    with connect(postgres_url) as conn:
        conn.execute(b"CREATE TABLE kept (n int)")
        conn.execute(b"INSERT INTO kept VALUES (42)")
    before = postgres_cluster.pid
    with connect(postgres_url) as old:
        postgres_cluster.restart()
        with pytest.raises(psycopg.OperationalError):
            old.execute(b"SELECT 1")
    assert postgres_cluster.pid not in (None, before)
    with connect(postgres_url) as conn:
        assert scalar(conn, "SELECT n FROM kept") == 42


def test_a_stopped_server_refuses_connections_until_started_again(
    postgres_cluster: PostgresCluster, postgres_url: str
) -> None:
    with connect(postgres_url) as conn:
        conn.execute(b"CREATE TABLE kept (n int)")
        conn.execute(b"INSERT INTO kept VALUES (7)")
    postgres_cluster.stop()
    try:
        assert postgres_cluster.pid is None
        with pytest.raises(psycopg.OperationalError), connect(postgres_url):
            pass
    finally:
        postgres_cluster.start_again()
    with connect(postgres_url) as conn:
        assert scalar(conn, "SELECT n FROM kept") == 7


def test_a_cluster_of_its_own_is_destroyed_with_its_directory() -> None:
    with PostgresCluster.start(settings={"max_connections": "20"}) as cluster:
        root, pid = cluster.root, cluster.pid
        assert pid is not None and root.is_dir()
        with connect(cluster.create_database("own")) as conn:
            assert scalar(conn, "SHOW max_connections") == "20"
    assert not root.exists()
    assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
    cluster.destroy()  # idempotent


def test_a_directory_the_server_user_cannot_enter_is_refused_up_front() -> None:
    nobody = pwd.getpwnam(UNPRIVILEGED_USER)
    server_user = _RunAs(nobody.pw_uid, nobody.pw_gid)
    # Not under tmp_path: pytest's temp dir is 0700 itself when the tests run as root.
    with tempfile.TemporaryDirectory(prefix="tpuctl-test-pg-") as base:
        Path(base).chmod(0o755)
        _check_refusals(Path(base) / "private", server_user)


def _check_refusals(private: Path, server_user: _RunAs) -> None:
    private.mkdir(mode=0o700)
    open_dir = private / "open"
    open_dir.mkdir(mode=0o755)
    for directory in (private, open_dir):  # a 0700 directory anywhere above is as closed as the directory
        with pytest.raises(PostgresError, match=f"{UNPRIVILEGED_USER}\\) cannot enter {private}"):
            _check_reachable(directory, server_user)
    private.chmod(0o711)
    _check_reachable(open_dir, server_user)
    private.chmod(0o700)
    if os.geteuid() == 0:  # only root hands the cluster to another user, and checks before initdb
        with pytest.raises(PostgresError, match="cannot enter"):
            PostgresCluster.start(base_dir=private)
        assert list(private.iterdir()) == [open_dir]


def make_programs(directory: Path, names: tuple[str, ...] = ("initdb", "pg_ctl", "postgres")) -> Path:
    directory.mkdir(parents=True)
    for name in names:
        program = directory / name
        program.write_text("#!/bin/sh\n")
        program.chmod(0o755)
    return directory


def test_the_programs_are_found_on_path_first_then_in_debians_directory(tmp_path: Path) -> None:
    on_path = make_programs(tmp_path / "path-bin")
    debian = tmp_path / "usr-lib-postgresql"
    make_programs(debian / "9" / "bin")
    make_programs(debian / "15" / "bin")
    make_programs(debian / "16" / "bin", ("initdb", "pg_ctl"))  # a client-only install: no server
    glob = f"{debian}/*/bin"
    assert find_postgres_bin(path=str(on_path), debian_glob=glob) == on_path
    assert find_postgres_bin(path=str(tmp_path / "nothing"), debian_glob=glob) == debian / "15" / "bin"
    linked = tmp_path / "links"
    linked.mkdir()
    for name in ("initdb", "pg_ctl", "postgres"):
        (linked / name).symlink_to(debian / "9" / "bin" / name)
    assert find_postgres_bin(path=str(linked), debian_glob=glob) in (linked, debian / "9" / "bin")


def test_missing_programs_say_how_to_install_them(tmp_path: Path) -> None:
    with pytest.raises(PostgresMissingError) as info:
        find_postgres_bin(path=str(tmp_path), debian_glob=f"{tmp_path}/none/*/bin")
    message = str(info.value)
    assert "apt-get install -y postgresql" in message
    assert "/usr/lib/postgresql/15/bin" in message


def test_the_machines_installation_is_found() -> None:
    """Where the suite runs, the server programs are there (.ci/run installs them): never a skip."""
    found = find_postgres_bin()
    assert all((found / name).exists() for name in ("initdb", "pg_ctl", "postgres"))
