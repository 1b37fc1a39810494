"""The simulated VM's stand-in for systemd honours the unit's command, environment and restart policy,
with real child processes (RestartSec waited out by a wait that counts instead of sleeping)."""

from __future__ import annotations

import sys
from pathlib import Path

from tpuctl.hosts.service_unit import RestartPolicy, ServiceUnit, parse
from tpuctl.sim.vms.units import UnitSupervisor


def _program(tmp_path: Path, body: str) -> tuple[str, ...]:
    script = tmp_path / "program.py"
    script.write_text(body, encoding="utf-8")
    return (sys.executable, str(script))


def _supervise(unit: ServiceUnit, journal: Path) -> tuple[UnitSupervisor, list[float]]:
    waits: list[float] = []

    def wait(seconds: float) -> bool:
        waits.append(seconds)
        return False

    # Through the file, as on the VM: what runs is what the rendered unit says.
    read_back = parse(unit.name, unit.render())
    with open(journal, "ab") as out:
        supervisor = UnitSupervisor(read_back, out, wait=wait)
        supervisor.run()
    return supervisor, waits


def test_a_process_that_fails_is_started_again_until_it_succeeds(tmp_path: Path) -> None:
    counter = tmp_path / "starts"
    argv = _program(
        tmp_path,
        "import os, pathlib, sys\n"
        f"p = pathlib.Path({str(counter)!r})\n"
        "n = int(p.read_text()) + 1 if p.exists() else 1\n"
        "p.write_text(str(n))\n"
        "print('start', n, os.environ['GREETING'], flush=True)\n"
        "sys.exit(0 if n == 3 else 3)\n",
    )
    unit = ServiceUnit(
        "demo", "demo", argv, RestartPolicy.ON_FAILURE, restart_sec=7, environment={"GREETING": "hi there"}
    )
    supervisor, waits = _supervise(unit, tmp_path / "journal")
    assert supervisor.exits == [3, 3, 0]
    assert waits == [7.0, 7.0]  # RestartSec before each restart, none after the clean exit
    journal = (tmp_path / "journal").read_text()
    assert "start 1 hi there" in journal and "start 3 hi there" in journal
    assert journal.count("main process exited") == 3


def test_on_failure_does_not_restart_a_clean_exit(tmp_path: Path) -> None:
    unit = ServiceUnit("ok", "ok", _program(tmp_path, "print('done')\n"), RestartPolicy.ON_FAILURE)
    supervisor, waits = _supervise(unit, tmp_path / "journal")
    assert supervisor.exits == [0]
    assert waits == []


def test_restart_no_leaves_a_failed_process_down(tmp_path: Path) -> None:
    unit = ServiceUnit("once", "once", _program(tmp_path, "raise SystemExit(5)\n"), RestartPolicy.NO)
    supervisor, _ = _supervise(unit, tmp_path / "journal")
    assert supervisor.exits == [5]


def test_working_directory_is_honoured(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    argv = _program(tmp_path, "import os; open('here', 'w').write(os.getcwd())\n")
    unit = ServiceUnit("cwd", "cwd", argv, RestartPolicy.NO, working_directory=str(work))
    _supervise(unit, tmp_path / "journal")
    assert (work / "here").read_text() == str(work)


def test_a_missing_working_directory_fails_the_start_as_systemd_does(tmp_path: Path) -> None:
    unit = ServiceUnit(
        "nowhere",
        "nowhere",
        _program(tmp_path, "pass\n"),
        RestartPolicy.NO,
        working_directory=str(tmp_path / "x"),
    )
    supervisor, _ = _supervise(unit, tmp_path / "journal")
    assert supervisor.exits == [200]
    assert "working directory failed" in (tmp_path / "journal").read_text()
