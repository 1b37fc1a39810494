"""How a run reaches its hosts: over SSH, on every backend (a simulated host is a VM too).

Building the executor for a node (or a placeholder one for a plan), the SSH key the run logs in with and
who it logs in as (``access.host_login``: OS Login's POSIX account where OS Login is on, else the
``ssh-keys`` user), each host's expected host key (from the node's guest attributes: no
trust-on-first-use) and its instance name and zone (what an IAP tunnel targets, the ProxyCommand's
``%n`` and ``%z``), the notice grace, and stopping what a dead supervisor left on the hosts. What differs
between backends is asked of ``session.backend``: each host's address and port, and what its program
needs beyond the worker contract (``host_env``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tpuctl.catalog import Surface
from tpuctl.cloud.base import HostIdentity, NetworkEndpoint, Node
from tpuctl.errors import CloudError, RunFailedError, TpuctlError, UsageError
from tpuctl.services.access import PLAN_PUBLIC_KEY, host_login
from tpuctl.services.run.model import EXECUTOR_KINDS, ExecutorKind, PreparedRun
from tpuctl.services.run.sliceset import SliceSet

if TYPE_CHECKING:
    from tpuctl.backends.base import HostAddress
    from tpuctl.hosts.ssh import HostLogin, KeyPair, SshExecutor, SshHost
    from tpuctl.services.session import Session


def executor_kind(session: Session, requested: str | None) -> ExecutorKind:
    """The executor a run gets: SSH, on every backend (``--executor sim`` is gone: simulated hosts are
    VMs reached over SSH like Google's)."""
    kind = requested or ExecutorKind.SSH.value
    if kind not in EXECUTOR_KINDS:
        fix = "drop --executor: every host, simulated or not, is reached over SSH"
        raise UsageError(f"unknown executor {kind!r}", field="executor", value=kind, fix=fix)
    return ExecutorKind(kind)


def build_executor(
    session: Session, prepared: PreparedRun, slices: SliceSet, *, for_plan: bool
) -> SshExecutor:
    """The executor for every host of ``slices``, slice by slice (slice ``i``'s hosts are workers
    ``i * hosts .. (i + 1) * hosts - 1``); ``for_plan``: one that only plans (no key made, no cloud call
    for host keys)."""
    from tpuctl.hosts.ssh import KeyPair, SshExecutor

    accel = prepared.target.accelerator
    request = prepared.request
    key = KeyPair(None, PLAN_PUBLIC_KEY) if for_plan else run_key(session, prepared)
    login = _plan_login() if for_plan else host_login(session, slices.nodes, key)
    addresses: list[HostAddress] = []
    ssh_hosts: list[SshHost] = []
    for node in slices.nodes:
        found = _addresses(session, node, accel.hosts, for_plan=for_plan)
        if for_plan:
            ssh_hosts += _planned_hosts(node, found, first=len(addresses))
        else:
            ssh_hosts += node_ssh_hosts(
                session,
                node,
                found,
                deadline_s=session.backend.tuning.host_keys_wait_s,
                need_names=_needs_instance_names(request.ssh_proxy_command),
            )
        addresses += found
    backend = session.backend

    def host_env(worker: int) -> dict[str, str]:
        return backend.host_env(worker, addresses, accel.chips_per_host)

    return SshExecutor(
        ssh_hosts,
        login=login,
        key=key,
        remote_root=request.ssh_remote_root,
        python=prepared.python,
        host_env=host_env,
        # Compute Engine publishes no agent-worker-number for certain (docs/google-facts.md#worker-identity):
        # give programs JAX's other way to find their peers, from what it does publish
        # (tpuctl/hosts/worker_identity.py).
        tpu_worker_env=slices.surface is Surface.COMPUTE,
        proxy_command=request.ssh_proxy_command,
    )


def run_key(session: Session, prepared: PreparedRun) -> KeyPair:
    """The key the run's hosts are reached with: the run's own (``runkey``, loaded by its supervisor),
    else the state dir's (a launcher used without a supervisor)."""
    from tpuctl.hosts.ssh import ensure_key_pair

    return prepared.ssh_key or ensure_key_pair(session.state_dir)


def _plan_login() -> HostLogin:
    """A plan's login: it asks no cloud (whether OS Login is on is learned when the run logs in)."""
    from tpuctl.hosts.ssh import DEFAULT_USERNAME, HostLogin

    return HostLogin(DEFAULT_USERNAME, authorized_by="(a plan logs in nowhere)", refused_fix="")


def _addresses(session: Session, node: Node, hosts: int, *, for_plan: bool) -> list[HostAddress]:
    if for_plan and node.state == "PLANNED":
        from tpuctl.backends.base import HostAddress

        return [HostAddress(e.ip_address, 22) for e in node.network_endpoints]
    addresses = session.backend.host_addresses(session.cloud, node)
    if len(addresses) != hosts:
        raise UsageError(
            f"pod {node.name} reports {len(addresses)} network endpoints for its {hosts} hosts",
            field="pod",
            value=node.name,
            fix="wait until the slice is READY with every host up (`tpuctl pod describe`)",
        )
    return addresses


def node_ssh_hosts(
    session: Session, node: Node, addresses: list[HostAddress], *, deadline_s: float, need_names: bool
) -> list[SshHost]:
    """The hosts of ``node`` at ``addresses`` (worker order) as the executor reaches them: each with the
    host keys and instance name its VM published (:func:`expected_host_identities`) and the node's zone."""
    from tpuctl.hosts.ssh import SshHost

    found = expected_host_identities(session, node, deadline_s=deadline_s, need_names=need_names)
    return [
        SshHost(a.address, a.port, i.host_keys, i.instance_name, node.zone)
        for a, i in zip(addresses, found, strict=True)
    ]


def _planned_hosts(node: Node, addresses: list[HostAddress], *, first: int) -> list[SshHost]:
    """A plan's hosts: no key asked for, their instance names placeholders (known once the slice runs)."""
    from tpuctl.hosts.ssh import SshHost

    return [
        SshHost(a.address, a.port, None, f"<worker-{first + i} instance name>", node.zone)
        for i, a in enumerate(addresses)
    ]


def _needs_instance_names(proxy_command: str | None) -> bool:
    from tpuctl.hosts.ssh import proxy_command_tokens

    return proxy_command is not None and "%n" in proxy_command_tokens(proxy_command)


#: How long, once every host has published its keys, tpuctl still waits for instance names a ProxyCommand
#: needs (unc.: whether a TPU VM publishes its ``hostname`` with its keys or after them is not known); a
#: node that never publishes one (made before TPU VMs did) is refused after this, not after the whole wait.
NAMES_AFTER_KEYS_S = 30.0


def expected_host_identities(
    session: Session, node: Node, *, deadline_s: float, need_names: bool = False
) -> list[HostIdentity]:
    """Each host's SSH host keys as its guest agent published them (``getGuestAttributes``) and its
    instance name, waiting with a bounded backoff for hosts that have not published yet (a VM's agent
    starts after READY); ``need_names``: also for instance names, for at most ``NAMES_AFTER_KEYS_S``
    once the keys are there (a host still without one is refused by the executor, which names the
    host and the fix)."""
    deadline = time.monotonic() + deadline_s
    wait = 0.1
    error: str | None
    while True:
        try:
            found = session.cloud.host_identities(node.zone, node.name)
        except CloudError as exc:
            found, error, keyed = [], exc.message, False
        else:
            error = None
            keyed = len(found) == len(node.network_endpoints) and all(i.host_keys for i in found)
            named = not need_names or all(i.instance_name for i in found)
            if keyed and named:
                return found
        if keyed:
            deadline = min(deadline, time.monotonic() + NAMES_AFTER_KEYS_S)
        if time.monotonic() + wait > deadline:
            if keyed:
                return found
            raise _no_host_keys(node, [i.host_keys for i in found], deadline_s, error)
        time.sleep(wait)
        wait = min(wait * 2, 5.0)


def _no_host_keys(
    node: Node, keys: list[tuple[str, ...]], deadline_s: float, error: str | None
) -> RunFailedError:
    """Hosts that published no key after the wait: why, and what to do. A Compute Engine VM publishes its
    keys only where guest attributes are enabled (docs/google-facts.md#guest-attributes): tpuctl's own
    slices enable them; a slice made elsewhere may not."""
    from tpuctl.cloud.compute_shapes import GUEST_ATTRIBUTES_KEY

    missing = [str(w) for w, k in enumerate(keys) if not k] if keys else ["all"]
    what = (
        f"the hosts of {node.name} did not publish their SSH host keys within {deadline_s:g} s "
        f"(workers without keys: {', '.join(missing)}" + (f"; last error: {error})" if error else ")")
    )
    never_trusted = "tpuctl verifies every host's key before it connects and never trusts one on first use"
    enabled = node.metadata.get(GUEST_ATTRIBUTES_KEY, "").strip().lower() == "true"
    if node.surface is Surface.COMPUTE and not enabled:
        return RunFailedError(
            f"{what}: a Compute Engine VM publishes them as guest attributes only when its metadata (or the "
            f"project's) has {GUEST_ATTRIBUTES_KEY}=TRUE before it boots, and {node.name}'s does not",
            fix=f"create the slice with `tpuctl pod create` or `tpuctl run --type` (which set "
            f"{GUEST_ATTRIBUTES_KEY}=TRUE), or set {GUEST_ATTRIBUTES_KEY}=TRUE in the project's metadata "
            f"and create it again; {never_trusted}",
        )
    return RunFailedError(
        what, fix=f"check the slice's health (`tpuctl pod describe {node.name}`); {never_trusted}"
    )


def plan_executor(session: Session, prepared: PreparedRun, zone: str | None) -> SshExecutor:
    """The executor a plan asks for each host's command: the node's, or (no node yet) one of placeholder
    endpoints of the right size."""
    target = prepared.target
    if target.existing is not None:
        return build_executor(session, prepared, target.existing, for_plan=True)
    placement = target.placement
    assert placement is not None
    accel = target.accelerator
    hosts = accel.hosts

    def planned(name: str, first: int) -> Node:
        return Node(
            name=name,
            zone=zone or "<zone chosen by the allocator>",
            accelerator_type=accel.api_name,
            state="PLANNED",
            capacity=target.capacity,
            network_endpoints=tuple(
                NetworkEndpoint(f"<worker-{first + i} address>", 22) for i in range(hosts)
            ),
            surface=placement.surface,
        )

    names = placement.node_names
    return build_executor(
        session,
        prepared,
        SliceSet(target.name, tuple(planned(n, i * hosts) for i, n in enumerate(names))),
        for_plan=True,
    )


def notice_grace_s(session: Session) -> float:
    """The backend's preemption notice grace in real seconds; 0 when it cannot tell."""
    return session.backend.notice_grace_s(session.cloud) or 0.0


#: How long before a host maintenance the metadata server warns, where the backend cannot tell: Compute
#: Engine's documented 60 s (docs/google-facts.md#host-maintenance).
MAINTENANCE_NOTICE_S = 60.0


def maintenance_notice_s(session: Session) -> float:
    """The backend's maintenance notice in real seconds (Google's 60 s where it cannot tell)."""
    told = session.backend.maintenance_notice_s(session.cloud)
    return MAINTENANCE_NOTICE_S if told is None else told


def stop_left_hosts(session: Session, slices: SliceSet, run_id: str, access: HostAccess, key: KeyPair) -> int:
    """Over SSH with the run's ``key``, stop every process group a dead supervisor's run left on the
    hosts of ``slices`` (the program runs detached from SSH, so it outlives its supervisor), reaching
    them as the run did (``access``: its remote root and ProxyCommand). Returns how many were stopped."""
    return sum(_stop_left_on(session, node, run_id, access, key) for node in slices.nodes)


@dataclass(frozen=True)
class HostAccess:
    """How a run reached its hosts: its directory there and the ProxyCommand, if any (hosts without
    external IPs are reached only through it)."""

    remote_root: str
    proxy_command: str | None = None


def _stop_left_on(session: Session, given: Node, run_id: str, access: HostAccess, key: KeyPair) -> int:
    """``stop_left_hosts`` on one node, as the API has it now: a slice that is gone or unreachable has
    nothing left to stop (a deleted VM's processes went with it)."""
    from tpuctl.hosts.ssh import SshExecutor

    try:
        node = session.cloud.get_node(given.zone, given.name)
    except CloudError:
        return 0
    if node.state != "READY":
        return 0
    try:
        login = host_login(session, [node], key)
        addresses = session.backend.host_addresses(session.cloud, node)
        executor = SshExecutor(
            node_ssh_hosts(
                session,
                node,
                addresses,
                deadline_s=30.0,
                need_names=_needs_instance_names(access.proxy_command),
            ),
            login=login,
            key=key,
            remote_root=access.remote_root,
            connect_deadline_s=30.0,
            proxy_command=access.proxy_command,
        )
    except TpuctlError:
        return 0
    try:
        return executor.stop_leftovers(run_id)
    except TpuctlError:
        return 0
    finally:
        executor.close()
