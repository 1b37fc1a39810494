"""Private directories/files and atomic writes."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from tpuctl.store.paths import (
    StatePermissionError,
    atomic_write_json,
    atomic_write_text,
    ensure_private_dir,
    private_file,
)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def loose_umask() -> Iterator[None]:
    # The helpers must not depend on the caller's umask; 000 is the worst case (everything world-writable).
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def test_ensure_private_dir_creates_0700_with_parents(tmp_path: Path, loose_umask: None) -> None:
    target = tmp_path / "a" / "b" / "state"
    assert ensure_private_dir(target) == target
    assert target.is_dir()
    assert mode(target) == 0o700


def test_ensure_private_dir_tightens_an_existing_loose_dir(tmp_path: Path) -> None:
    target = tmp_path / "state"
    target.mkdir()
    target.chmod(0o755)
    (target / "keep.txt").write_text("x")
    ensure_private_dir(target)
    assert mode(target) == 0o700
    assert (target / "keep.txt").read_text() == "x"


def test_ensure_private_dir_expands_user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert ensure_private_dir("~/st") == tmp_path / "st"


def test_ensure_private_dir_refuses_a_file(tmp_path: Path) -> None:
    target = tmp_path / "state"
    target.write_text("not a dir")
    with pytest.raises(StatePermissionError, match="not a directory"):
        ensure_private_dir(target)


def test_private_file_creates_0600_and_tightens(tmp_path: Path, loose_umask: None) -> None:
    new = private_file(tmp_path / "new")
    assert new.read_text() == "" and mode(new) == 0o600
    old = tmp_path / "old"
    old.write_text("content")
    old.chmod(0o644)
    private_file(old)
    assert mode(old) == 0o600
    assert old.read_text() == "content"  # tightening never truncates


def test_atomic_write_text_replaces_and_is_private(tmp_path: Path, loose_umask: None) -> None:
    target = tmp_path / "f.txt"
    target.write_text("old")
    target.chmod(0o644)
    atomic_write_text(target, "new ✓")
    assert target.read_text(encoding="utf-8") == "new ✓"
    assert mode(target) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.txt"]  # no temp file left


def test_atomic_write_text_mode_is_overridable(tmp_path: Path) -> None:
    target = atomic_write_text(tmp_path / "pub", "x", mode=0o644)
    assert mode(target) == 0o644


def test_atomic_write_failure_keeps_old_content_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "f.txt"
    target.write_text("old")
    with pytest.raises(UnicodeEncodeError):
        atomic_write_text(target, "\udcff", encoding="utf-8")  # a lone surrogate cannot be encoded
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.txt"]


def test_atomic_write_json_sorted_round_trip(tmp_path: Path) -> None:
    target = atomic_write_json(tmp_path / "d.json", {"b": 1, "a": [1, 2], "é": "ü"})
    text = target.read_text(encoding="utf-8")
    assert text.endswith("\n")
    assert text.index('"a"') < text.index('"b"')
    assert json.loads(text) == {"a": [1, 2], "b": 1, "é": "ü"}
    assert mode(target) == 0o600
