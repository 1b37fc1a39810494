"""The run bundle: ignore rules, the runtime, the size limit, symlinks, the content hash, and the per-host
cache that keeps an unchanged bundle from being shipped again."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from tpuctl.errors import EXIT_USAGE
from tpuctl.hosts.bundle import COMPLETE_MARKER, BundleError, build_bundle


def _write(root: Path, rel: str, text: str = "x") -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _user_paths(workdir: Path) -> set[str]:
    return {f.path for f in build_bundle(workdir).user_files}


def test_gitignore_and_tpuctlignore_rules_follow_git_semantics(tmp_path: Path) -> None:
    w = tmp_path / "proj"
    for rel in (
        "train.py",
        "model/net.py",
        "run.log",
        "keep.log",
        "data/big.bin",
        "sub/a.tmp",
        "sub/b.py",
        "notes/secret.txt",
        "build/out.o",
        ".git/HEAD",
        "pkg/__pycache__/m.cpython-311.pyc",
        "pkg/m.py",
        "tpuctl/runtime/fake.py",  # the runtime's paths are not the user's to take
    ):
        _write(w, rel)
    _write(w, ".gitignore", "*.log\n!keep.log\ndata/\n/build\nnotes/\n")
    _write(w, "sub/.gitignore", "*.tmp\n")
    # .tpuctlignore comes after .gitignore in the same directory: it can re-include what git ignores.
    _write(w, ".tpuctlignore", "!notes/\nmodel/\n")

    assert _user_paths(w) == {
        ".gitignore",
        ".tpuctlignore",
        "train.py",
        "keep.log",
        "sub/.gitignore",
        "sub/b.py",
        "notes/secret.txt",
        "pkg/m.py",
    }


def test_nested_ignore_file_overrides_its_parent(tmp_path: Path) -> None:
    w = tmp_path / "proj"
    _write(w, ".gitignore", "*.csv\n")
    _write(w, "a.csv")
    _write(w, "keep/b.csv")
    _write(w, "keep/.gitignore", "!*.csv\n")
    assert _user_paths(w) == {".gitignore", "keep/.gitignore", "keep/b.csv"}


def test_bundle_carries_the_runtime_and_only_its_python_files(tmp_path: Path) -> None:
    w = tmp_path / "proj"
    _write(w, "train.py", "print(1)\n")
    bundle = build_bundle(w)
    runtime = {f.path for f in bundle.files if f.path.startswith("tpuctl/")}
    assert {
        "tpuctl/__init__.py",
        "tpuctl/runtime/__init__.py",
        "tpuctl/runtime/hostenv.py",
        "tpuctl/runtime/_sitecustomize/sitecustomize.py",
        "tpuctl/runtime/examples/lm_train.py",
    } <= runtime
    assert all(p.endswith(".py") for p in runtime)
    # Nothing of the control plane goes to the hosts.
    assert not any(p.startswith(("tpuctl/cli/", "tpuctl/services/", "tpuctl/sim/")) for p in runtime)
    # The runtime alone (--example) is a bundle too.
    assert build_bundle(None).user_files == ()


def test_size_limit_error_names_size_limit_largest_file_and_fix(tmp_path: Path) -> None:
    w = tmp_path / "proj"
    _write(w, "train.py")
    (w / "weights.bin").write_bytes(b"\0" * 300_000)
    limit = build_bundle(None).total_bytes + 100_000
    with pytest.raises(BundleError) as info:
        build_bundle(w, limit_bytes=limit)
    err = info.value
    assert err.exit_code == EXIT_USAGE
    total = 300_000 + 1 + build_bundle(None).total_bytes
    assert f"({total} bytes)" in err.message
    assert "over the" in err.message and "KiB limit" in err.message
    assert "weights.bin (293.0 KiB)" in err.message
    assert err.fix is not None and ".tpuctlignore" in err.fix
    # The fix works.
    _write(w, ".tpuctlignore", "*.bin\n")
    assert "weights.bin" not in {f.path for f in build_bundle(w, limit_bytes=limit).files}


def test_symlink_escaping_the_workdir_is_refused_naming_it(tmp_path: Path) -> None:
    w = tmp_path / "proj"
    _write(w, "train.py")
    outside = _write(tmp_path, "elsewhere/creds.txt", "secret")
    (w / "creds").symlink_to(outside)
    with pytest.raises(BundleError) as info:
        build_bundle(w)
    assert info.value.exit_code == EXIT_USAGE
    assert "symlink creds points outside the working directory" in info.value.message
    assert str(outside) in info.value.message
    # Relative escapes and dangling links too.
    (w / "creds").unlink()
    (w / "up").symlink_to("../elsewhere/creds.txt")
    with pytest.raises(BundleError, match="symlink up points outside"):
        build_bundle(w)
    (w / "up").unlink()
    (w / "dangling").symlink_to("nowhere.txt")
    with pytest.raises(BundleError, match=r"symlink dangling points to 'nowhere\.txt', which does not exist"):
        build_bundle(w)
    # An ignored link is never looked at.
    _write(w, ".tpuctlignore", "dangling\n")
    assert "dangling" not in _user_paths(w)


def test_symlink_to_a_file_inside_ships_its_content(tmp_path: Path) -> None:
    w = tmp_path / "proj"
    _write(w, "configs/base.yaml", "lr: 1\n")
    (w / "config.yaml").symlink_to("configs/base.yaml")
    bundle = build_bundle(w)
    link = next(f for f in bundle.files if f.path == "config.yaml")
    assert link.source == (w / "configs/base.yaml").resolve()
    (w / "linkdir").symlink_to("configs", target_is_directory=True)
    with pytest.raises(BundleError, match="symlink linkdir is a symlinked directory"):
        build_bundle(w)


def test_digest_depends_on_paths_contents_and_mode_only(tmp_path: Path) -> None:
    w = tmp_path / "proj"
    script = _write(w, "train.py", "print(1)\n")
    first = build_bundle(w).digest
    assert build_bundle(w).digest == first
    os.utime(script, (1, 1))  # a touch is not a change
    assert build_bundle(w).digest == first
    script.write_text("print(2)\n")
    changed = build_bundle(w).digest
    assert changed != first
    script.write_text("print(1)\n")
    assert build_bundle(w).digest == first
    script.rename(w / "main.py")
    assert build_bundle(w).digest != first
    (w / "main.py").chmod(0o755)
    assert build_bundle(w).digest not in (first, changed)


def test_tar_is_deterministic_and_holds_the_marker_last(tmp_path: Path) -> None:
    w = tmp_path / "proj"
    _write(w, "train.py", "print(1)\n")
    bundle = build_bundle(w)
    data = bundle.tar_gz()
    assert data == bundle.tar_gz()
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        names = tar.getnames()
        marker = tar.extractfile(COMPLETE_MARKER)
        assert marker is not None and marker.read().decode().strip() == bundle.digest
    assert names[-1] == COMPLETE_MARKER
    assert set(names[:-1]) == {f.path for f in bundle.files}


def test_tpuctls_state_dir_inside_the_workdir_is_never_shipped(tmp_path: Path) -> None:
    # A state dir below the workdir (TPUCTL_STATE_DIR=./state): its ledger, keys and live SQLite files
    # are no program's files.
    work = tmp_path / "proj"
    (work / "state" / "tpuctl" / "ssh").mkdir(parents=True)
    (work / "state" / "tpuctl" / "ledger.db").write_bytes(b"SQLite format 3\x00")
    (work / "state" / "tpuctl" / "ssh" / "tpuctl_ed25519").write_text("PRIVATE KEY")
    (work / "train.py").write_text("print('hi')\n")
    (work / "data").mkdir()
    (work / "data" / "state.txt").write_text("kept: only the state dir itself is excluded\n")
    bundle = build_bundle(work, exclude=(work / "state" / "tpuctl",))
    paths = {f.path for f in bundle.files}
    assert "train.py" in paths and "data/state.txt" in paths
    assert not [p for p in paths if p.startswith("state/tpuctl/")]
