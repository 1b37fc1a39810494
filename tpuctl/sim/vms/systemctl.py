"""The simulated image's ``systemctl --user``, ``journalctl --user`` and ``loginctl enable-linger``:
small shims over the systemd stand-in (``tpuctl.sim.vms.units``), so the commands ``server up`` sends a
VM over SSH run unchanged on a simulated one. Google's images have systemd itself; these shims exist only
on the simulated image (``<image>/bin``, first on a host's PATH; ``install_shims``).

What a user manager keeps, they keep on the VM's disk: the enabled units are the links in
``~/.config/systemd/user/default.target.wants/`` (as ``systemctl enable`` makes them), a lingering user
is a file in ``/var/lib/systemd/linger/`` of the disk (as ``loginctl enable-linger`` makes it), and each
started unit's stand-in pid and journal are in ``<disk>/var/lib/sim-systemd/<user>/``. At boot the VM
starts the enabled units of every lingering user (``boot_user_units``), as systemd starts a lingering
user's manager at boot and that manager its ``default.target``; a user who does not linger gets nothing
started (stricter than an interactive login, which would start the manager too).

Stricter than Google where unsure: only ``--user`` is served (no root on a simulated VM, so no system
manager to ask); an unknown verb or unit is refused with systemd's exit status.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Final

from tpuctl.hosts.service_unit import USER_UNIT_DIR, WANTED_BY

#: systemctl's exit status for "not active" (is-active) and for a unit that does not exist.
_INACTIVE: Final = 3
_NO_UNIT: Final = 5
_STOP_WAIT_S: Final = 100.0
_EXEC_WAIT_S: Final = 10.0  # beyond the stand-in's own SIGTERM-to-SIGKILL grace
SHIMS: Final = ("systemctl", "journalctl", "loginctl")


def units_dir(home: Path) -> Path:
    return home / USER_UNIT_DIR


def wants_dir(home: Path) -> Path:
    return units_dir(home) / f"{WANTED_BY}.wants"


def _disk_of(home: Path) -> Path:
    return home.parent.parent  # <disk>/home/<user>


def linger_file(home: Path) -> Path:
    return _disk_of(home) / "var" / "lib" / "systemd" / "linger" / home.name


def runtime_dir(home: Path) -> Path:
    return _disk_of(home) / "var" / "lib" / "sim-systemd" / home.name


def journal_file(home: Path, unit: str) -> Path:
    return runtime_dir(home) / f"{unit}.journal"


def _pid_file(home: Path, unit: str) -> Path:
    return runtime_dir(home) / f"{unit}.pid"


def _unit_name(name: str) -> str:
    return name if name.endswith(".service") else f"{name}.service"


def running_pid(home: Path, unit: str) -> int | None:
    """The pid of the unit's live stand-in (None: not started, or it died with its VM)."""
    try:
        pid = int(_pid_file(home, unit).read_text(encoding="utf-8"))
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if b"tpuctl.sim.vms.units" in cmdline else None  # not a reused pid


def start(home: Path, unit: str, env: Mapping[str, str]) -> int:
    """Start the unit's stand-in unless it runs; 0, or ``_NO_UNIT`` when there is no such unit file."""
    unit = _unit_name(unit)
    unit_file = units_dir(home) / unit
    if not unit_file.is_file():
        print(f"Failed to start {unit}: Unit {unit} not found.", file=sys.stderr)
        return _NO_UNIT
    if running_pid(home, unit) is not None:
        return 0
    runtime_dir(home).mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        [sys.executable, "-m", "tpuctl.sim.vms.units", str(unit_file), str(journal_file(home, unit))],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**env, "HOME": str(home)},
        cwd=home,
        start_new_session=True,  # outlives the SSH session that started it, as a unit does
    )
    _pid_file(home, unit).write_text(str(process.pid), encoding="utf-8")
    # Until the child has exec'd, its /proc cmdline is this process's: wait for it, so a start returns a
    # unit that is-active (as systemctl start returns once the process is spawned).
    give_up = time.monotonic() + _EXEC_WAIT_S
    while running_pid(home, unit) is None and process.poll() is None and time.monotonic() < give_up:
        time.sleep(0.01)
    return 0


def stop(home: Path, unit: str) -> int:
    """SIGTERM the unit's stand-in (it stops its process as systemd would) and wait until it is gone."""
    unit = _unit_name(unit)
    pid = running_pid(home, unit)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        give_up = time.monotonic() + _STOP_WAIT_S
        while running_pid(home, unit) is not None and time.monotonic() < give_up:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)  # reaps it where this process started it
            time.sleep(0.05)
    _pid_file(home, unit).unlink(missing_ok=True)
    return 0


def enable(home: Path, units: Sequence[str]) -> int:
    for name in map(_unit_name, units):
        if not (units_dir(home) / name).is_file():
            print(f"Failed to enable unit: Unit file {name} does not exist.", file=sys.stderr)
            return 1
        link = wants_dir(home) / name
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(Path("..") / name)
            print(f"Created symlink {link} → {units_dir(home) / name}.")
    return 0


def boot_user_units(disk: Path, env_of: Callable[[str, Path], Mapping[str, str]]) -> list[str]:
    """At a VM's boot: start every enabled unit of every lingering user with a home on ``disk``
    (``env_of(user, home)``: the user's environment, as the VM's sessions get it). Returns the units
    started, as ``user/unit``."""
    started: list[str] = []
    lingering = disk / "var" / "lib" / "systemd" / "linger"
    for user_file in sorted(lingering.iterdir()) if lingering.is_dir() else ():
        home = disk / "home" / user_file.name
        wants = wants_dir(home)
        for link in sorted(wants.iterdir()) if wants.is_dir() else ():
            if start(home, link.name, env_of(user_file.name, home)) == 0:
                started.append(f"{user_file.name}/{link.name}")
    return started


def systemctl(argv: Sequence[str], home: Path, env: Mapping[str, str]) -> int:
    args = list(argv)
    if "--user" not in args:
        print("systemctl: only --user is served on a simulated VM (no system manager)", file=sys.stderr)
        return 1
    args.remove("--user")
    now = "--now" in args
    args = [a for a in args if a not in ("--now", "--quiet", "-q", "--no-pager")]
    if not args:
        print("systemctl: a verb is needed", file=sys.stderr)
        return 1
    verb, units = args[0], args[1:]
    if verb == "daemon-reload":
        return 0  # the stand-in reads the unit file each time it starts
    if verb == "enable":
        return enable(home, units) or (max((start(home, u, env) for u in units), default=0) if now else 0)
    if verb == "disable":
        for name in map(_unit_name, units):
            (wants_dir(home) / name).unlink(missing_ok=True)
            if now:
                stop(home, name)
        return 0
    if verb == "start":
        return max((start(home, u, env) for u in units), default=0)
    if verb == "stop":
        return max((stop(home, u) for u in units), default=0)
    if verb == "restart":
        for u in units:
            stop(home, u)
        return max((start(home, u, env) for u in units), default=0)
    if verb == "is-active":
        active = [running_pid(home, _unit_name(u)) is not None for u in units]
        for state in active:
            print("active" if state else "inactive")
        return 0 if active and all(active) else _INACTIVE
    print(f"systemctl: verb {verb} is not served on a simulated VM", file=sys.stderr)
    return 1


def journalctl(argv: Sequence[str], home: Path) -> int:
    args = [a for a in argv if a not in ("--user", "--no-pager")]
    follow = "-f" in args or "--follow" in args
    unit, lines = None, None
    for flag, value in itertools.pairwise(args):
        if flag in ("-u", "--unit"):
            unit = _unit_name(value)
        if flag in ("-n", "--lines"):
            lines = int(value)
    if unit is None:
        print("journalctl: -u UNIT is needed on a simulated VM", file=sys.stderr)
        return 1
    journal = journal_file(home, unit)
    text = journal.read_text(encoding="utf-8", errors="replace") if journal.is_file() else ""
    shown = text.splitlines(keepends=True)
    sys.stdout.write("".join(shown[-lines:] if lines else shown))
    sys.stdout.flush()
    offset = len(text.encode())
    while follow:  # until the session hangs up (SIGHUP ends this process)
        time.sleep(0.2)
        if journal.is_file() and journal.stat().st_size > offset:
            with journal.open("rb") as f:
                f.seek(offset)
                chunk = f.read()
            offset += len(chunk)
            sys.stdout.write(chunk.decode(errors="replace"))
            sys.stdout.flush()
    return 0


def loginctl(argv: Sequence[str], home: Path) -> int:
    if not argv or argv[0] != "enable-linger" or argv[1:] not in ([], [home.name]):
        print("loginctl: only `enable-linger` of the login user is served on a simulated VM", file=sys.stderr)
        return 1
    linger = linger_file(home)
    linger.parent.mkdir(parents=True, exist_ok=True)
    linger.touch()
    return 0


def install_shims(bin_dir: Path, python: str) -> None:
    """Write the three shims into ``bin_dir`` (the image's), each running this module with ``python``
    (the simulator's own interpreter: the stand-in is part of the simulated OS, not of the VM's Python)."""
    for name in SHIMS:
        shim = bin_dir / name
        shim.write_text(
            f'#!/bin/sh\nexec {shlex.quote(python)} -m tpuctl.sim.vms.systemctl {name} "$@"\n',
            encoding="utf-8",
        )
        shim.chmod(0o755)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    home = Path(os.environ["HOME"])
    tool, rest = args[0], args[1:]
    if tool == "systemctl":
        return systemctl(rest, home, os.environ)
    if tool == "journalctl":
        return journalctl(rest, home)
    return loginctl(rest, home)


if __name__ == "__main__":
    sys.exit(main())
