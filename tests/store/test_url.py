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
        ("postgresql://team-db/tpuctl", "not supported yet", "SQLite"),
        ("postgresql+psycopg://team-db/tpuctl", "not supported yet", "SQLite"),
        ("postgres://team-db/tpuctl", "not supported yet", "SQLite"),
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


def test_a_password_in_a_server_url_is_never_repeated() -> None:
    with pytest.raises(ParamError) as info:
        parse_database_url("postgresql://alice:hunter2@team-db/tpuctl")
    assert "hunter2" not in str(info.value) and "hunter2" not in str(info.value.value)
    assert "alice:***@team-db" in info.value.message
