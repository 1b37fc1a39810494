"""The simulated image's ``systemctl --user`` / ``journalctl --user`` / ``loginctl`` shims over the systemd
stand-in, and the VM's boot starting a lingering user's enabled units: with real stand-in processes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tpuctl.hosts.service_unit import RestartPolicy, ServiceUnit
from tpuctl.sim.vms.systemctl import (
    boot_user_units,
    install_shims,
    journalctl,
    loginctl,
    running_pid,
    systemctl,
    units_dir,
)
from tpuctl.testing.clock import wait_for

_PROGRAM = (
    "import os, time; open('started', 'a').write(os.getcwd() + '\\n'); print('up', flush=True); "
    "time.sleep(600)"
)


def _home_with_unit(tmp_path: Path) -> Path:
    home = tmp_path / "disk" / "home" / "me"
    unit = ServiceUnit(
        "demo",
        "demo service",
        (sys.executable, "-c", _PROGRAM),
        RestartPolicy.ON_FAILURE,
        working_directory="%h/work",  # expanded by the stand-in, as the user manager does
    )
    (home / "work").mkdir(parents=True)
    units_dir(home).mkdir(parents=True)
    (units_dir(home) / unit.file_name).write_text(unit.render())
    return home


def test_enable_now_starts_it_stop_stops_it_and_boot_starts_it_again(tmp_path: Path, capsys: object) -> None:
    home = _home_with_unit(tmp_path)
    env = {"PATH": "/usr/bin:/bin"}
    assert systemctl(["--user", "daemon-reload"], home, env) == 0
    assert systemctl(["--user", "enable", "--now", "demo.service"], home, env) == 0
    try:
        started = home / "work" / "started"
        # The file exists from the program's open(), its line only once written: wait for the line.
        wait_for(lambda: started.is_file() and started.read_text().endswith("\n"), timeout=30)
        assert started.read_text() == f"{home / 'work'}\n"
        assert systemctl(["--user", "is-active", "demo.service"], home, env) == 0
        wait_for(lambda: "up" in capture_journal(home), timeout=30)
    finally:
        assert systemctl(["--user", "stop", "demo"], home, env) == 0
    assert running_pid(home, "demo.service") is None
    assert systemctl(["--user", "is-active", "demo.service"], home, env) == 3
    # Enabled, but the user does not linger: a boot starts nothing of theirs.
    assert boot_user_units(tmp_path / "disk", lambda user, h: env) == []
    assert loginctl(["enable-linger"], home) == 0
    try:
        assert boot_user_units(tmp_path / "disk", lambda user, h: env) == ["me/demo.service"]
        assert running_pid(home, "demo.service") is not None
    finally:
        systemctl(["--user", "stop", "demo.service"], home, env)


def capture_journal(home: Path) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "tpuctl.sim.vms.systemctl", "journalctl", "--user", "-u", "demo", "-n", "5"],
        env={"HOME": str(home)},
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout


def test_refusals_name_what_is_not_served(tmp_path: Path) -> None:
    home = _home_with_unit(tmp_path)
    assert systemctl(["start", "demo"], home, {}) == 1  # no --user: no system manager to ask
    assert systemctl(["--user", "start", "absent.service"], home, {}) == 5
    assert systemctl(["--user", "enable", "absent.service"], home, {}) == 1
    assert journalctl(["--user"], home) == 1
    assert loginctl(["enable-linger", "someone-else"], home) == 1


def test_the_shims_on_the_image_path_run_the_stand_in_commands(tmp_path: Path) -> None:
    home = _home_with_unit(tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    install_shims(bin_dir, sys.executable)
    state = subprocess.run(
        [str(bin_dir / "systemctl"), "--user", "is-active", "demo.service"],
        env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert (state.returncode, state.stdout) == (3, "inactive\n")
