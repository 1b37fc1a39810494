"""The part of ``server up`` that happens on the VM, over SSH (any ``hosts.base.Executor`` of its one
host): tpuctl's wheel copied over, the host setup runs use (uv brought, the wheel with its locked
dependencies installed from the host's package index), the newest ledger copy restored and reconciled,
the user units written, enabled and started, then the server's readiness awaited.

Every command is the plan's (``tpuctl.services.server_vm.plan``), so ``--dry-run`` shows what runs. The
same code on Google (systemd) and on a simulated VM (its stand-in, behind the image's systemctl shim).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Final

from tpuctl.errors import RunFailedError
from tpuctl.services.server_vm import plan

if TYPE_CHECKING:
    from tpuctl.hosts.base import CommandResult, Executor
    from tpuctl.services.server_vm.plan import ServerVmSpec
    from tpuctl.services.server_vm.wheel import ServerWheel

REMOTE_ROOT: Final = ".tpuctl"
_STEP_TIMEOUT_S: Final = 300.0
_SETUP_TIMEOUT_S: Final = 1800.0  # a cold install of ~100 packages on a small VM
_READY_POLL_S: Final = 1.0

#: Where each line of the VM's output goes (the console's detail, a log).
OnLine = Callable[[str], None]


def install_server(
    executor: Executor,
    spec: ServerVmSpec,
    wheel: ServerWheel,
    *,
    uv_wheelhouses: Iterable[Path],
    uv_download_dir: Path,
    on_line: OnLine,
) -> None:
    """Everything up to the units running. Raises RunFailedError naming the step that failed."""
    from tpuctl.hosts.setup import RUN_SCRIPT_FROM_STDIN, setup_script
    from tpuctl.hosts.uv_tool import bring_uv, download_wheel

    if wheel.path.name != spec.wheel_name:
        raise RunFailedError(f"the wheel built is {wheel.path.name}, not {spec.wheel_name}: a stale build?")
    _run(
        executor, plan.copy_wheel_command(spec), "copy tpuctl's wheel", on_line, stdin=wheel.path.read_bytes()
    )
    download = functools.partial(download_wheel, cache_dir=uv_download_dir)
    bring_uv(executor, REMOTE_ROOT, [*uv_wheelhouses, uv_download_dir], download=download, workers=[0])
    script = setup_script(spec.setup(wheel.locked), REMOTE_ROOT)
    _run(
        executor,
        RUN_SCRIPT_FROM_STDIN,
        "host setup",
        on_line,
        stdin=script.encode(),
        timeout_s=_SETUP_TIMEOUT_S,
    )
    restore = plan.restore_command(spec)
    if restore is not None:
        # Before the units start: the server must not act on a ledger that does not know the cloud.
        _run(executor, restore, "restore the ledger", on_line)
    for unit in plan.units(spec):
        text = (plan.server_unit(spec, reveal=True) if unit.name == "tpuctl-server" else unit).render()
        _run(executor, plan.install_unit_command(unit.file_name), f"install {unit.file_name}", on_line,
             stdin=text.encode())  # fmt: skip
    names = [u.file_name for u in plan.units(spec)]
    _run(executor, plan.start_units_command(names), "start the units", on_line)


def wait_ready(executor: Executor, timeout_s: float, *, clock: Callable[[], float] = time.monotonic) -> float:
    """Poll the server's /readyz on the VM until it answers; returns the seconds waited. Raises
    RunFailedError with the unit's last journal lines when it does not within ``timeout_s``."""
    started = clock()
    while True:
        result = _one(executor, plan.READY_COMMAND, lambda line: None, b"", 30.0)
        if result.exit_status == 0:
            return clock() - started
        if clock() - started > timeout_s:
            journal = _one(executor, plan.logs_command(follow=False, lines=20), lambda line: None, b"", 30.0)
            tail = "\n".join(f"    {line}" for line in journal.tail)
            raise RunFailedError(
                f"the server on the VM was not ready within {timeout_s:.0f} s; its journal ends:\n{tail}",
                fix="tpuctl server logs --zone ZONE",
            )
        time.sleep(_READY_POLL_S)


def run_on_vm(
    executor: Executor, command: str, on_line: OnLine, *, timeout_s: float = _STEP_TIMEOUT_S
) -> CommandResult:
    """One command on the VM, its result whatever its exit status (status, logs)."""
    return _one(executor, command, on_line, b"", timeout_s)


def _run(
    executor: Executor,
    command: str,
    what: str,
    on_line: OnLine,
    *,
    stdin: bytes = b"",
    timeout_s: float = _STEP_TIMEOUT_S,
) -> None:
    result = _one(executor, command, on_line, stdin, timeout_s)
    if result.exit_status != 0:
        status = (
            "no exit status (the VM was lost)" if result.exit_status is None else f"exit {result.exit_status}"
        )
        tail = "\n".join(f"    {line}" for line in result.tail[-10:])
        raise RunFailedError(f"server up: {what} failed on the VM ({status}):\n{tail}")


def _one(executor: Executor, command: str, on_line: OnLine, stdin: bytes, timeout_s: float) -> CommandResult:
    results = executor.run_command(
        command, on_line=lambda _worker, text: on_line(text), timeout_s=timeout_s, workers=[0], stdin=stdin
    )
    return results[0]
