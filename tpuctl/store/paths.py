"""Private directories and files, and durable atomic writes.

tpuctl's state (the ledger, the simulator's database, cached prices) tells anyone who can read it which
project, zones and slices a user has and what they cost, so the state directory is 0700 and its files
0600, whatever the process umask says. Writes of whole files go through ``atomic_write_text``: a reader,
or a tpuctl killed half way, sees either the old file or the new one, never a torn mix.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from tpuctl.errors import TpuctlError

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


class StatePermissionError(TpuctlError):
    """The state directory or a state file cannot be made private (e.g. it belongs to another user)."""

    kind = "state_permission"


def ensure_private_dir(path: str | os.PathLike[str]) -> Path:
    """Create ``path`` (and missing parents) and make the leaf directory 0700.

    An existing directory that is looser than 0700 is tightened, because state dirs made by older tools
    or by hand with the default umask (0755) would otherwise leak the ledger. Parents are created with
    the process umask and never touched otherwise: they may be shared directories such as ``~/.local``.
    """
    p = Path(path).expanduser()
    try:
        p.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
        # mkdir's mode is filtered through the umask and ignored for an existing directory: chmod
        # explicitly, and only when needed so a read-only-but-private directory is left alone.
        if stat.S_IMODE(p.stat().st_mode) != PRIVATE_DIR_MODE:
            p.chmod(PRIVATE_DIR_MODE)
    except FileExistsError:
        raise StatePermissionError(
            f"state path {p} exists and is not a directory",
            fix="move that file away or choose another state dir",
        ) from None
    except PermissionError as exc:
        raise StatePermissionError(
            f"cannot make state directory {p} private (0700): {exc.strerror}",
            fix=f"check that {p} belongs to you, or choose another state dir",
        ) from None
    return p


def private_file(path: str | os.PathLike[str]) -> Path:
    """Make sure ``path`` exists as a regular file with mode 0600 (created empty if missing)."""
    p = Path(path).expanduser()
    try:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), PRIVATE_FILE_MODE)
        try:
            # O_CREAT's mode does nothing for an existing file, and is umask-filtered for a new one.
            os.fchmod(fd, PRIVATE_FILE_MODE)
        finally:
            os.close(fd)
    except PermissionError as exc:
        raise StatePermissionError(
            f"cannot make state file {p} private (0600): {exc.strerror}",
            fix=f"check that {p} belongs to you, or choose another state dir",
        ) from None
    return p


def tighten_file(path: str | os.PathLike[str]) -> None:
    """chmod an existing file to 0600 if it is looser; a missing file is fine (nothing to protect)."""
    p = Path(path)
    with contextlib.suppress(FileNotFoundError):
        if stat.S_IMODE(p.stat().st_mode) & ~PRIVATE_FILE_MODE:
            p.chmod(PRIVATE_FILE_MODE)


def fsync_dir(directory: Path) -> None:
    # The rename is only durable once the directory entry is on disk. Some filesystems refuse to open
    # or fsync a directory; the data itself was already fsynced, so that is not worth failing for.
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_text(
    path: str | os.PathLike[str], text: str, *, mode: int = PRIVATE_FILE_MODE, encoding: str = "utf-8"
) -> Path:
    """Replace ``path`` with ``text`` atomically and durably (``atomic_write_bytes``)."""
    return atomic_write_bytes(path, text.encode(encoding), mode=mode)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, mode: int = PRIVATE_FILE_MODE) -> Path:
    """Replace ``path`` with ``data`` atomically and durably.

    Temp file in the same directory (so ``os.replace`` is a rename, atomic on POSIX), fsync of the data,
    the final mode set before the rename (so the file is never visible with a looser mode), then fsync of
    the directory. The parent directory must exist.
    """
    p = Path(path).expanduser()
    fd, tmp_name = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
            os.fchmod(fh.fileno(), mode)
        os.replace(tmp, p)
    except BaseException:
        # Also on KeyboardInterrupt: a stray temp file would be left for ever otherwise.
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    fsync_dir(p.parent)
    return p


def atomic_write_json(
    path: str | os.PathLike[str],
    data: Any,
    *,
    mode: int = PRIVATE_FILE_MODE,
    indent: int | None = 2,
    sort_keys: bool = True,
) -> Path:
    """``atomic_write_text`` of ``data`` as JSON (sorted keys by default, so rewrites diff cleanly)."""
    text = json.dumps(data, indent=indent, sort_keys=sort_keys, ensure_ascii=False)
    return atomic_write_text(path, text + "\n", mode=mode)
