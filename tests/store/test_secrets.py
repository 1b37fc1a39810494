"""A run's secrets: stored only encrypted, the key outside the database (a private file or
TPUCTL_SECRET_KEY), and a wrong key named for what to change."""

from __future__ import annotations

import secrets
import sqlite3
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tpuctl.errors import SecretKeyError
from tpuctl.params import ParamError
from tpuctl.store import Ledger
from tpuctl.store.secrets import (
    SECRET_KEY_ENV,
    SecretKey,
    generate_key,
    key_from_env,
    load_secret_key,
    parse_secret_key,
)

RUN = "r-secret"


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    with Ledger(tmp_path / "state") as opened:
        opened.create_run(RUN, script="train.py")
        yield opened


def private_key_text() -> bytes:
    """Something shaped like the per-run SSH key, unique to the test so a search for it means something."""
    return (
        b"-----BEGIN OPENSSH PRIVATE KEY-----\n"
        + secrets.token_hex(48).encode()
        + b"\n-----END OPENSSH PRIVATE KEY-----\n"
    )


def test_a_secret_is_never_in_the_database_files_in_plain_text(ledger: Ledger, tmp_path: Path) -> None:
    key = load_secret_key(env_key=None, key_file=tmp_path / "state" / "secret.key")
    plaintext = private_key_text()
    ledger.put_secret(RUN, "ssh_private_key", plaintext, key)
    assert ledger.get_secret(RUN, "ssh_private_key", key) == plaintext
    distinctive = plaintext.splitlines()[1]
    for suffix in ("", "-wal"):  # before the checkpoint the write is in the WAL
        data = Path(f"{ledger.path}{suffix}").read_bytes()
        assert distinctive not in data and plaintext not in data
    with sqlite3.connect(ledger.path) as raw:
        raw.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        dumped = "\n".join(raw.iterdump()).encode()
    assert distinctive not in Path(ledger.path).read_bytes() and distinctive not in dumped
    assert key.key not in Path(ledger.path).read_bytes()  # nor the key


def test_a_secret_read_with_another_key_names_the_setting(ledger: Ledger, tmp_path: Path) -> None:
    ours = load_secret_key(env_key=None, key_file=tmp_path / "ours.key")
    ledger.put_secret(RUN, "ssh_private_key", b"secret", ours)
    theirs = key_from_env(generate_key().decode())
    with pytest.raises(SecretKeyError) as info:
        ledger.get_secret(RUN, "ssh_private_key", theirs)
    err = info.value
    assert f"the secret 'ssh_private_key' of run {RUN}" in err.message
    assert "TPUCTL_SECRET_KEY" in err.message and ours.key_id in err.message
    assert "TPUCTL_SECRET_KEY" in (err.fix or "") and "secret_key_file" in (err.fix or "")
    assert ledger.get_secret(RUN, "missing", ours) is None


def test_an_altered_ciphertext_is_refused(ledger: Ledger) -> None:
    key = SecretKey(generate_key(), "test")
    ledger.put_secret(RUN, "token", b"secret", key)
    with sqlite3.connect(ledger.path) as raw:
        (ciphertext,) = raw.execute("SELECT ciphertext FROM run_secrets").fetchone()
        raw.execute("UPDATE run_secrets SET ciphertext = ?", (ciphertext[:-2] + b"AA",))
    with pytest.raises(SecretKeyError, match="altered"):
        ledger.get_secret(RUN, "token", key)


def test_the_key_file_is_made_once_private_and_then_kept(tmp_path: Path) -> None:
    path = tmp_path / "state" / "secret.key"
    first = load_secret_key(env_key=None, key_file=path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert first.source == f"secret_key_file {path}"
    assert load_secret_key(env_key=None, key_file=path).key == first.key
    assert first.key.decode() not in repr(first)
    assert [p.name for p in path.parent.iterdir()] == ["secret.key"]  # no temporary file left


def test_commands_creating_the_key_at_once_end_with_one_key(tmp_path: Path) -> None:
    path = tmp_path / "secret.key"
    keys: list[bytes] = []
    start = threading.Barrier(6)

    def load() -> None:
        start.wait(10)
        keys.append(load_secret_key(env_key=None, key_file=path).key)

    threads = [threading.Thread(target=load) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(keys) == 6 and len(set(keys)) == 1


def test_the_environment_key_wins_over_the_file(tmp_path: Path) -> None:
    env_key = generate_key().decode()
    key = load_secret_key(env_key=env_key, key_file=tmp_path / "never.key")
    assert key.key == env_key.encode() and key.source == SECRET_KEY_ENV
    assert not (tmp_path / "never.key").exists()


# A fixed truncated key (not a fresh one): xdist workers must collect the same test ids.
_TRUNCATED = "3iUG0HkQFpRsfkrlFBEGi_JFWzPmIMYfaeRXo7"


@pytest.mark.parametrize(
    "bad", ["", "short", "a" * 44, _TRUNCATED], ids=["empty", "short", "44a", "truncated"]
)
def test_a_malformed_key_is_refused_without_repeating_it(bad: str) -> None:
    with pytest.raises(ParamError) as info:
        parse_secret_key(bad, SECRET_KEY_ENV)
    assert info.value.exit_code == 2 and "Fernet.generate_key" in (info.value.fix or "")
    if bad:
        assert bad not in str(info.value)


def test_a_key_file_without_a_key_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "secret.key"
    path.write_text("not a key\n")
    with pytest.raises(SecretKeyError) as info:
        load_secret_key(env_key=None, key_file=path)
    assert str(path) in info.value.message and "secret_key_file" in (info.value.fix or "")
