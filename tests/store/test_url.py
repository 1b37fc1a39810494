"""The ledger's URL: what is accepted, and what is refused with the value and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpuctl.params import ParamError
from tpuctl.store.url import (
    DatabaseUrl,
    default_database_url,
    parse_database_url,
    sqlite_url,
)
from tpuctl.testing.cli import Cli


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ("sqlite:////var/lib/tpuctl/ledger.db", "/var/lib/tpuctl/ledger.db"),
        ("  sqlite:////a b/ledger.db ", "/a b/ledger.db"),  # spaces around are the shell's, inside are not
        ("SQLITE:////x.db", "/x.db"),  # the scheme is case-insensitive, as in every URL
    ],
)
def test_an_absolute_sqlite_url_is_taken(text: str, path: str) -> None:
    url = parse_database_url(text)
    assert url == DatabaseUrl("sqlite", Path(path))
    assert url.text == f"sqlite:///{path}"
    assert parse_database_url(url.text) == url  # the text parses back to the same URL
    assert parse_database_url(url) is url


def test_the_default_is_the_state_dirs_ledger(tmp_path: Path) -> None:
    url = default_database_url(tmp_path / "state")
    assert url.path == tmp_path / "state" / "ledger.db"
    assert url.text == f"sqlite:///{tmp_path}/state/ledger.db"
    assert sqlite_url(tmp_path / "x.db").path == tmp_path / "x.db"


@pytest.mark.parametrize(
    ("text", "in_message", "in_fix"),
    [
        ("sqlite:///ledger.db", "relative path", "sqlite:////"),
        ("sqlite:///~/ledger.db", "relative path", str(Path.home() / "ledger.db")),
        ("sqlite://host/ledger.db", "names a host", "four slashes"),
        ("sqlite:///", "names no file", "sqlite:////ABSOLUTE"),
        ("sqlite:////x.db?mode=ro", "query parameters", "sqlite:////x.db"),
        ("mysql://db/ledger", "unknown scheme 'mysql'", "sqlite:////"),
        ("/var/ledger.db", "is not a URL", "sqlite:////var/ledger.db"),
        ("postgresql://team-db", "names no database", "postgresql://USER"),
        ("postgresql://team-db/", "names no database", "/DATABASE"),
        ("postgresql://team-db/a/b", "names no database", "/DATABASE"),
        ("postgresql:///tpuctl", "names no host", "@HOST"),
        ("postgresql://alice@/tpuctl", "names no host", "@HOST"),
        ("postgresql://team-db:port/tpuctl", "not a number from 1 to 65535", "[:PORT]"),
        ("postgresql://team-db:70000/tpuctl", "not a number from 1 to 65535", "[:PORT]"),
        ("postgresql://team-db:0/tpuctl", "not a number from 1 to 65535", "[:PORT]"),
        ("postgresql://team-db/tpuctl#x", "fragment", "drop it"),
        ("postgresql://team-db/tpuctl?sslmode", "NAME=VALUE", "postgresql://"),
        ("postgresql+psycopg2://team-db/tpuctl", "driver 'psycopg2'", "postgresql://"),
        ("postgresql+asyncpg://team-db/tpuctl", "psycopg 3 only", "postgresql+psycopg://"),
    ],
)
def test_a_bad_url_names_the_value_and_the_fix(text: str, in_message: str, in_fix: str) -> None:
    with pytest.raises(ParamError) as info:
        parse_database_url(text)
    err = info.value
    assert err.exit_code == 2
    assert in_message in err.message
    assert in_fix in (err.fix or "")
    assert err.message.startswith("--database ")  # names the flag where the value came from
    assert err.for_source("TPUCTL_DATABASE_URL").message.startswith("TPUCTL_DATABASE_URL ")


@pytest.mark.parametrize(
    "text",
    [
        "postgresql://alice:hunter2@team-db/tpuctl#frag",  # refused for the fragment
        "postgresql://alice:hunter2@team-db:99999/tpuctl",  # ... for the port
        "postgresql+asyncpg://alice:hunter2@team-db/tpuctl",  # ... for the driver
        "mysql://alice:hunter2@team-db/tpuctl",  # ... for the scheme
        "postgresql://alice:hunter2@team-db/",  # ... for the missing database
        "sqlite://alice:hunter2@team-db/ledger.db",  # ... for a host where a file belongs
    ],
)
def test_a_password_in_a_refused_url_is_never_repeated(text: str) -> None:
    with pytest.raises(ParamError) as info:
        parse_database_url(text)
    err = info.value
    assert "hunter2" not in f"{err} {err.message} {err.value} {err.fix}"
    assert "alice:***@team-db" in err.message


def test_a_password_in_the_query_is_refused_without_repeating_it() -> None:
    with pytest.raises(ParamError) as info:
        parse_database_url("postgresql://alice@team-db/tpuctl?password=hunter2")
    assert "among the query parameters" in info.value.message
    assert "PGPASSWORD" in (info.value.fix or "")


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("postgresql://team-db/tpuctl", "postgresql://team-db/tpuctl"),
        ("postgres://team-db/tpuctl", "postgresql://team-db/tpuctl"),
        ("POSTGRESQL+PSYCOPG://alice@Team-DB:6543/tpuctl", "postgresql://alice@team-db:6543/tpuctl"),
        ("postgresql://alice@[::1]:5432/tpuctl", "postgresql://alice@[::1]:5432/tpuctl"),
        (
            "postgresql://alice@team-db/tpuctl?sslmode=require&application_name=ci",
            "postgresql://alice@team-db/tpuctl?sslmode=require&application_name=ci",
        ),
    ],
)
def test_a_postgresql_url_is_taken(text: str, shown: str) -> None:
    url = parse_database_url(text)
    assert url.scheme == "postgresql" and url.path is None
    assert url.text == shown == str(url)
    assert url.secret_url == shown.replace("postgresql://", "postgresql+psycopg://", 1)
    assert parse_database_url(url.text) == url  # with no password, the text parses back to the same URL
    assert parse_database_url(url.secret_url) == url


def test_a_postgresql_urls_parts() -> None:
    url = parse_database_url(
        "postgresql://ci%40team:p%40ss%2Fw:rd@db.internal:6432/tpu%20ledger?sslmode=verify-full"
    )
    assert (url.host, url.port, url.database) == ("db.internal", 6432, "tpu ledger")
    assert (url.username, url.password) == ("ci@team", "p@ss/w:rd")
    assert url.query == (("sslmode", "verify-full"),)


def test_the_password_is_shown_as_stars_and_kept_for_the_engine_only() -> None:
    url = parse_database_url("postgresql://alice:hunter2%21@team-db:5432/tpuctl?sslmode=require")
    for shown in (url.text, str(url), repr(url), f"{url}", f"{url!r}", f"{[url]}"):
        assert "hunter2" not in shown
        assert "alice:***@team-db:5432/tpuctl" in shown
    assert url.password == "hunter2!"
    assert url.secret_url == "postgresql+psycopg://alice:hunter2%21@team-db:5432/tpuctl?sslmode=require"
    assert parse_database_url(url.secret_url) == url  # the secret form parses back, password and all
    # Two URLs that differ only in their password are different databases' credentials.
    assert parse_database_url("postgresql://alice:other@team-db:5432/tpuctl?sslmode=require") != url


def test_a_postgresql_ledger_has_no_file_and_says_so_without_the_password() -> None:
    from tpuctl.errors import UsageError
    from tpuctl.store.ledger import ledger_file

    url = parse_database_url("postgresql://alice:hunter2@team-db/tpuctl")
    with pytest.raises(UsageError) as info:
        ledger_file(url)
    err = info.value
    assert err.exit_code == 2 and "is a database, not a file" in err.message
    assert "postgresql://alice:***@team-db/tpuctl" in err.message
    assert "hunter2" not in f"{err} {err.value} {err.fix}"


@pytest.mark.parametrize(
    "command", [("runs", "list"), ("cost", "report"), ("cost", "report", "--no-reconcile")]
)
def test_an_unreachable_postgresql_ledger_is_named_without_the_password(
    cli: Cli, command: tuple[str, ...]
) -> None:
    done = cli("--database", "postgresql://alice:hunter2@127.0.0.1:9/tpuctl?connect_timeout=2", *command)
    assert done.code == 1, done.output
    assert "cannot be reached" in done.output and "database server is up" in done.output
    assert "alice:***@127.0.0.1:9/tpuctl" in done.output
    assert "hunter2" not in done.output
