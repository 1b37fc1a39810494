"""``instances.getGuestAttributes`` on the simulator's Compute Engine surface: each VM's guest agent
publishes the SSH host key its sshd presents under ``hostkeys/``, read with the real google-cloud-compute
client and through ``ComputeCloud.host_keys``; only where guest attributes are enabled (metadata
``enable-guest-attributes``, the instance's value over the project's, off unless set); nothing published
and no instance are 404s."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncssh
import pytest
from api_schema import schema_problems
from compute_helpers import ZONE, Clients, compute, compute_world, instance_body
from google.api_core import exceptions
from google.cloud import compute_v1
from sim_helpers import PROJECT

from tpuctl.catalog import Catalog, Surface
from tpuctl.cloud.base import NodeRequest
from tpuctl.cloud.compute import ComputeCloud
from tpuctl.sim import SimAdminClient, SimServer
from tpuctl.sim.compute import store
from tpuctl.testing.clock import wait_for

__all__ = ["compute", "schema_problems"]  # fixtures

USER = "alice"


def _presented_key(server: SimServer, address: str, key: asyncssh.SSHKey) -> str:
    """The base64 host key an SSH client is shown by the VM at ``address``."""

    async def fetch() -> str:
        async with asyncssh.connect(
            address, server.ssh_port, username=USER, client_keys=[key], known_hosts=None, connect_timeout=10
        ) as conn:
            host_key = conn.get_server_host_key()
            assert host_key is not None
            return host_key.export_public_key().decode().split()[1]

    return asyncio.run(fetch())


def _create(cloud: ComputeCloud, name: str, accelerator_type: str, key: asyncssh.SSHKey) -> list[str]:
    """A READY slice (created by ComputeCloud): its instances' addresses in worker order."""
    public = key.export_public_key().decode().strip()
    request = NodeRequest(
        name=name,
        zone=ZONE,
        accelerator_type=accelerator_type,
        runtime_version="",
        metadata={"ssh-keys": f"{USER}:{public}"},
        surface=Surface.COMPUTE,
    )
    node = cloud.create_node(request)
    return [e.ip_address for e in node.network_endpoints]


def _hostkeys(c: Clients, instance: str, query_path: str = "hostkeys/") -> compute_v1.GuestAttributes:
    # query_path is a field of the request only: the client's flattened arguments are project, zone and
    # instance (google-cloud-compute 1.57).
    request = {"project": PROJECT, "zone": ZONE, "instance": instance, "query_path": query_path}
    return c.instances.get_guest_attributes(request=request)


def _slices(server: SimServer, cloud: ComputeCloud, key: asyncssh.SSHKey) -> dict[str, list[str]]:
    """A one-host slice ``one`` and a two-host MIG slice ``mig``, READY and served: their addresses."""
    slices = {"one": _create(cloud, "one", "tpu7x-8", key), "mig": _create(cloud, "mig", "tpu7x-16", key)}
    assert [len(a) for a in slices.values()] == [1, 2]
    every = {a for addresses in slices.values() for a in addresses}
    wait_for(lambda: {h.address for h in server.fleet.served()} >= every, timeout=30, what="hosts served")
    return slices


#: Each slice's engine node (its VMs' disks, in worker order).
NODE_IDS = {"one": store.instance_node_id("one"), "mig": store.mig_node_id("mig")}


def test_each_host_publishes_the_key_its_sshd_presents(compute: tuple[SimServer, Clients]) -> None:
    server, c = compute
    key = asyncssh.generate_private_key("ssh-ed25519")
    cloud = ComputeCloud.for_simulator(PROJECT, Catalog.load(), server.url)
    addresses = _slices(server, cloud, key)
    cloud.close()
    by_address = {
        i.network_interfaces[0].network_i_p: i.name for i in c.instances.list(project=PROJECT, zone=ZONE)
    }
    published: dict[str, list[str]] = {}
    for slice_name, slice_addresses in addresses.items():
        for address in slice_addresses:
            answer = _hostkeys(c, by_address[address])
            assert answer.kind == "compute#guestAttributes" and answer.query_path == "hostkeys/"
            (item,) = answer.query_value.items
            assert (item.namespace, item.key) == ("hostkeys", "ssh-ed25519")
            assert item.value == _presented_key(server, address, key)
            published.setdefault(slice_name, []).append(item.value)
    assert len({v for values in published.values() for v in values}) == 3  # one key per VM
    for slice_name, node_id in NODE_IDS.items():
        disks = server.engine.host_keys(PROJECT, ZONE, node_id)  # worker order
        assert [line.split()[1] for line in disks if line] == published[slice_name]


def test_compute_cloud_reads_each_hosts_keys_and_instance_name_in_worker_order(
    compute: tuple[SimServer, Clients],
) -> None:
    server, c = compute
    cloud = ComputeCloud.for_simulator(PROJECT, Catalog.load(), server.url)
    addresses = _slices(server, cloud, asyncssh.generate_private_key("ssh-ed25519"))
    address_of = {
        i.name: i.network_interfaces[0].network_i_p for i in c.instances.list(project=PROJECT, zone=ZONE)
    }
    for slice_name, node_id in NODE_IDS.items():
        disks = server.engine.host_keys(PROJECT, ZONE, node_id)
        assert all(disks)
        identities = cloud.host_identities(ZONE, slice_name)
        assert [i.host_keys for i in identities] == [(line,) for line in disks]
        # The instance an IAP tunnel targets for each worker: the VM at that worker's address.
        assert [address_of[str(i.instance_name)] for i in identities] == addresses[slice_name]
    cloud.close()


def test_one_key_by_path_or_by_variable_key(compute: tuple[SimServer, Clients]) -> None:
    server, c = compute
    cloud = ComputeCloud.for_simulator(PROJECT, Catalog.load(), server.url)
    (address,) = _create(cloud, "vm", "tpu7x-8", asyncssh.generate_private_key("ssh-ed25519"))
    wait_for(lambda: any(h.address == address for h in server.fleet.served()), timeout=30, what="host served")
    (line,) = server.engine.host_keys(PROJECT, ZONE, store.instance_node_id("vm"))
    assert line is not None
    key_type, blob = line.split()[:2]
    (item,) = _hostkeys(c, "vm", f"hostkeys/{key_type}").query_value.items
    assert item.value == blob
    assert [i.value for i in _hostkeys(c, "vm", "").query_value.items] == [blob]  # '' is every attribute
    by_key = c.instances.get_guest_attributes(
        request={"project": PROJECT, "zone": ZONE, "instance": "vm", "variable_key": f"hostkeys/{key_type}"}
    )
    assert (by_key.variable_key, by_key.variable_value) == (f"hostkeys/{key_type}", blob)
    for path in ("hostkeys/ssh-rsa", "hostkeys", "startup/"):
        with pytest.raises(exceptions.NotFound) as missing:
            _hostkeys(c, "vm", path)
        message = f": The resource '{path}' of type 'Guest Attribute' was not found."
        assert missing.value.message.endswith(message)
    cloud.close()


def test_nothing_published_and_no_instance_are_not_found(
    start_server: Any, schema_problems: list[str]
) -> None:
    server = start_server(compute_world())
    c = Clients(server.url)
    with SimAdminClient(server.url) as admin:
        admin.stockout(ZONE)
    # A flex-start VM waiting for capacity has no host, so no disk, so its agent published nothing.
    body = instance_body("waiting", model="FLEX_START", max_run_duration=compute_v1.Duration(seconds=3600))
    body.params = compute_v1.InstanceParams(request_valid_for_duration=compute_v1.Duration(seconds=7200))
    c.instances.insert(project=PROJECT, zone=ZONE, instance_resource=body)
    assert c.instances.get(project=PROJECT, zone=ZONE, instance="waiting").status == "PENDING"
    with pytest.raises(exceptions.NotFound) as unpublished:
        _hostkeys(c, "waiting")
    assert unpublished.value.message.endswith(
        ": The resource 'hostkeys/' of type 'Guest Attribute' was not found."
    )
    assert unpublished.value.errors[0]["reason"] == "notFound"
    with pytest.raises(exceptions.NotFound) as absent:
        _hostkeys(c, "nope")
    gone = f": The resource 'projects/{PROJECT}/zones/{ZONE}/instances/nope' was not found"
    assert absent.value.message.endswith(gone)
    assert absent.value.errors[0]["reason"] == "notFound"


def _served_instances(server: SimServer, c: Clients, names: list[str]) -> None:
    """Every one of ``names`` (instances.insert'ed) RUNNING with its host served."""
    wait_for(
        lambda: all(
            c.instances.get(project=PROJECT, zone=ZONE, instance=n).status == "RUNNING" for n in names
        ),
        timeout=30,
        what="instances RUNNING",
    )
    addresses = {
        c.instances.get(project=PROJECT, zone=ZONE, instance=n).network_interfaces[0].network_i_p
        for n in names
    }
    wait_for(lambda: {h.address for h in server.fleet.served()} >= addresses, timeout=30, what="hosts served")


def _publishes(c: Clients, instance: str) -> bool:
    try:
        (item,) = _hostkeys(c, instance).query_value.items
    except exceptions.NotFound:
        return False
    return item.namespace == "hostkeys" and bool(item.value)


def _insert(c: Clients, name: str, guest_attributes: str | None) -> None:
    metadata = {} if guest_attributes is None else {"enable-guest-attributes": guest_attributes}
    c.instances.insert(project=PROJECT, zone=ZONE, instance_resource=instance_body(name, metadata=metadata))


def test_host_keys_are_published_only_where_the_instance_enables_guest_attributes(
    start_server: Any, schema_problems: list[str]
) -> None:
    """Compute Engine's default: no guest attributes unless the metadata says TRUE (any case, as gcloud
    reads it); the world's project metadata does not enable them here."""
    server = start_server(compute_world())
    assert server.engine.ctx.world.guest_attributes is False  # the stricter default
    c = Clients(server.url)
    wanted = {"plain": None, "on": "TRUE", "lower": "true", "off": "FALSE"}
    for name, value in wanted.items():
        _insert(c, name, value)
    _served_instances(server, c, list(wanted))
    assert {name: _publishes(c, name) for name in wanted} == {
        "plain": False,
        "on": True,
        "lower": True,
        "off": False,
    }
    with pytest.raises(exceptions.NotFound) as unpublished:
        _hostkeys(c, "plain")
    assert unpublished.value.message.endswith(
        ": The resource 'hostkeys/' of type 'Guest Attribute' was not found."
    )


def test_the_projects_guest_attributes_apply_where_the_instance_says_nothing(
    start_server: Any, schema_problems: list[str]
) -> None:
    server = start_server(compute_world(guest_attributes=True))
    c = Clients(server.url)
    _insert(c, "plain", None)
    _insert(c, "off", "FALSE")  # the instance's own value wins over the project's
    _served_instances(server, c, ["plain", "off"])
    assert (_publishes(c, "plain"), _publishes(c, "off")) == (True, False)
