"""A price refresh keeps the bundled table's note on a generation whose prices it kept from that table
(TPU7x: its unit is unconfirmed), and drops it where the world file sets that generation's prices."""

from __future__ import annotations

from pathlib import Path

from tpuctl.catalog import Catalog
from tpuctl.services.prices import load_catalog, refresh_from_world

T0 = 1_800_000_000.0


def test_a_world_refresh_keeps_the_tpu7x_note_unless_it_prices_tpu7x_itself(tmp_path: Path) -> None:
    note = Catalog.load().prices.notes["tpu7x"]
    refresh_from_world({}, "world.yaml", backend="sim", state_dir=tmp_path, now=T0)
    _catalog, source = load_catalog(tmp_path, "sim")
    assert source.cached and source.note_for("tpu7x") == note
    assert source.to_dict()["notes"] == {"tpu7x": note}

    overrides = {"tpu7x": {"us-central1": {"on_demand": 3.0}}}
    refresh_from_world(overrides, "world.yaml", backend="sim", state_dir=tmp_path, now=T0)  # type: ignore[arg-type]
    catalog, source = load_catalog(tmp_path, "sim")
    assert source.note_for("tpu7x") is None
    assert catalog.prices.prices["tpu7x"]["us-central1"]["on_demand"] == 3.0
