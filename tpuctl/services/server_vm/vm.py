"""``server up|status|logs|down`` against the cloud: the VM created from the plan's exact body, waited on
until RUNNING, logged in to (OS Login, ``services.access.vm_login``), the server installed and started on
it (``install``), and read, followed and taken down again. The same on Google and the simulator: the
VM's client and its SSH address come from the session's backend.

A failed ``up`` leaves nothing behind: the VM it created is deleted (no final copy: the bucket keeps the
copy the failed VM restored from) and the error says so.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from tpuctl.errors import NotFoundError, RunFailedError, TpuctlError, UsageError
from tpuctl.services.server_vm import plan

if TYPE_CHECKING:
    from tpuctl.cloud.instances import InstanceClient, VmInstance
    from tpuctl.hosts.ssh import SshExecutor
    from tpuctl.services.server_vm.plan import ServerVmSpec
    from tpuctl.services.server_vm.wheel import ServerWheel
    from tpuctl.services.session import Session

#: A progress line for the user (stderr), or a line of the VM's output.
Say = Callable[[str], None]

_RUNNING_TIMEOUT_S: Final = 600.0
_FOLLOW_TIMEOUT_S: Final = 7 * 24 * 3600.0  # logs -f: until the user stops it


@dataclass(frozen=True)
class ServerState:
    """What ``server status`` reports."""

    vm: VmInstance | None
    unit: str | None  # systemd's is-active answer: active, activating, failed, inactive...
    ready: bool
    last_copy: dict[str, str] | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "vm": self.vm.to_dict() if self.vm else None,
            "unit": self.unit,
            "ready": self.ready,
            "last_copy": self.last_copy,
        }


@dataclass(frozen=True)
class UpResult:
    """What ``server up`` made: the VM, how long the server took to be ready, what the restore said, and
    how to reach the server."""

    vm: VmInstance
    ready_after_s: float
    restored: str | None  # what the restore step said (None: no SQLite copies)
    reach: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "vm": self.vm.to_dict(),
            "ready_after_s": round(self.ready_after_s, 1),
            "restored": self.restored,
            "reach": self.reach,
        }


@contextlib.contextmanager
def open_instances(session: Session) -> Iterator[InstanceClient]:
    """The session's backend's VM client, closed when the block ends."""
    closers: list[Callable[[], None]] = []
    try:
        yield session.backend.open_instances(session.cloud, closers)
    finally:
        for close in reversed(closers):
            close()


def server_up(
    session: Session, spec: ServerVmSpec, wheel: ServerWheel, *, say: Say, ready_timeout_s: float = 300.0
) -> UpResult:
    """Create the VM, install and start the server on it, wait for /readyz. See the module docstring."""
    from tpuctl.services.server_vm.install import install_server, wait_ready

    with open_instances(session) as instances:
        if instances.find(spec.zone, spec.name) is not None:
            raise UsageError(
                f"a VM named {spec.name} already exists in {spec.zone}",
                field="--name",
                value=spec.name,
                fix=f"tpuctl server status --zone {spec.zone} --name {spec.name}, or server down first",
            )
        say(f"creating VM {spec.name} ({spec.machine_type}, standard provisioning) in {spec.zone}")
        try:
            vm = instances.create(spec.zone, plan.instance_body(spec), request_id=str(uuid.uuid4()))
            vm = _wait_running(session, instances, vm)
            say(f"VM {vm.name} is RUNNING at {vm.address}; logging in")
            lines: list[str] = []

            def on_line(line: str) -> None:
                lines.append(line)
                if line.startswith(("restored ", "no copy to restore")):
                    say(line)

            with vm_executor(session, instances, vm) as executor:
                say("installing tpuctl on the VM (the host setup runs use) and starting the server")
                install_server(
                    executor,
                    spec,
                    wheel,
                    uv_wheelhouses=_wheelhouses(session),
                    uv_download_dir=session.state_dir / "wheels",
                    on_line=on_line,
                )
                ready_s = wait_ready(executor, ready_timeout_s)
        except BaseException as exc:
            _delete_after_failure(instances, spec, say, exc)
            raise
    restored = next((x for x in lines if x.startswith(("restored ", "no copy to restore"))), None)
    return UpResult(vm, ready_s, restored, plan.reach_commands(spec))


def server_status(session: Session, spec: ServerVmSpec) -> ServerState:
    from tpuctl.services.server_vm.backup import LedgerBackups
    from tpuctl.services.server_vm.install import run_on_vm

    last_copy = None
    if plan.backup_unit(spec) is not None and spec.bucket is not None:
        newest = LedgerBackups(session.buckets(), spec.bucket, spec.backup_prefix).newest()
        last_copy = newest.to_dict() if newest else None
    with open_instances(session) as instances:
        vm = instances.find(spec.zone, spec.name)
        if vm is None or vm.status != "RUNNING":
            return ServerState(vm, None, False, last_copy)
        with vm_executor(session, instances, vm) as executor:
            unit = run_on_vm(executor, plan.UNIT_STATE_COMMAND, lambda line: None)
            ready = run_on_vm(executor, plan.READY_COMMAND, lambda line: None)
    state = unit.tail[-1] if unit.tail else None
    return ServerState(vm, state, ready.exit_status == 0, last_copy)


def server_logs(session: Session, spec: ServerVmSpec, *, follow: bool, on_line: Say) -> None:
    from tpuctl.services.server_vm.install import run_on_vm

    with open_instances(session) as instances:
        vm = _existing(instances, spec)
        with vm_executor(session, instances, vm) as executor:
            timeout = _FOLLOW_TIMEOUT_S if follow else 60.0
            run_on_vm(executor, plan.logs_command(follow=follow), on_line, timeout_s=timeout)


def server_down(session: Session, spec: ServerVmSpec, *, say: Say) -> str | None:
    """Stop the units, take the final copy of a SQLite ledger, delete the VM. Returns what the final
    copy said (None: none taken)."""
    copied: str | None = None
    with open_instances(session) as instances:
        vm = _existing(instances, spec)
        if vm.status == "RUNNING":
            with vm_executor(session, instances, vm) as executor:
                copied = _stop_and_copy(executor, spec, say)
        else:
            say(f"VM {vm.name} is {vm.status}: no final copy (the bucket keeps its last minute's)")
        say(f"deleting VM {spec.name}")
        instances.delete(spec.zone, spec.name)
    return copied


def _stop_and_copy(executor: SshExecutor, spec: ServerVmSpec, say: Say) -> str | None:
    from tpuctl.services.server_vm.install import run_on_vm

    lines: list[str] = []
    say("stopping the server")
    run_on_vm(executor, plan.stop_unit_command("tpuctl-server.service"), lines.append)
    backup = plan.backup_unit(spec)
    final = plan.final_copy_command(spec)
    if backup is None or final is None:
        return None
    run_on_vm(executor, plan.stop_unit_command(backup.file_name), lines.append)
    # Only a ledger that exists is copied: a copy of nothing would become the newest, and the next up
    # would restore an empty ledger over the bucket's real one.
    guarded = f'test -f "$HOME/{plan.STATE_SUBDIR}/ledger.db" && {final}'
    say("taking the final copy of the stopped ledger")
    result = run_on_vm(executor, guarded, lines.append)
    if result.exit_status != 0:
        tail = "\n".join(f"    {line}" for line in result.tail[-10:])
        raise RunFailedError(
            f"server down: the final copy failed (exit {result.exit_status}); the VM is kept:\n{tail}",
            fix=f"tpuctl server logs --zone {spec.zone} --name {spec.name}; then server down again",
        )
    return next((x for x in reversed(lines) if x.startswith("copied to ")), None)


@contextlib.contextmanager
def vm_executor(session: Session, instances: InstanceClient, vm: VmInstance) -> Iterator[SshExecutor]:
    """An executor of the VM's one host: its published host keys verified, logged in through OS Login."""
    from tpuctl.hosts.ssh import SshExecutor, SshHost, ensure_key_pair
    from tpuctl.services.access import vm_login

    key = ensure_key_pair(session.state_dir)
    login = vm_login(session, vm, key)
    address = session.backend.instance_address(session.cloud, vm)
    keys = _host_keys(session, instances, vm)
    host = SshHost(address.address, address.port, keys, instance_name=vm.name, zone=vm.zone)
    executor = SshExecutor([host], login=login, key=key)
    try:
        yield executor
    finally:
        executor.abandon()


def _host_keys(session: Session, instances: InstanceClient, vm: VmInstance) -> tuple[str, ...]:
    tk = session.backend.timekeeping
    deadline = tk.monotonic() + session.backend.tuning.host_keys_wait_s
    while True:
        keys = instances.host_keys(vm.zone, vm.name)
        if keys:
            return keys
        if tk.monotonic() > deadline:
            raise RunFailedError(
                f"VM {vm.name} published no SSH host keys within "
                f"{session.backend.tuning.host_keys_wait_s:.0f} s (its guest agent publishes them at boot)",
                fix=f"gcloud compute instances get-serial-port-output {vm.name} --zone {vm.zone}",
            )
        tk.sleep(1.0)


def _wait_running(session: Session, instances: InstanceClient, vm: VmInstance) -> VmInstance:
    tk = session.backend.timekeeping
    deadline = tk.monotonic() + _RUNNING_TIMEOUT_S
    while vm.status != "RUNNING":
        if vm.status in ("STOPPING", "STOPPED", "TERMINATED", "SUSPENDED") or tk.monotonic() > deadline:
            raise RunFailedError(f"VM {vm.name} is {vm.status}, not RUNNING")
        tk.sleep(2.0)
        vm = instances.get(vm.zone, vm.name)
    return vm


def _existing(instances: InstanceClient, spec: ServerVmSpec) -> VmInstance:
    vm = instances.find(spec.zone, spec.name)
    if vm is None:
        raise NotFoundError(
            f"no server VM {spec.name} in {spec.zone}",
            fix=f"tpuctl server up --zone {spec.zone} --name {spec.name} (or pass the --name and --zone "
            "it was created with)",
        )
    return vm


def _delete_after_failure(
    instances: InstanceClient, spec: ServerVmSpec, say: Say, exc: BaseException
) -> None:
    """The VM a failed up created goes, so nothing bills; if even that fails, the error says how."""
    try:
        if instances.find(spec.zone, spec.name) is None:
            return
        say(f"server up failed ({_short(exc)}): deleting VM {spec.name}, which it created")
        instances.delete(spec.zone, spec.name)
    except TpuctlError as again:
        say(
            f"VM {spec.name} could not be deleted ({again.message}): delete it with `gcloud compute "
            f"instances delete {spec.name} --zone {spec.zone} --project {spec.project}` or "
            f"`tpuctl server down --zone {spec.zone} --name {spec.name}`"
        )


def _short(exc: BaseException) -> str:
    text = exc.message if isinstance(exc, TpuctlError) else (str(exc) or type(exc).__name__)
    return text.splitlines()[0] if text else type(exc).__name__


def _wheelhouses(session: Session) -> list[Path]:
    wheels = session.backend.host_wheelhouse or session.settings.sim_wheelhouse
    return [Path(wheels)] if wheels else []
