"""How a run reaches its hosts, and everything about it that depends on the executor kind or the backend:
which executor a run gets, building it for a node (or a placeholder one for a plan), the simulated
hosts' registry and disks, the notice grace, and killing host processes a dead supervisor left.

Every ``executor_kind == "sim"`` and ``backend == "sim"`` test of the run machinery is in this module and
nowhere else in ``tpuctl.services.run``: it is the one place a backend seam replaces.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpuctl.cloud.base import NetworkEndpoint, Node
from tpuctl.errors import UsageError
from tpuctl.services.run.model import EXECUTOR_KINDS, PreparedRun, RunRequest

if TYPE_CHECKING:
    from tpuctl.services.executors.base import Executor
    from tpuctl.services.pods import CreateSpec
    from tpuctl.services.session import Session

#: The public key a plan shows in place of the real one (a plan creates no key).
_PLAN_PUBLIC_KEY = "<tpuctl public key>"


def on_simulator(session: Session) -> bool:
    return session.backend.name == "sim"


def executor_kind(session: Session, requested: str | None) -> str:
    """The executor a run gets: the one asked for, else sim on the simulator and ssh on Google."""
    kind = requested or ("sim" if on_simulator(session) else "ssh")
    if kind not in EXECUTOR_KINDS:
        raise UsageError(
            f"unknown executor {kind!r}",
            field="--executor",
            value=kind,
            fix="use one of: " + ", ".join(EXECUTOR_KINDS),
        )
    if kind == "sim" and not on_simulator(session):
        raise UsageError(
            "the sim executor runs simulated hosts only; this command talks to Google",
            field="--executor",
            value=kind,
            fix="drop --executor (real slices use ssh)",
        )
    return kind


def hosts_run_locally(executor_kind: str) -> bool:
    """Whether the hosts are processes of this machine (simulated hosts) rather than remote ones."""
    return executor_kind == "sim"


def needs_key_at_creation(executor_kind: str) -> bool:
    """Whether the slice must carry tpuctl's SSH key in its metadata from its creation on."""
    return executor_kind == "ssh"


def default_checkpoint_dir(runs_dir: Path, run_id: str, executor_kind: str, request: RunRequest) -> str:
    if hosts_run_locally(executor_kind):
        # Simulated hosts share this machine's disk, as real hosts share a gs:// bucket.
        return str(runs_dir / run_id / "checkpoints")
    # A host-local default; multi-host runs that checkpoint want --checkpoint-dir gs://...
    return f"{request.ssh_remote_root}/runs/{run_id}/checkpoints"


def sim_hosts_dir(session: Session, node: Node) -> Path:
    return session.state_dir / "sim-hosts" / node.zone / node.name


def remove_host_disks(session: Session, prepared: PreparedRun, node: Node) -> None:
    """After the slice was deleted: simulated hosts' disks go with it (real ones went with the VMs)."""
    if hosts_run_locally(prepared.executor_kind):
        shutil.rmtree(sim_hosts_dir(session, node), ignore_errors=True)


def build_executor(session: Session, prepared: PreparedRun, node: Node, *, for_plan: bool) -> Executor:
    """The executor for ``node``'s hosts; ``for_plan``: one that only plans (no key made, no registry)."""
    hosts = prepared.target.accelerator.hosts
    if hosts_run_locally(prepared.executor_kind):
        from tpuctl.services.executors.sim import SimExecutor

        return SimExecutor(
            sim_hosts_dir(session, node),
            zone=node.zone,
            node=node.name,
            num_hosts=hosts,
            registry=None if for_plan else SimRegistry.for_session(session),
            metadata_base_url=session.cloud.endpoint,
            python=prepared.request.python or sys.executable,
        )
    from tpuctl.services.executors.ssh import DEFAULT_USERNAME, KeyPair, SshExecutor, SshHost, ensure_key_pair

    endpoints = list(node.network_endpoints)
    if len(endpoints) != hosts:
        raise UsageError(
            f"pod {node.name} reports {len(endpoints)} network endpoints for its {hosts} hosts",
            field="--pod",
            value=node.name,
            fix="wait until the slice is READY with every host up (`tpuctl pod describe`)",
        )
    on_sim = on_simulator(session)
    ssh_hosts = [
        # On Google, the endpoints' port is the TPU runtime's (8470), not SSH: use 22. The
        # simulator's endpoints are overridden to point at test SSH servers, port included.
        SshHost(e.external_ip or e.ip_address if not on_sim else e.ip_address, e.port if on_sim else 22)
        for e in endpoints
    ]
    key = (
        KeyPair(session.state_dir / "ssh" / "tpuctl_ed25519", _PLAN_PUBLIC_KEY)
        if for_plan
        else ensure_key_pair(session.state_dir)
    )
    return SshExecutor(
        ssh_hosts,
        username=DEFAULT_USERNAME,
        key=key,
        remote_root=prepared.request.ssh_remote_root,
        python=prepared.request.python or "python3",
    )


def plan_executor(session: Session, prepared: PreparedRun, zone: str | None) -> Executor:
    """The executor a plan asks for each host's command: the node's, or (no node yet) one of placeholder
    endpoints of the right size."""
    if prepared.target.node is not None:
        return build_executor(session, prepared, prepared.target.node, for_plan=True)
    accel = prepared.target.accelerator
    node = Node(
        name=prepared.target.name,
        zone=zone or "<zone chosen by the allocator>",
        accelerator_type=accel.api_name,
        state="PLANNED",
        capacity=prepared.target.capacity,
        network_endpoints=tuple(NetworkEndpoint(f"<worker-{i} address>", 22) for i in range(accel.hosts)),
    )
    return build_executor(session, prepared, node, for_plan=True)


def with_ssh_key(session: Session, prepared: PreparedRun, spec: CreateSpec, *, plan: bool) -> CreateSpec:
    """The create spec with tpuctl's public key in the node's ``ssh-keys`` metadata (SSH runs)."""
    if not needs_key_at_creation(prepared.executor_kind):
        return spec
    from tpuctl.services.executors.ssh import DEFAULT_USERNAME, ensure_key_pair, ssh_keys_metadata

    public = _PLAN_PUBLIC_KEY if plan else ensure_key_pair(session.state_dir).public_openssh
    metadata = {**spec.metadata, "ssh-keys": ssh_keys_metadata(DEFAULT_USERNAME, public)}
    return dataclasses.replace(spec, metadata=metadata)


@dataclass
class SimRegistry:
    """Registers host pids with the simulator's admin API (so simulated preemptions can signal them)."""

    base_url: str
    _client: Any = field(default=None, repr=False)

    @classmethod
    def for_session(cls, session: Session) -> SimRegistry:
        return cls(session.cloud.endpoint)

    def _admin(self) -> Any:
        if self._client is None:
            from tpuctl.sim import SimAdminClient

            self._client = SimAdminClient(self.base_url, timeout_s=10.0)
        return self._client

    def register_host(self, zone: str, node: str, worker: int, pid: int) -> object:
        return self._admin().register_host(zone, node, worker, pid)

    def unregister_hosts(self, zone: str, node: str) -> object:
        try:
            return self._admin().unregister_hosts(zone, node)
        finally:
            self._admin().close()
            self._client = None


def notice_grace_s(session: Session) -> float:
    """The backend's preemption notice grace in real seconds, where it can be asked (the simulator's,
    scaled by its speed); 0 when it cannot."""
    if not on_simulator(session):
        return 0.0
    from tpuctl.sim import SimAdminClient

    try:
        admin = SimAdminClient(session.cloud.endpoint, timeout_s=5.0)
        try:
            world = admin.status().get("world") or {}
        finally:
            admin.close()
        grace = float((world.get("durations") or {}).get("preemption_grace_s", 0.0))
        return grace / float(world.get("speed") or 1.0)
    except Exception:  # an older or foreign simulator: the default timeout stands
        return 0.0


def kill_recorded_hosts(host_pids: Any) -> int:
    """SIGKILL the process groups of simulated hosts a dead supervisor left (only while each pid is
    still the process that was recorded). Returns how many were signalled."""
    from tpuctl.processes import is_same_process

    if not isinstance(host_pids, dict):
        return 0
    killed = 0
    for value in host_pids.values():
        if not isinstance(value, list) or len(value) != 2 or not isinstance(value[0], int):
            continue
        pid, ticks = value
        if is_same_process(pid, ticks):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)  # each host leads its own group (start_new_session)
                killed += 1
    return killed


def kill_left_hosts(state_dir: Path, run_id: str, host_pids: Any, *, executor_kind: str | None) -> int:
    """SIGKILL the hosts a dead supervisor left: those recorded in the run (``host_pids``) and, for
    simulated hosts, every other process of the run still running on this machine: a supervisor killed
    between starting a host and recording the hosts' pids leaves one that nobody knows of (host 0 then
    waits for its peers for minutes and never writes to its closed pipe). Only for a run nobody
    supervises. Returns how many were signalled."""
    from tpuctl.services.executors.sim import local_hosts

    killed = kill_recorded_hosts(host_pids)
    if executor_kind is None or not hosts_run_locally(executor_kind):
        return killed
    recorded = (
        {v[0] for v in host_pids.values() if isinstance(v, list) and v}
        if isinstance(host_pids, dict)
        else set()
    )
    for pid in local_hosts(state_dir / "sim-hosts", run_id):
        if pid in recorded:
            continue  # signalled above, if still the recorded process
        with contextlib.suppress(ProcessLookupError, PermissionError):
            # A host leads its own group (whatever it started goes with it); a leftover child of a
            # host that is gone is signalled alone.
            if os.getpgid(pid) == pid:
                os.killpg(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
            killed += 1
    return killed
