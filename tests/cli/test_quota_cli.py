"""`tpuctl quota` shows Compute Engine's TPU quotas with their TPU family beside the TPU API's, keeps the
long quota ids whole at 80 columns, and its JSON keeps its keys and adds ``tpu_family`` and ``surface``."""

from __future__ import annotations

import pytest

from tpuctl.catalog import CapacityType, Catalog, Surface
from tpuctl.cloud.base import Node, QuotaLimit, TpuCloud
from tpuctl.services.quota import QuotaBook
from tpuctl.testing.cli import Cli

FAMILY_Q = "TPUS-PER-TPU-FAMILY-per-project-region"
TPU7X_SPOT_Q = "PREEMPTIBLE-TPU7X-per-project-region"
TPU_API_Q = "TPUV6EPerProjectPerZoneForTPUAPI"
TERMINAL_80 = {"TTY_COMPATIBLE": "1", "COLUMNS": "80", "NO_COLOR": "1"}


def _book(cloud: TpuCloud, catalog: Catalog) -> QuotaBook:
    family = "compute.googleapis.com/tpus_per_tpu_family"
    limits = [
        QuotaLimit(FAMILY_Q, family, 0, region="us-central1"),
        QuotaLimit(FAMILY_Q, family, 128, region="us-central1", tpu_family="TPU7X"),
        QuotaLimit(TPU7X_SPOT_Q, "compute.googleapis.com/preemptible_tpu7x", 64, region="us-central1"),
        QuotaLimit(TPU_API_Q, "tpu.googleapis.com/tpu-v6e", 32, zone="us-central1-b"),
    ]
    nodes = [
        Node("train-7x", "us-central1-c", "tpu7x-64", "READY", CapacityType.SPOT, surface=Surface.COMPUTE),
        Node(
            "serve-7x", "us-central1-c", "tpu7x-16", "READY", CapacityType.ON_DEMAND, surface=Surface.COMPUTE
        ),
    ]
    return QuotaBook(catalog, limits, nodes)


@pytest.fixture(autouse=True)
def fixed_quotas(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(QuotaBook, "from_cloud", staticmethod(_book))


def test_json_lists_compute_quotas_with_their_family_and_surface(cli: Cli) -> None:
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


@pytest.mark.parametrize("env", [TERMINAL_80, {}], ids=["terminal-80", "piped"])
def test_text_keeps_quota_ids_whole_and_names_the_family(cli: Cli, env: dict[str, str]) -> None:
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
