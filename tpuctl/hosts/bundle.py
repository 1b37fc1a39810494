"""The run bundle: what ``tpuctl run`` ships to every host of a slice.

A bundle is the user's working directory (the script's directory, or ``--workdir``) minus what its
``.gitignore`` / ``.tpuctlignore`` files exclude, plus tpuctl's host runtime (``tpuctl/__init__.py`` and
``tpuctl/runtime/``) so that ``import tpuctl.runtime`` and the simulator's ``jax.distributed`` hook work on
the host without installing tpuctl there.

Rules, each enforced here so every executor gets the same guarantees:

- Ignore files use git's wildmatch semantics (``pathspec``'s ``GitIgnoreSpec``). Nested ones apply to
  their directory, deeper files win, and in one directory ``.tpuctlignore`` comes after ``.gitignore`` so
  it can re-include (``!pattern``) what git ignores. An excluded directory is not descended into, as in
  git. ``.git/``, ``__pycache__/`` and ``*.pyc`` are always left out.
- A symlink that resolves outside the workdir (or nowhere) is refused, naming it; a symlink to a file
  inside the workdir ships that file's content under the link's name. Symlinked directories are refused
  (following them could loop or escape).
- The user's own ``tpuctl/`` tree, if any, is not shipped: the runtime's files take those paths.
- A size limit, with an error naming the size, the limit, the largest files and the fix.
- ``digest`` is sha256 over the sorted relative paths and contents, so an unchanged bundle has the same
  digest and an executor's per-host cache can skip shipping it again.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import stat
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from tpuctl.errors import UsageError

#: Default ceiling on a bundle's total size. Hosts download it on every changed run; a bundle that big
#: almost always means a dataset or a virtualenv was picked up by accident.
DEFAULT_LIMIT_BYTES = 64 * 1024 * 1024

IGNORE_FILES = (".gitignore", ".tpuctlignore")
#: Never shipped, whatever the ignore files say.
ALWAYS_EXCLUDED = (".git/", "__pycache__/", "*.pyc")
#: Where the runtime lives inside a bundle; the user's files may not take these paths.
RUNTIME_PREFIX = "tpuctl/"
#: Marker a materialized bundle directory carries once it is complete (its content is the digest).
COMPLETE_MARKER = ".tpuctl-bundle"


class BundleError(UsageError):
    """The working directory cannot be bundled as it is (an escaping symlink, too big, ...)."""

    kind = "bundle"


@dataclass(frozen=True)
class BundleFile:
    """One file of a bundle: its POSIX path inside the bundle and where its bytes come from."""

    path: str
    source: Path
    size: int
    mode: int  # 0o755 for executables, else 0o644


@dataclass(frozen=True)
class Bundle:
    """A validated, hashed set of files; nothing is copied until an executor ships it."""

    workdir: Path | None
    files: tuple[BundleFile, ...]
    digest: str
    total_bytes: int
    limit_bytes: int

    @property
    def short_digest(self) -> str:
        return self.digest[:12]

    @property
    def user_files(self) -> tuple[BundleFile, ...]:
        return tuple(f for f in self.files if not f.path.startswith(RUNTIME_PREFIX))

    def summary(self) -> dict[str, Any]:
        """What --dry-run shows: where it came from, every file with its size, the total and the hash."""
        return {
            "workdir": None if self.workdir is None else str(self.workdir),
            "sha256": self.digest,
            "files": len(self.files),
            "bytes": self.total_bytes,
            "limit_bytes": self.limit_bytes,
            "user_files": [{"path": f.path, "bytes": f.size} for f in self.user_files],
            "runtime_files": sum(1 for f in self.files if f.path.startswith(RUNTIME_PREFIX)),
        }

    def write_to(self, directory: Path) -> None:
        """Materialize the bundle in ``directory`` (which must not exist yet), marker last.

        It lives in the state dir: directories are 0700 and files keep only their owner bits (an
        executable stays executable, nothing is readable by group or others)."""
        from tpuctl.store.paths import ensure_private_dir

        ensure_private_dir(directory.parent)
        directory.mkdir(mode=0o700)
        for f in self.files:
            target = directory / PurePosixPath(f.path)
            for parent in reversed(target.relative_to(directory).parents[:-1]):
                (directory / parent).mkdir(mode=0o700, exist_ok=True)
            with f.source.open("rb") as src, target.open("wb") as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
            target.chmod(f.mode & 0o700)
        marker = directory / COMPLETE_MARKER
        marker.write_text(self.digest + "\n", encoding="ascii")
        marker.chmod(0o600)

    def tar_gz(self) -> bytes:
        """The bundle as a deterministic .tar.gz (fixed mtimes, owners and order) for remote hosts."""
        raw = io.BytesIO()
        # mtime=0 in the gzip header as well, so the same bundle always gives the same bytes.
        with (
            gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz,
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
        ):
            for f in self.files:
                info = tarfile.TarInfo(f.path)
                info.size = f.size
                info.mode = f.mode
                info.mtime = 0
                with f.source.open("rb") as src:
                    tar.addfile(info, src)
            marker = (self.digest + "\n").encode("ascii")
            info = tarfile.TarInfo(COMPLETE_MARKER)
            info.size = len(marker)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(marker))
        return raw.getvalue()


def runtime_root() -> Path:
    """The directory holding the ``tpuctl`` package that this process runs (the runtime's source)."""
    import tpuctl

    return Path(tpuctl.__file__).resolve().parent


def _runtime_files() -> list[tuple[str, Path]]:
    root = runtime_root()
    # The host side of the SSH executor (stdlib only) travels with the runtime: it keeps the program
    # detached from the SSH session on every host.
    out = [
        ("tpuctl/__init__.py", root / "__init__.py"),
        ("tpuctl/hosts/__init__.py", root / "hosts" / "__init__.py"),
        ("tpuctl/hosts/follow.py", root / "hosts" / "follow.py"),
        ("tpuctl/hosts/worker_identity.py", root / "hosts" / "worker_identity.py"),
    ]
    runtime = root / "runtime"
    for dirpath, dirnames, filenames in os.walk(runtime):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if name.endswith(".py"):
                path = Path(dirpath) / name
                out.append(("tpuctl/" + path.relative_to(root).as_posix(), path))
    return out


class _IgnoreRules:
    """The ignore files of a tree, applied git-style: the deepest directory with a matching rule wins."""

    def __init__(self) -> None:
        import pathspec

        self._pathspec = pathspec
        self._always = pathspec.GitIgnoreSpec.from_lines(ALWAYS_EXCLUDED)
        self._by_dir: dict[str, Any] = {}

    def load(self, rel_dir: str, abs_dir: Path) -> None:
        lines: list[str] = []
        for name in IGNORE_FILES:
            path = abs_dir / name
            if path.is_file() and not path.is_symlink():
                lines.extend(path.read_text(encoding="utf-8", errors="replace").splitlines())
        if lines:
            self._by_dir[rel_dir] = self._pathspec.GitIgnoreSpec.from_lines(lines)

    def ignored(self, rel_path: str, *, is_dir: bool) -> bool:
        probe = rel_path + "/" if is_dir else rel_path
        if self._always.match_file(probe):
            return True
        verdict: bool | None = None
        parts = rel_path.split("/")
        # Directories from the root down to the path's own directory; a deeper rule overrides.
        for depth in range(len(parts)):
            base = "/".join(parts[:depth])
            spec = self._by_dir.get(base)
            if spec is None:
                continue
            local = "/".join(parts[depth:]) + ("/" if is_dir else "")
            result = spec.check_file(local)
            if result.include is not None:
                verdict = bool(result.include)
        return bool(verdict)


def _walk_user_files(workdir: Path, excluded: set[Path]) -> Iterator[tuple[str, Path]]:
    """(bundle path, real file) for every file of the workdir that the rules keep, outside ``excluded``."""
    rules = _IgnoreRules()
    root_real = workdir.resolve()
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        abs_dir = workdir / rel_dir if rel_dir else workdir
        rules.load(rel_dir, abs_dir)
        try:
            entries = sorted(os.scandir(abs_dir), key=lambda e: e.name)
        except OSError as exc:
            raise BundleError(
                f"cannot read {abs_dir}: {exc.strerror}",
                field="workdir",
                value=str(abs_dir),
                fix="make it readable, or exclude it in .tpuctlignore",
            ) from None
        subdirs: list[str] = []
        for entry in entries:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            is_link = entry.is_symlink()
            is_dir = entry.is_dir(follow_symlinks=False)
            if rules.ignored(rel, is_dir=is_dir or (is_link and entry.is_dir())):
                continue
            if rel == "tpuctl" or rel.startswith(RUNTIME_PREFIX):
                continue  # the runtime's files take these paths
            if is_link:
                yield rel, _checked_link(Path(entry.path), rel, root_real)
            elif is_dir:
                if Path(entry.path).resolve() not in excluded:
                    subdirs.append(rel)
            elif entry.is_file(follow_symlinks=False):
                yield rel, Path(entry.path)
            # sockets, fifos and devices are not program files: skip them silently
        stack.extend(reversed(subdirs))


def _checked_link(link: Path, rel: str, root_real: Path) -> Path:
    try:
        target = link.resolve(strict=True)
    except (OSError, RuntimeError):
        raise BundleError(
            f"symlink {rel} points to {os.readlink(link)!r}, which does not exist",
            field="workdir",
            value=str(link),
            fix=f"remove the link or add {rel!r} to .tpuctlignore",
        ) from None
    if not target.is_relative_to(root_real):
        raise BundleError(
            f"symlink {rel} points outside the working directory (to {target}); tpuctl ships only what "
            "is inside it",
            field="workdir",
            value=str(link),
            fix=f"copy the file into the working directory, or add {rel!r} to .tpuctlignore",
        )
    if target.is_dir():
        raise BundleError(
            f"symlink {rel} is a symlinked directory; tpuctl does not follow those",
            field="workdir",
            value=str(link),
            fix=f"replace it with a real directory, or add {rel!r}/ to .tpuctlignore",
        )
    return target


def build_bundle(
    workdir: Path | None, *, limit_bytes: int = DEFAULT_LIMIT_BYTES, exclude: Sequence[Path] = ()
) -> Bundle:
    """Collect, check and hash the bundle of ``workdir`` (None: the runtime alone, for ``--example``).
    Directories in ``exclude`` are never shipped, wherever they sit below the workdir (tpuctl's own state
    dir: its ledger and keys are no program's files, and its live SQLite files come and go)."""
    pairs: list[tuple[str, Path]] = []
    if workdir is not None:
        if not workdir.is_dir():
            raise BundleError(
                f"working directory {workdir} does not exist or is not a directory",
                field="workdir",
                value=str(workdir),
                fix="pass an existing directory with --workdir",
            )
        pairs.extend(_walk_user_files(workdir, {p.resolve() for p in exclude}))
    pairs.extend(_runtime_files())
    pairs.sort(key=lambda p: p[0])

    files: list[BundleFile] = []
    for rel, source in pairs:
        st = source.stat()
        mode = 0o755 if st.st_mode & stat.S_IXUSR else 0o644
        files.append(BundleFile(rel, source, st.st_size, mode))
    total = sum(f.size for f in files)
    if total > limit_bytes:
        largest = sorted(files, key=lambda f: -f.size)[:3]
        where = workdir if workdir is not None else runtime_root()
        raise BundleError(
            f"the bundle of {where} is {_human(total)} ({total} bytes), over the {_human(limit_bytes)} "
            f"limit; largest files: " + ", ".join(f"{f.path} ({_human(f.size)})" for f in largest),
            field="workdir",
            value=str(where),
            fix=f"exclude what the hosts do not need with a .tpuctlignore in {where} (gitignore syntax, "
            "e.g. `data/` or `*.ckpt`), or point --workdir at a smaller directory",
        )
    return Bundle(
        workdir=None if workdir is None else workdir.resolve(),
        files=tuple(files),
        digest=_digest(files),
        total_bytes=total,
        limit_bytes=limit_bytes,
    )


def _digest(files: list[BundleFile]) -> str:
    h = hashlib.sha256()
    for f in files:  # already sorted by path
        name = f.path.encode("utf-8")
        # Length-prefixed fields so no two different bundles can hash the same byte stream; the mode is
        # part of what is shipped (an executable bit change is a change).
        h.update(len(name).to_bytes(8, "big") + name)
        h.update(f.mode.to_bytes(4, "big") + f.size.to_bytes(8, "big"))
        with f.source.open("rb") as src:
            while chunk := src.read(1 << 20):
                h.update(chunk)
    return h.hexdigest()


def _human(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"
