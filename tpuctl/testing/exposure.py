"""Where a secret's value can be seen, for the tests that prove it is seen nowhere but in its program:
captured output, every file below a directory (a state dir, a ledger, the simulated hosts' disks, a
bundle, logs) and, while a run goes on, the argv (``ps``) and environment of this machine's processes,
the simulated hosts' among them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tpuctl.sim.vms.layout import VM_MARKER

#: How the marker of every process a simulated VM runs starts, in its environment.
_VM_MARKER = f"{VM_MARKER}=".encode()


def leaks(values: Sequence[str], *, texts: Iterable[str] = (), roots: Iterable[Path] = ()) -> list[str]:
    """Each place one of ``values`` is found: a text (``"output: VALUE"``) or a file below a root
    (``"PATH: VALUE"``), read as bytes so a binary file (SQLite, an archive's members) is searched too."""
    found = [f"output: {v}" for text in texts for v in values if v in text]
    for root in roots:
        for path in _files_below(root):
            try:
                data = path.read_bytes()
            except OSError:  # removed while walking (a host's temp file)
                continue
            found += [f"{path}: {v}" for v in values if v.encode() in data]
    return found


def _files_below(root: Path) -> list[Path]:
    """Every regular file below ``root`` (not through symlinks), in order. A directory removed while
    walking (a dead VM's disk the fleet's reaper is wiping) is passed over, as ``os.walk`` does with an
    error, where ``Path.rglob`` raises."""
    import os

    files = []
    for directory, _dirs, names in os.walk(root):
        for name in names:
            path = Path(directory, name)
            if path.is_file() and not path.is_symlink():
                files.append(path)
    return sorted(files)


@dataclass(frozen=True)
class HostProcess:
    """A live process a simulated VM runs: its pid, argv and environment."""

    pid: int
    argv: tuple[str, ...]
    environ: dict[str, str]


def processes() -> list[tuple[int, bytes]]:
    """Every live process of this machine with its argv as ``ps`` reads it (NUL-separated bytes)."""
    found: list[tuple[int, bytes]] = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found.append((int(entry.name), (entry / "cmdline").read_bytes()))
            except OSError:  # gone meanwhile
                continue
    return found


def host_processes() -> list[HostProcess]:
    """The live processes of every simulated VM on this machine (found by the VM marker in their
    environment, as the simulator finds them)."""
    found: list[HostProcess] = []
    for pid, argv in processes():
        try:
            environ = (Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if not any(item.startswith(_VM_MARKER) for item in environ):
            continue
        pairs = (item.decode(errors="replace").partition("=") for item in environ if b"=" in item)
        words = tuple(w.decode(errors="replace") for w in argv.split(b"\0") if w)
        found.append(HostProcess(pid, words, {k: v for k, _, v in pairs}))
    return found
