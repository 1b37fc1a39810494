"""`tpuctl quota` shows Compute Engine's TPU quotas with their TPU family beside the TPU API's, keeps the
long quota ids whole at 80 columns, and its JSON keeps its keys and adds ``tpu_family`` and ``surface``."""

from __future__ import annotations

from typing import Any

import pytest

from tpuctl.testing.backend import InProcessCli

FAMILY_Q = "TPUS-PER-TPU-FAMILY-per-project-region"
TPU7X_SPOT_Q = "PREEMPTIBLE-TPU7X-per-project-region"
TPU_API_Q = "TPUV6EPerProjectPerZoneForTPUAPI"
TERMINAL_80 = {"TTY_COMPATIBLE": "1", "COLUMNS": "80", "NO_COLOR": "1"}
ZONE = "us-central1-c"

#: TPU7x on Compute Engine in us-central1-c: its per-family quota is 0 for every family but TPU7X's 128,
#: and 64 preemptible chips.
COMPUTE_ONLY: dict[str, Any] = {
    "speed": 1000,
    "zones": {ZONE: {"tpu7x": {"on_demand": 64, "preemptible": 64}}},
    "compute_quotas": [
        {"quota_id": FAMILY_Q, "location": "us-central1", "limit": 0},
        {"quota_id": FAMILY_Q, "location": "us-central1", "tpu_family": "TPU7X", "limit": 128},
        {"quota_id": TPU7X_SPOT_Q, "location": "us-central1", "limit": 64},
    ],
    "latency": {"base_ms": 0, "jitter_ms": 0},
}


@pytest.fixture
def sim_world() -> dict[str, Any]:
    """COMPUTE_ONLY's TPU7x, and v6e on the TPU API in us-central1-b (32 chips in that zone)."""
    return {
        **COMPUTE_ONLY,
        "zones": {
            ZONE: {"tpu7x": {"on_demand": 64, "preemptible": 64}},
            "us-central1-b": {"v6e": {"on_demand": 64, "preemptible": 64}},
        },
        "quotas": {
            "default": {"on_demand": {"zone": 32, "region": 64}, "preemptible": {"zone": 32, "region": 64}}
        },
    }


@pytest.fixture
def cli(sim_cli: InProcessCli) -> InProcessCli:
    """Two TPU7x slices in use: 32 spot chips (a tpu7x-64) and 8 on-demand ones (a tpu7x-16)."""
    for name, accel, spot in (("train-7x", "tpu7x-64", ("--spot",)), ("serve-7x", "tpu7x-16", ())):
        created = sim_cli("pod", "create", accel, *spot, "--name", name, "--zone", ZONE)
        assert created.code == 0, created.stderr
    return sim_cli


def test_json_lists_compute_quotas_with_their_family_and_surface(cli: InProcessCli) -> None:
    result = cli("quota", "-o", "json")
    assert result.code == 0, result.stderr
    rows = {(q["quota_id"], q["tpu_family"]): q for q in result.json["quotas"]}
    assert rows[(FAMILY_Q, "TPU7X")] == {
        "quota_id": FAMILY_Q,
        "scope": "region",
        "location": "us-central1",
        "limit": 128,
        "in_use": 8,  # tpu7x-16: 8 chips
        "available": 120,
        "unit": "chips",
        "preempted_holding": 0,
        "reclaimable": 0,
        "tpu_family": "TPU7X",
        "surface": "compute",
    }
    assert (rows[(TPU7X_SPOT_Q, None)]["in_use"], rows[(TPU7X_SPOT_Q, None)]["available"]) == (32, 32)
    assert rows[(TPU_API_Q, None)]["surface"] == "tpu"


# Without the TPU API's quotas: their longest ids (45 characters) leave no room for the figures at 80
# columns.
@pytest.mark.parametrize("sim_world", [COMPUTE_ONLY])
@pytest.mark.parametrize("env", [TERMINAL_80, {}], ids=["terminal-80", "piped"])
def test_text_keeps_quota_ids_whole_and_names_the_family(cli: InProcessCli, env: dict[str, str]) -> None:
    result = cli("quota", "--all", env=env)
    assert result.code == 0, result.stderr
    assert "…" not in result.stdout
    lines = result.stdout.splitlines()
    family_rows = [line for line in lines if FAMILY_Q in line]
    assert len(family_rows) == 2  # TPU7X, and every other family's limit (0: shown with --all)
    assert any("TPU7X" in line and "128" in line for line in family_rows)
    assert any("(others)" in line for line in family_rows)
    assert any(TPU7X_SPOT_Q in line and "us-central1" in line for line in lines)
    if not env:
        header = lines[1].split()  # under the title
        assert header[:3] == ["QUOTA", "FAMILY", "LOCATION"] and header[-1] == "API"


@pytest.mark.parametrize("args", [("tpu7x",), ("--accelerator-type", "tpu7x-16")])
def test_a_type_or_generation_keeps_only_its_quotas(sim_cli: InProcessCli, args: tuple[str, ...]) -> None:
    result = sim_cli("quota", *args, "-o", "json")
    assert result.code == 0, result.stderr
    assert {(q["quota_id"], q["tpu_family"]) for q in result.json["quotas"]} == {
        (FAMILY_Q, "TPU7X"),
        (TPU7X_SPOT_Q, None),
    }


def test_an_unknown_generation_is_exit_2_listing_them(sim_cli: InProcessCli) -> None:
    result = sim_cli("quota", "v9")
    assert result.code == 2 and "v5e" in result.stderr
