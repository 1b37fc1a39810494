"""Where a SCRIPT run's program is: the script, the working directory shipped with it, and the script's
path inside that directory. One check for the two places that need it before anything is sent: a local
run's ``prepare`` and a client building a submission for a server."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tpuctl.errors import UsageError


@dataclass(frozen=True)
class ScriptPath:
    script: Path  # absolute
    workdir: Path  # absolute; the directory shipped (the bundle)
    in_workdir: str  # the script's POSIX path inside ``workdir``


def script_path(script: str, workdir: str | None) -> ScriptPath:
    """``script`` in ``workdir`` (default: the script's directory); exit 2 naming the bad value for a
    script that is not a file, a workdir that is not a directory, or a script outside it."""
    path = Path(script).expanduser()
    if not path.is_file():
        raise UsageError(
            f"script {script} does not exist" + (" (it is a directory)" if path.is_dir() else ""),
            field="SCRIPT",
            value=script,
            fix="check the path (relative paths are from the current directory)",
        )
    path = path.resolve()
    root = Path(workdir).expanduser().resolve() if workdir else path.parent
    if not root.is_dir():
        raise UsageError(
            f"--workdir {workdir} does not exist or is not a directory",
            field="workdir",
            value=workdir,
            fix="pass the directory that holds your program and its files",
        )
    if not path.is_relative_to(root):
        raise UsageError(
            f"script {path} is outside the working directory {root}",
            field="workdir",
            value=str(root),
            fix="pass a --workdir that contains the script (it is shipped with its directory)",
        )
    return ScriptPath(path, root, path.relative_to(root).as_posix())
