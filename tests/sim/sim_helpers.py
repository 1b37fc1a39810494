"""Helpers for the simulator's tests: a fast world, the REAL google-cloud-tpu client, an injectable clock,
node bodies and polling."""

from __future__ import annotations

import copy
from typing import Any

from google.api_core.future import polling
from google.cloud import tpu_v2

from tpuctl.backends.sim import sim_credentials
from tpuctl.sim.iam import ADC_TOKEN
from tpuctl.sim.world import World, world_from_data

PROJECT = "tpuctl-sim"
ZONE = "us-central1-a"
PARENT = f"projects/{PROJECT}/locations/{ZONE}"
#: What a raw request to the simulator's APIs sends: the simulated Application Default Credentials' token
#: (the world's principal), as tpuctl's own clients do.
AUTH = {"Authorization": f"Bearer {ADC_TOKEN}"}

# LRO polling for tests: the client's default starts at 1 s and grows by 1.5x, far slower than a fast
# world. Callers of the cloud client should pass something like this against the simulator too.
FAST_POLLING = polling.DEFAULT_POLLING.with_delay(initial=0.01, maximum=0.05, multiplier=1.5).with_timeout(20)

BASE_WORLD: dict[str, Any] = {
    "project": PROJECT,
    # 1000x: a 120 s create takes 0.12 s, a 30 s delete 0.03 s.
    "speed": 1000,
    "seed": 7,
    "zones": {
        "us-central1-a": {
            "v5e": {"on_demand": 64, "preemptible": 64},
            "v5p": {"on_demand": 16, "preemptible": 16},
        },
        "us-central1-b": {"v6e": {"on_demand": 32, "preemptible": 32}},
        "us-east5-b": {"v5e": {"on_demand": 32, "preemptible": 32}},
    },
    "reservations": [{"name": "res-a", "zone": "us-central1-a", "generation": "v5e", "chips": 16}],
    "quotas": {
        "default": {"on_demand": {"zone": 512, "region": 1024}, "preemptible": {"zone": 512, "region": 1024}}
    },
    "latency": {"base_ms": 0, "jitter_ms": 0},
    "durations": {
        "node_create_s": 120,
        "node_delete_s": 30,
        "node_stop_s": 30,
        "node_start_s": 30,
        "queued_provision_s": 60,
        "stockout_s": 10,
        # REAL seconds (the grace is never scaled by speed): what 30 simulated seconds were at 1000x.
        "preemption_grace_s": 0.03,
    },
}


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def make_world(**overrides: Any) -> World:
    """The base test world with ``overrides`` deep-merged in (dicts merge, everything else replaces)."""
    return world_from_data(_merge(BASE_WORLD, overrides), "test world")


def tpu_client(url: str) -> tpu_v2.TpuClient:
    return tpu_v2.TpuClient(
        credentials=sim_credentials(), transport="rest", client_options={"api_endpoint": url}
    )


def node(accelerator_type: str = "v5litepod-8", **fields: Any) -> tpu_v2.Node:
    runtime = {"v5litepod": "v2-alpha-tpuv5-lite", "v5p": "v2-alpha-tpuv5", "v6e": "v2-alpha-tpuv6e"}
    return tpu_v2.Node(
        accelerator_type=accelerator_type,
        runtime_version=runtime.get(accelerator_type.rsplit("-", 1)[0], "tpu-ubuntu2204-base"),
        **fields,
    )


def spot_node(accelerator_type: str = "v5litepod-8", **fields: Any) -> tpu_v2.Node:
    return node(accelerator_type, scheduling_config=tpu_v2.SchedulingConfig(spot=True), **fields)


def create_ready(
    client: tpu_v2.TpuClient, node_id: str, body: tpu_v2.Node, parent: str = PARENT
) -> tpu_v2.Node:
    result: tpu_v2.Node = client.create_node(parent=parent, node_id=node_id, node=body).result(
        polling=FAST_POLLING
    )
    return result
