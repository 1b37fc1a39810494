"""General-purpose VMs on the simulated Compute Engine (the team server's e2-small), with the REAL
google-cloud-compute client and the exact body `tpuctl server up` sends."""

from __future__ import annotations

import json
import os
from pathlib import Path

import asyncssh
import httpx
import pytest
from api_schema import schema_problems
from compute_helpers import ZONE, Clients, compute
from google.api_core import exceptions
from google.cloud import compute_v1
from sim_helpers import PROJECT, tpu_client

from tpuctl.backends.sim import SIM_BUCKET, sim_credentials
from tpuctl.errors import NotFoundError
from tpuctl.hosts.ssh import HostLogin, KeyPair, SshExecutor, SshHost
from tpuctl.services.server_vm.install import install_server, run_on_vm, wait_ready
from tpuctl.services.server_vm.plan import UNIT_STATE_COMMAND, ServerVmSpec, instance_body, plan_down
from tpuctl.services.server_vm.wheel import build_server_wheel
from tpuctl.sim import SimServer
from tpuctl.sim.admin import SimAdminClient, SimAdminError
from tpuctl.sim.mirror import default_wheelhouse
from tpuctl.testing.clock import wait_for

__all__ = ["compute", "schema_problems"]  # fixtures


def _server_vm(**scheduling: object) -> compute_v1.Instance:
    body = instance_body(ServerVmSpec(project=PROJECT, zone=ZONE, name="srv"))
    body["scheduling"].update(scheduling)
    instance: compute_v1.Instance = compute_v1.Instance.from_json(json.dumps(body))
    return instance


def test_machine_types_list_and_get_the_general_purpose_types(compute: tuple[SimServer, Clients]) -> None:
    server, _ = compute
    client = compute_v1.MachineTypesClient(
        client_options={"api_endpoint": server.url},
        credentials=sim_credentials(),
    )
    small = client.get(project=PROJECT, zone=ZONE, machine_type="e2-small")
    assert (small.guest_cpus, small.memory_mb, small.is_shared_cpu) == (2, 2048, True)
    assert not small.accelerators
    names = [m.name for m in client.list(project=PROJECT, zone=ZONE)]
    assert {"e2-small", "e2-standard-2", "tpu7x-standard-4t"} <= set(names) and names == sorted(names)


def test_the_server_vm_runs_with_its_own_account_and_no_tpu(compute: tuple[SimServer, Clients]) -> None:
    server, c = compute
    done = c.done(c.instances.insert(project=PROJECT, zone=ZONE, instance_resource=_server_vm()))
    assert not done.http_error_status_code
    vm = c.instances.get(project=PROJECT, zone=ZONE, instance="srv")
    assert vm.status == "RUNNING" and vm.machine_type.endswith("/machineTypes/e2-small")
    assert vm.scheduling.provisioning_model == "STANDARD"
    assert vm.scheduling.on_host_maintenance == "MIGRATE" and vm.scheduling.automatic_restart
    assert vm.labels == {"tpuctl-server": "srv"}
    assert list(tpu_client(server.url).list_nodes(parent=f"projects/{PROJECT}/locations/{ZONE}")) == []
    address = vm.network_interfaces[0].network_i_p
    wait_for(lambda: any(h.address == address for h in server.fleet.served()), timeout=30)
    base = f"http://{address}:{server.metadata_port}/computeMetadata/v1/instance/"
    with httpx.Client(headers={"Metadata-Flavor": "Google"}) as http:
        assert http.get(base + "name").text == "srv"
        assert http.get(base + "attributes/enable-oslogin").text == "TRUE"
        assert http.get(base + "attributes/accelerator-type").status_code == 404
        assert http.get(base + "attributes/tpu-env").status_code == 404
        token = http.get(base + "service-accounts/default/token")
        assert token.status_code == 200 and token.json()["access_token"]
    with pytest.raises(SimAdminError, match="srv") as refused:  # standard provisioning: never preempted
        SimAdminClient(server.url).preempt_compute(ZONE, "srv")
    assert refused.value.http_status == 400
    with pytest.raises(NotFoundError, match="nodes/srv"):  # nor is it a TPU API node
        SimAdminClient(server.url).preempt(ZONE, "srv")
    deleted = c.done(c.instances.delete(project=PROJECT, zone=ZONE, instance="srv"))
    assert not deleted.http_error_status_code
    with pytest.raises(exceptions.NotFound):
        c.instances.get(project=PROJECT, zone=ZONE, instance="srv")


def test_spot_that_would_live_migrate_is_refused_as_google_refuses_it(
    compute: tuple[SimServer, Clients],
) -> None:
    _, c = compute
    body = _server_vm(provisioningModel="SPOT", automaticRestart=False)
    with pytest.raises(
        exceptions.BadRequest, match="preemptible be false when OnHostMaintenance isn't TERMINATE"
    ):
        c.instances.insert(project=PROJECT, zone=ZONE, instance_resource=body)


def test_accelerators_on_e2_are_refused(compute: tuple[SimServer, Clients]) -> None:
    _, c = compute
    body = _server_vm()
    body.guest_accelerators = [
        compute_v1.AcceleratorConfig(accelerator_type="nvidia-t4", accelerator_count=1)
    ]
    with pytest.raises(exceptions.BadRequest, match="does not support accelerators"):
        c.instances.insert(project=PROJECT, zone=ZONE, instance_resource=body)


def _server_vm_up(
    server: SimServer,
    c: Clients,
    spec: ServerVmSpec,
    key: tuple[Path, str],
    tmp_path: Path,
    lines: list[str],
) -> SshExecutor:
    """server up's steps on a simulated VM: created (ssh-keys metadata here, OS Login in server up), the
    server installed and started over SSH, /readyz awaited."""
    body = instance_body(spec)
    body["metadata"]["items"] = [
        {"key": "enable-oslogin", "value": "FALSE"},
        {"key": "ssh-keys", "value": f"admin:{key[1]}"},
    ]
    instance = compute_v1.Instance.from_json(json.dumps(body))
    assert not c.done(c.instances.insert(project=PROJECT, zone=ZONE, instance_resource=instance)).error
    vm = c.instances.get(project=PROJECT, zone=ZONE, instance=spec.name)
    address = vm.network_interfaces[0].network_i_p
    wait_for(lambda: any(h.address == address for h in server.fleet.served()), timeout=60)
    login = HostLogin("admin", authorized_by="the VM's ssh-keys metadata", refused_fix="-")
    executor = SshExecutor(
        [SshHost(address, server.ssh_port)], login=login, key=KeyPair(*key), verify_host_keys=False
    )
    try:
        install_server(
            executor,
            spec,
            build_server_wheel(tmp_path / "dist"),
            uv_wheelhouses=[default_wheelhouse(os.environ)],
            uv_download_dir=tmp_path / "uv-wheels",
            on_line=lines.append,
        )
        assert wait_ready(executor, 120) >= 0
    except BaseException:
        executor.abandon()
        raise
    return executor


@pytest.mark.slow
def test_the_team_server_installs_runs_and_comes_back_from_its_copy(
    one_server_vm: None, compute: tuple[SimServer, Clients], tmp_path: Path
) -> None:
    """What server up and down do on the VM, on a simulated one with a stock image: tpuctl's wheel
    copied over SSH, installed by the runs' host setup with its locked dependencies from the mirror
    (served from the uv cache), the user units enabled and started through the image's systemctl,
    /readyz answered; down's final copy to the bucket; a new VM's up restores it before the server
    starts."""
    server, c = compute
    key = asyncssh.generate_private_key("ssh-ed25519")
    key_file = tmp_path / "id"
    key.write_private_key(str(key_file))
    public = key.export_public_key().decode().strip()
    # Nothing in the spec says which simulator: the VM's logins do (the network's API address).
    spec = ServerVmSpec(project=PROJECT, zone=ZONE, name="srv", bucket=SIM_BUCKET)
    lines: list[str] = []
    executor = _server_vm_up(server, c, spec, (key_file, public), tmp_path, lines)
    try:
        state = run_on_vm(executor, UNIT_STATE_COMMAND, lines.append)
        assert (state.exit_status, state.tail) == (0, ("active",))
        journal = run_on_vm(executor, "journalctl --user -u tpuctl-server -n 50", lines.append)
        assert any("Started tpuctl team server" in line for line in journal.tail), journal.tail
        for step in plan_down(spec, server.url, keep_disk=False).steps:
            if step.command is not None:
                done = run_on_vm(executor, step.command, lines.append)
                assert done.exit_status == 0, (step.what, done.tail)
        assert any(f"gs://{SIM_BUCKET}/tpuctl-server/srv/" in line for line in lines), lines[-10:]
    finally:
        executor.abandon()
    assert not c.done(c.instances.delete(project=PROJECT, zone=ZONE, instance="srv")).error
    lines.clear()
    again = _server_vm_up(server, c, spec, (key_file, public), tmp_path, lines)
    try:
        # The restore ran before the units were installed, and said what it restored.
        restored = [i for i, line in enumerate(lines) if line.startswith(f"restored gs://{SIM_BUCKET}/")]
        assert restored, lines[-20:]
        ledger = run_on_vm(again, "ls .local/state/tpuctl-server", lines.append)
        assert "ledger.db" in ledger.tail
    finally:
        again.abandon()
