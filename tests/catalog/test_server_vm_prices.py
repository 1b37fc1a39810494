"""The server VM's monthly cost at catalog prices."""

from __future__ import annotations

from tpuctl.catalog.server_vm_prices import general_machine_types, server_vm_cost


def test_e2_small_always_on_costs_what_the_readme_says() -> None:
    cost = server_vm_cost("e2-small", "us-central1", 20)
    assert cost.machine_usd == 12.23  # 0.016751 USD/h x 730 h
    assert cost.disk_usd == 2.0  # 20 GB x 0.10 USD/GB-month
    assert cost.address_usd == 3.65  # 0.005 USD/h x 730 h
    assert cost.total_usd == 17.88


def test_a_region_without_a_price_has_no_total() -> None:
    cost = server_vm_cost("e2-small", "asia-south2", 20)
    assert cost.machine_usd is None and cost.total_usd is None


def test_the_catalog_knows_the_small_types() -> None:
    assert {"e2-micro", "e2-small", "e2-medium", "e2-standard-2"} <= set(general_machine_types())
