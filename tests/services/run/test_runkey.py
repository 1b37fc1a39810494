"""The run's SSH key: a fresh key pair for a run that creates its slices, the state dir's for a run on
the user's own ``--pod``; in the ledger only encrypted, and read back only with the team's key (another
key is refused, naming the setting to change)."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

import pytest

from tpuctl.errors import SecretKeyError
from tpuctl.hosts.ssh import ensure_key_pair
from tpuctl.services.run.runkey import load_run_key, secret_key, store_run_key
from tpuctl.settings import Settings, load_settings
from tpuctl.store.ledger import Ledger
from tpuctl.store.secrets import SECRET_KEY_ENV, generate_key

if TYPE_CHECKING:
    from tpuctl.services.run.model import PreparedRun
    from tpuctl.services.session import Session

RUN_ID = "run-20260921-141320-ab16"


@dataclass
class LedgerAndSettings:
    """What the run key uses of a session: its ledger, settings and state dir (no cloud)."""

    ledger: Ledger
    settings: Settings
    state_dir: Path


@dataclass(frozen=True)
class _Target:
    creates: bool


@dataclass(frozen=True)
class _Prepared:
    """What ``store_run_key`` reads of a prepared run."""

    run_id: str
    target: _Target


@pytest.fixture
def ledger_dir(tmp_path: Path) -> Path:
    return tmp_path / "shared"


@pytest.fixture
def ledger(ledger_dir: Path) -> Iterator[Ledger]:
    with Ledger(ledger_dir) as ledger:
        ledger.create_run(RUN_ID, script="train.py")
        yield ledger


def _session(ledger: Ledger, state_dir: Path, monkeypatch: pytest.MonkeyPatch, key: bytes) -> Session:
    monkeypatch.setenv(SECRET_KEY_ENV, key.decode("ascii"))
    monkeypatch.setenv("TPUCTL_STATE_DIR", str(state_dir))
    return cast("Session", LedgerAndSettings(ledger, load_settings(), state_dir))


def _prepared(*, creates: bool) -> PreparedRun:
    return cast("PreparedRun", _Prepared(RUN_ID, _Target(creates)))


def test_a_run_that_creates_its_slices_gets_a_fresh_key_readable_from_another_state_dir(
    ledger: Ledger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    team_key = generate_key()
    one = _session(ledger, tmp_path / "one", monkeypatch, team_key)
    made = store_run_key(one, _prepared(creates=True))
    assert made.public_openssh.startswith("ssh-ed25519 ")
    assert made.public_openssh != ensure_key_pair(tmp_path / "one").public_openssh
    assert made.private_path is None  # in memory only: no file of the run holds it

    loaded = load_run_key(_session(ledger, tmp_path / "two", monkeypatch, team_key), RUN_ID)
    assert loaded.public_openssh == made.public_openssh
    assert loaded.private_bytes() == made.private_bytes()
    assert not (tmp_path / "two" / "ssh").exists()  # machine two made no key of its own
    assert "PRIVATE KEY" not in repr(loaded)


def test_a_run_on_the_users_pod_takes_the_state_dirs_key_pair(
    ledger: Ledger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    team_key = generate_key()
    one = _session(ledger, tmp_path / "one", monkeypatch, team_key)
    store_run_key(one, _prepared(creates=False))
    state_key = ensure_key_pair(tmp_path / "one")
    loaded = load_run_key(_session(ledger, tmp_path / "two", monkeypatch, team_key), RUN_ID)
    assert loaded.public_openssh.split()[:2] == state_key.public_openssh.split()[:2]
    assert loaded.private_bytes() == state_key.private_bytes()


def test_the_ledger_files_hold_the_private_key_only_encrypted(
    ledger: Ledger, ledger_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = _session(ledger, tmp_path / "one", monkeypatch, generate_key())
    made = store_run_key(session, _prepared(creates=True))
    private = made.private_bytes()
    body = b"".join(line for line in private.splitlines() if not line.startswith(b"-----"))
    # The file and its write-ahead log, whatever SQLite has not checkpointed yet.
    stored = b"".join(p.read_bytes() for p in ledger_dir.rglob("*") if p.is_file())
    assert ledger.get_secret(RUN_ID, "ssh_key", secret_key(session.settings)) == private
    assert b"PRIVATE KEY" not in stored
    for line in private.splitlines()[1:-1]:
        assert line not in stored
    assert base64.b64decode(body) not in stored


def test_another_secret_key_is_refused_naming_the_setting(
    ledger: Ledger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store_run_key(_session(ledger, tmp_path / "one", monkeypatch, generate_key()), _prepared(creates=True))
    with pytest.raises(SecretKeyError) as info:
        load_run_key(_session(ledger, tmp_path / "two", monkeypatch, generate_key()), RUN_ID)
    error = info.value
    assert SECRET_KEY_ENV in error.message and RUN_ID in error.message
    assert error.fix is not None and SECRET_KEY_ENV in error.fix


def test_a_run_recorded_without_a_key_uses_the_state_dirs(
    ledger: Ledger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded = load_run_key(_session(ledger, tmp_path / "one", monkeypatch, generate_key()), RUN_ID)
    assert loaded == ensure_key_pair(tmp_path / "one")
