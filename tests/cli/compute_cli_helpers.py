"""What the Compute Engine CLI tests share: a fast world with TPU7x in two zones (and v5e and v6e for the
API choice), Compute quotas, and a raw GET of a Compute resource from the simulator."""

from __future__ import annotations

from typing import Any

import httpx

from tpuctl.sim import SimAdminClient

ZONE = "us-central1-c"
OTHER_ZONE = "us-central1-ai1a"
REGION = "us-central1"

WORLD: dict[str, Any] = {
    "speed": 1000,
    "zones": {
        ZONE: {"tpu7x": {"on_demand": 64, "preemptible": 64}},
        OTHER_ZONE: {"tpu7x": {"on_demand": 64, "preemptible": 64}},
        "us-central1-a": {"v5e": {"on_demand": 8, "preemptible": 8}},
        "us-central1-b": {"v6e": {"on_demand": 8, "preemptible": 8}},
    },
    "quotas": {
        "default": {"on_demand": {"zone": -1, "region": -1}, "preemptible": {"zone": -1, "region": -1}}
    },
    "compute_quotas": [
        {"quota_id": "TPUS-PER-TPU-FAMILY-per-project-region", "limit": 256},
        {"quota_id": "PREEMPTIBLE-TPU7X-per-project-region", "limit": 256},
        {"quota_id": "PREEMPTIBLE-TPU-V6E-per-project-region", "limit": 8},
    ],
    "latency": {"base_ms": 0, "jitter_ms": 0},
}


def compute_get(
    admin: SimAdminClient, path: str, *, transport: httpx.BaseTransport | None = None
) -> httpx.Response:
    """GET ``/compute/v1/projects/<the simulator's project>/<path>`` from the simulator ``admin`` steers;
    ``transport``: how to reach it (``InProcessCli.transport`` for the in-process one)."""
    from tpuctl.sim.iam import ADC_TOKEN

    project = admin.status()["project"]
    # As tpuctl calls it: with the simulated Application Default Credentials.
    auth = {"Authorization": f"Bearer {ADC_TOKEN}"}
    with httpx.Client(transport=transport, trust_env=False, headers=auth) as http:
        return http.get(f"{admin.base_url}/compute/v1/projects/{project}/{path}")
