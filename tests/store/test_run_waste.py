"""Revision 0005: ``run_waste``, per run the quota its preempted slices held until deleted and their
recomputed work, kept by triggers on both engines through single, bulk and hand-made writes, backfilled
when a ledger at 0004 is upgraded, and re-derived by ``check_view``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from ledger_sql import kept_run_sums, ledger_at_revision, write_by_hand
from test_owner_rollup import D0, Z, _life, _one_by_one

from tpuctl.catalog import CapacityType
from tpuctl.store import EventKind, Ledger
from tpuctl.store.records import SegmentKind
from tpuctl.store.run_waste import WASTE

OpenLedger = Callable[..., Ledger]
SPOT = CapacityType.SPOT


def _kept(ledger: Ledger) -> dict[str, tuple[float, ...]]:
    """The table's runs with something left and their sums, checked (``ledger_sql.kept_run_sums``)."""
    kept: dict[str, tuple[float, ...]] = kept_run_sums(ledger, WASTE)
    return kept


def test_the_triggers_keep_each_runs_waste_through_every_write(open_ledger: OpenLedger) -> None:
    with open_ledger() as ledger:
        for run in ("r1", "r2", "r3"):
            ledger.create_run(run, script="train.py", ts=D0)
        # r1: a spot slice preempted, deleted 4000 s later (8 chips at 1.5 USD/chip-hour)...
        _one_by_one(
            ledger, _life("held", D0 + 1000, D0 + 5000, EventKind.PREEMPTED, capacity=SPOT, run_id="r1")
        )
        assert _kept(ledger) == {}  # still held: not stored until deleted (it grows with the clock)
        ledger.record_event(EventKind.DELETED, pod="held", zone=Z, ts=D0 + 9000)
        # ... and a slice whose segment redid 40 of its 100 steps (the ledger's recomputed work).
        _one_by_one(ledger, _life("work", D0 + 1000, D0 + 3000, run_id="r1"))
        segment = ledger.add_segment("r1", SegmentKind.RUNNING, start=D0 + 1000, pod="work", zone=Z)
        ledger.close_segment(segment, end=D0 + 3000, steps_completed=100, steps_recomputed=40)
        # r2: a preempted slice with no price; r3: written in bulk; none: a slice no run created.
        _one_by_one(ledger, _life("unpriced", D0 + 100, D0 + 2100, EventKind.PREEMPTED, capacity=SPOT,
                                  price_per_chip_hour=None, run_id="r2"))  # fmt: skip
        ledger.record_event(EventKind.DELETED, pod="unpriced", zone=Z, ts=D0 + 4100)
        bulk = _life("bulk", D0 + 100, D0 + 1100, EventKind.PREEMPTED, capacity=SPOT, run_id="r3")
        ledger.record_events_bulk([*bulk, bulk[-1]._replace(kind=EventKind.DELETED, ts=D0 + 1600)])
        _one_by_one(ledger, _life("nobody", D0 + 100, D0 + 1100, EventKind.PREEMPTED, capacity=SPOT))
        ledger.record_event(EventKind.DELETED, pod="nobody", zone=Z, ts=D0 + 2100)
        rows = _kept(ledger)
        assert ledger.check_view() == []
        assert sorted(rows) == ["r1", "r2", "r3"]
        held_usd_s, unpriced, rec_priced, rec_unpriced = rows["r1"]
        assert held_usd_s == pytest.approx(8 * 4000 * 1.5)
        assert (unpriced, rec_unpriced) == (0.0, 0.0)
        assert rec_priced == pytest.approx(8 * 2000 * 1.5 * 0.4)  # 40% of its 2000 s redone
        assert rows["r2"] == pytest.approx((0.0, 8 * 2000, 0.0, 0.0))
        assert rows["r3"] == pytest.approx((8 * 500 * 1.5, 0.0, 0.0, 0.0))


def test_a_slice_moved_to_another_run_moves_its_waste(open_ledger: OpenLedger) -> None:
    with open_ledger() as ledger:
        for run in ("r1", "r2"):
            ledger.create_run(run, script="train.py", ts=D0)
        life = _life("a", D0 + 100, D0 + 1100, EventKind.PREEMPTED, capacity=SPOT, run_id="r1")
        ledger.record_events_bulk([*life, life[-1]._replace(kind=EventKind.DELETED, ts=D0 + 2100)])
        assert list(_kept(ledger)) == ["r1"]
        write_by_hand(ledger, "UPDATE pods SET run_id = 'r2'")  # as a hand-made repair would
        assert _kept(ledger) == {"r2": pytest.approx((8 * 1000 * 1.5, 0.0, 0.0, 0.0))}
        write_by_hand(ledger, "UPDATE pods SET deleted_at = deleted_at + 1000")  # held longer
        assert _kept(ledger)["r2"][0] == pytest.approx(8 * 2000 * 1.5)


def test_check_view_reports_a_tampered_waste_row(open_ledger: OpenLedger) -> None:
    with open_ledger() as ledger:
        ledger.create_run("r1", script="train.py", ts=D0)
        life = _life("a", D0 + 100, D0 + 1100, EventKind.PREEMPTED, capacity=SPOT, run_id="r1")
        ledger.record_events_bulk([*life, life[-1]._replace(kind=EventKind.DELETED, ts=D0 + 2100)])
        assert ledger.check_view() == []
        write_by_hand(ledger, "UPDATE run_waste SET held_usd_s = held_usd_s + 1")
        (problem,) = ledger.check_view()
        assert problem.startswith("run_waste ('r1',)")


_POD = (
    "INSERT INTO pods (id, zone, name, incarnation, state, accelerator_type, chips, capacity, "
    "price_per_chip_hour, ready_at, ended_at, end_reason, deleted_at, updated_at, last_event_id, run_id) "
    "VALUES (:id, :zone, :name, 1, 'DELETED', 'v5e-8', 8, 'spot', 1.5, :ready, :end, 'preempted', :deleted, "
    ":end, :id, :run)"
)


def test_a_ledger_at_0004_is_backfilled_when_upgraded(tmp_path: Path) -> None:
    run: tuple[str, dict[str, Any]] = (
        "INSERT INTO runs (run_id, script, status, created_at, updated_at) "
        "VALUES ('r1', 'train.py', 'RUNNING', 0, 0)",
        {},
    )
    pods = [(_POD, {"id": id_, "zone": Z, "name": name, "run": "r1", "ready": D0 + 100, "end": D0 + 1100,
                    "deleted": deleted})
            for id_, name, deleted in ((1, "a", D0 + 2100), (2, "b", D0 + 1600), (3, "c", None))]  # fmt: skip
    with ledger_at_revision(tmp_path / "ledger.db", "0004_cost_by_owner", [run, *pods]) as ledger:
        assert _kept(ledger) == {"r1": pytest.approx((8 * 1500 * 1.5, 0.0, 0.0, 0.0))}
