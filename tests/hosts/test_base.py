"""What a host executes for a shell command (a job file's ``run:``): at a preemption's SIGTERM, which a
VM's shutdown sends to every process, the host's status is the program's, once it has stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tpuctl.hosts.base import LaunchSpec

#: Says it is up, then, on SIGTERM, takes a moment (a checkpoint on the notice) and exits 42.
ON_NOTICE = """\
import signal, sys, time
def stop(*_):
    time.sleep(0.3)
    print("saved", flush=True)
    sys.exit(42)
signal.signal(signal.SIGTERM, stop)
print("up", flush=True)
time.sleep(30)
"""


def _shell_host(command: str, *args: str, cwd: Path) -> subprocess.Popen[str]:
    spec = LaunchSpec(
        run_id="r", program=(command, *args), num_workers=1, chips_per_host=4,
        accelerator_type="v5litepod-4", topology="2x2", checkpoint_dir="/tmp/ckpt", shell=True,
    )  # fmt: skip
    return subprocess.Popen(
        spec.argv(sys.executable), cwd=cwd, stdout=subprocess.PIPE, text=True, start_new_session=True
    )


def _terminate_every_process(host: subprocess.Popen[str]) -> str:
    """The shutdown's SIGTERM to all of the host's processes, once its program is up; its output."""
    assert host.stdout is not None
    assert host.stdout.readline() == "up\n"
    os.killpg(host.pid, signal.SIGTERM)
    out, _ = host.communicate(timeout=30)
    return out


def test_a_shell_command_stopped_by_sigterm_exits_with_its_programs_status(tmp_path: Path) -> None:
    (tmp_path / "prog.py").write_text(ON_NOTICE)
    host = _shell_host('python3 prog.py "$@"; echo after', "a", cwd=tmp_path)
    out = _terminate_every_process(host)
    # The program's own status, after its save; nothing after it runs (the run is stopping).
    assert (host.returncode, out) == (42, "saved\n")


def test_a_program_without_a_handler_still_dies_of_sigterm(tmp_path: Path) -> None:
    (tmp_path / "prog.py").write_text('import time\nprint("up", flush=True)\ntime.sleep(30)\n')
    host = _shell_host("python3 prog.py", cwd=tmp_path)
    _terminate_every_process(host)
    assert host.returncode == -signal.SIGTERM  # as without a shell: no sign of a preemption lost
