"""How a run reaches its hosts: which executor a run gets, building it for a node (or a placeholder one
for a plan), the hosts' disks, the notice grace, and killing host processes a dead supervisor left.

Everything here that differs between backends is asked of ``session.backend`` (``tpuctl.backends``):
whether it has local host processes, how each host is reached over SSH, its notice grace.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpuctl.cloud.base import NetworkEndpoint, Node
from tpuctl.errors import UsageError
from tpuctl.services.run.model import EXECUTOR_KINDS, ExecutorKind, PreparedRun, RunRequest

if TYPE_CHECKING:
    from tpuctl.backends.base import LocalHosts
    from tpuctl.hosts.base import Executor
    from tpuctl.services.session import Session

#: The public key a plan shows in place of the real one (a plan creates no key).
_PLAN_PUBLIC_KEY = "<tpuctl public key>"


def local_hosts(session: Session) -> LocalHosts | None:
    """The backend's local host processes, or None where every host is reached over SSH."""
    return session.backend.local_hosts(session.cloud, session.state_dir)


def _local_hosts_or_refuse(session: Session) -> LocalHosts:
    local = local_hosts(session)
    if local is None:
        raise UsageError(
            f"the {ExecutorKind.LOCAL.value} executor runs simulated hosts only; this command talks to "
            f"{session.backend.name}, whose hosts are reached over SSH",
            field="executor",
            value=ExecutorKind.LOCAL.value,
            fix="drop --executor (real slices use ssh)",
        )
    return local


def executor_kind(session: Session, requested: str | None) -> ExecutorKind:
    """The executor a run gets: the one asked for, else the backend's default."""
    kind = requested or session.backend.default_executor
    if kind not in EXECUTOR_KINDS:
        raise UsageError(
            f"unknown executor {kind!r}",
            field="executor",
            value=kind,
            fix="use one of: " + ", ".join(EXECUTOR_KINDS),
        )
    chosen = ExecutorKind(kind)
    if chosen is ExecutorKind.LOCAL:
        _local_hosts_or_refuse(session)
    return chosen


def ssh_key_metadata(session: Session, kind: ExecutorKind, *, plan: bool) -> dict[str, str]:
    """The node metadata a new slice needs for ``kind``: tpuctl's public key in ``ssh-keys`` for hosts
    reached over SSH (nothing for local hosts). A plan shows a placeholder and creates no key."""
    if kind is not ExecutorKind.SSH:
        return {}
    from tpuctl.hosts.ssh import DEFAULT_USERNAME, ensure_key_pair, ssh_keys_metadata

    public = _PLAN_PUBLIC_KEY if plan else ensure_key_pair(session.state_dir).public_openssh
    return {"ssh-keys": ssh_keys_metadata(DEFAULT_USERNAME, public)}


def default_checkpoint_dir(
    session: Session, runs_dir: Path, run_id: str, kind: ExecutorKind, request: RunRequest
) -> str:
    if kind is ExecutorKind.LOCAL:
        return _local_hosts_or_refuse(session).checkpoint_dir(runs_dir, run_id)
    # A host-local default; multi-host runs that checkpoint want --checkpoint-dir gs://...
    return f"{request.ssh_remote_root}/runs/{run_id}/checkpoints"


def remove_host_disks(session: Session, prepared: PreparedRun, node: Node) -> None:
    """After the slice was deleted: local hosts' disks go with it (remote ones went with their VMs)."""
    if prepared.executor_kind is ExecutorKind.LOCAL:
        _local_hosts_or_refuse(session).cleanup(node)


def build_executor(session: Session, prepared: PreparedRun, node: Node, *, for_plan: bool) -> Executor:
    """The executor for ``node``'s hosts; ``for_plan``: one that only plans (no key made, no registry)."""
    hosts = prepared.target.accelerator.hosts
    if prepared.executor_kind is ExecutorKind.LOCAL:
        return _local_hosts_or_refuse(session).executor(
            node, num_hosts=hosts, python=prepared.request.python, for_plan=for_plan
        )
    from tpuctl.hosts.ssh import DEFAULT_USERNAME, KeyPair, SshExecutor, SshHost, ensure_key_pair

    addresses = session.backend.host_addresses(node)
    if len(addresses) != hosts:
        raise UsageError(
            f"pod {node.name} reports {len(addresses)} network endpoints for its {hosts} hosts",
            field="pod",
            value=node.name,
            fix="wait until the slice is READY with every host up (`tpuctl pod describe`)",
        )
    key = (
        KeyPair(session.state_dir / "ssh" / "tpuctl_ed25519", _PLAN_PUBLIC_KEY)
        if for_plan
        else ensure_key_pair(session.state_dir)
    )
    return SshExecutor(
        [SshHost(a.address, a.port) for a in addresses],
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


def notice_grace_s(session: Session) -> float:
    """The backend's preemption notice grace in real seconds; 0 when it cannot tell."""
    return session.backend.notice_grace_s(session.cloud) or 0.0


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


def kill_left_hosts(session: Session, run_id: str, host_pids: Any, *, executor_kind: str | None) -> int:
    """SIGKILL the hosts a dead supervisor left: those recorded in the run (``host_pids``) and, for local
    hosts, every other process of the run still running on this machine: a supervisor killed between
    starting a host and recording the hosts' pids leaves one that nobody knows of (host 0 then waits for
    its peers for minutes and never writes to its closed pipe). Only for a run nobody supervises.
    Returns how many were signalled."""
    killed = kill_recorded_hosts(host_pids)
    local = local_hosts(session)
    if executor_kind != ExecutorKind.LOCAL.value or local is None:
        return killed
    recorded = (
        {v[0] for v in host_pids.values() if isinstance(v, list) and v}
        if isinstance(host_pids, dict)
        else set()
    )
    for pid in local.leftover_pids(run_id):
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
