"""The simulator's TPU API ``nodes.getGuestAttributes``: per worker, what a booted TPU VM publishes, its
SSH host key under ``hostkeys/`` and its instance name under the key ``hostname`` (what gcloud's
``tpu-vm ssh --tunnel-through-iap`` reads to open an IAP tunnel); nothing for a VM not booted yet."""

from __future__ import annotations

import re
from typing import Any

import httpx

from tpuctl.catalog import Surface
from tpuctl.cloud.base import NodeRequest
from tpuctl.sim.iam import ADC_TOKEN
from tpuctl.sim.vms.layout import disk_dir, host_key_path
from tpuctl.testing.backend import InProcessCli
from tpuctl.testing.cloud import ENDPOINT

ZONE = "us-east5-b"


def _guest_attributes(sim_cli: InProcessCli, body: dict[str, Any]) -> list[list[dict[str, str]]]:
    """Each answered worker's items, in answer order."""
    url = f"{ENDPOINT}/v2/projects/{sim_cli.world.project}/locations/{ZONE}/nodes/n1:getGuestAttributes"
    auth = {"Authorization": f"Bearer {ADC_TOKEN}"}
    with httpx.Client(transport=sim_cli.transport, headers=auth) as http:
        answer = http.post(url, json=body)
    assert answer.status_code == 200, answer.text
    return [a["queryValue"].get("items", []) for a in answer.json()["guestAttributes"]]


def test_each_booted_worker_publishes_its_instance_name_beside_its_host_key(sim_cli: InProcessCli) -> None:
    request = NodeRequest("n1", ZONE, "v5litepod-16", "v2-alpha-tpuv5-lite", surface=Surface.TPU_API)
    sim_cli.cloud().create_node(request)
    uid = sim_cli.sim.engine.get_node(sim_cli.world.project, ZONE, "n1")["id"]
    assert [items for items in _guest_attributes(sim_cli, {})] == [[]] * 4  # no VM booted yet
    for worker in (0, 2):  # booted: its disk holds the host key its sshd presents
        public = host_key_path(disk_dir(sim_cli.sim.engine.ctx.vm_root, uid, worker)).with_suffix(".pub")
        public.parent.mkdir(parents=True)
        public.write_text(f"ssh-ed25519 AAAAkey{worker}\n")

    everything = _guest_attributes(sim_cli, {})
    names = {w: [i["value"] for i in items if i["key"] == "hostname"] for w, items in enumerate(everything)}
    assert names[1] == names[3] == []
    (first,), (third,) = names[0], names[2]
    # Google's TPU VM workers are named t1v-n-<8 hex>-w-<worker>; one node's workers share the middle.
    assert re.fullmatch(r"t1v-n-[0-9a-f]{8}-w-0", first) and third == first.replace("-w-0", "-w-2")
    assert {i["key"]: i["value"] for i in everything[0]} == {"ssh-ed25519": "AAAAkey0", "hostname": first}

    # Asked worker by worker, as tpuctl asks: the same per worker.
    assert _guest_attributes(sim_cli, {"workerIds": ["2"]}) == [everything[2]]
    # A query path selects: the host keys alone, or the name alone under its namespace.
    (keys_only,) = _guest_attributes(sim_cli, {"queryPath": "hostkeys/", "workerIds": ["0"]})
    assert [i["key"] for i in keys_only] == ["ssh-ed25519"]
    (name_only,) = _guest_attributes(sim_cli, {"queryPath": "tpu/hostname", "workerIds": ["0"]})
    assert [i["value"] for i in name_only] == [first]
    # The instance name is the one the worker's metadata server gives (instance/name).
    engine = sim_cli.sim.engine
    assert [engine.metadata_value(ZONE, "n1", w, "instance/name") for w in (0, 2)] == [first, third]
