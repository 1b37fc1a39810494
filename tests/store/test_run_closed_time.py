"""Revision 0006: ``run_closed_time``, per run its closed slices' time at their recorded price, kept by
triggers on both engines through single, bulk and hand-made writes, backfilled when a ledger at 0005 is
upgraded, and re-derived by ``check_view``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from ledger_sql import kept_run_sums, ledger_at_revision, write_by_hand
from test_owner_rollup import D0, Z, _life, _one_by_one

from tpuctl.catalog import CapacityType
from tpuctl.store import EventKind, Ledger
from tpuctl.store.run_closed_time import CLOSED_TIME

OpenLedger = Callable[..., Ledger]
SPOT = CapacityType.SPOT


def _kept(ledger: Ledger) -> dict[str, tuple[float, ...]]:
    """The table's runs with something left and their sums, checked (``ledger_sql.kept_run_sums``)."""
    kept: dict[str, tuple[float, ...]] = kept_run_sums(ledger, CLOSED_TIME)
    return kept


def test_the_triggers_keep_each_runs_closed_time_through_every_write(open_ledger: OpenLedger) -> None:
    with open_ledger() as ledger:
        for run in ("r1", "r2", "r3"):
            ledger.create_run(run, script="train.py", ts=D0)
        # r1: a slice still open (not stored: its time grows with the clock), then closed after 2000 s
        # (8 chips at 1.5 USD/chip-hour), and a preempted one of 1000 s written one event at a time.
        _one_by_one(ledger, _life("a", D0 + 1000, D0 + 3000, run_id="r1")[:2])
        assert _kept(ledger) == {}
        ledger.record_event(EventKind.DELETED, pod="a", zone=Z, ts=D0 + 3000)
        _one_by_one(ledger, _life("b", D0 + 100, D0 + 1100, EventKind.PREEMPTED, capacity=SPOT, run_id="r1"))
        # r2: a slice with no price; r3: written in bulk; none: a slice no run created.
        _one_by_one(ledger, _life("c", D0 + 100, D0 + 2100, price_per_chip_hour=None, run_id="r2"))
        ledger.record_events_bulk(_life("d", D0 + 100, D0 + 600, run_id="r3"))
        _one_by_one(ledger, _life("e", D0 + 100, D0 + 1100))
        rows = _kept(ledger)
        assert rows == {
            "r1": pytest.approx((2.0, 8 * 3000 * 1.5, 0.0)),
            "r2": pytest.approx((1.0, 0.0, 8 * 2000.0)),
            "r3": pytest.approx((1.0, 8 * 500 * 1.5, 0.0)),
        }


def test_a_slice_moved_or_repriced_by_hand_moves_its_time(open_ledger: OpenLedger) -> None:
    with open_ledger() as ledger:
        for run in ("r1", "r2"):
            ledger.create_run(run, script="train.py", ts=D0)
        ledger.record_events_bulk(_life("a", D0 + 100, D0 + 1100, run_id="r1"))
        assert list(_kept(ledger)) == ["r1"]
        write_by_hand(ledger, "UPDATE pods SET run_id = 'r2'")  # as a hand-made repair would
        assert _kept(ledger) == {"r2": pytest.approx((1.0, 8 * 1000 * 1.5, 0.0))}
        write_by_hand(ledger, "UPDATE pods SET price_per_chip_hour = NULL, ended_at = ended_at + 1000")
        assert _kept(ledger) == {"r2": pytest.approx((1.0, 0.0, 8 * 2000.0))}
        write_by_hand(ledger, "UPDATE pods SET run_id = NULL")
        assert _kept(ledger) == {}  # r2's row of zeros is not one the check gives


def test_check_view_reports_a_tampered_closed_time_row(open_ledger: OpenLedger) -> None:
    with open_ledger() as ledger:
        ledger.create_run("r1", script="train.py", ts=D0)
        ledger.record_events_bulk(_life("a", D0 + 100, D0 + 1100, run_id="r1"))
        assert ledger.check_view() == []
        write_by_hand(ledger, "UPDATE run_closed_time SET priced_usd_s = priced_usd_s + 1")
        (problem,) = ledger.check_view()
        assert problem.startswith("run_closed_time ('r1',)")


_POD = (
    "INSERT INTO pods (id, zone, name, incarnation, state, accelerator_type, chips, capacity, "
    "price_per_chip_hour, ready_at, ended_at, end_reason, deleted_at, updated_at, last_event_id, run_id) "
    "VALUES (:id, :zone, :name, 1, :state, 'v5e-8', 8, 'spot', 1.5, :ready, :end, :reason, :end, "
    ":updated, :id, :run)"
)


def test_a_ledger_at_0005_is_backfilled_when_upgraded(tmp_path: Path) -> None:
    pods = [(_POD, {"id": id_, "zone": Z, "name": name, "run": "r1", "ready": D0 + 100, "end": end,
                    "updated": D0 + 2000, "state": "READY" if end is None else "DELETED",
                    "reason": None if end is None else "deleted"})
            for id_, name, end in ((1, "a", D0 + 1100), (2, "b", D0 + 600), (3, "c", None))]  # fmt: skip
    with ledger_at_revision(tmp_path / "ledger.db", "0005_waste_by_run", pods) as ledger:
        assert _kept(ledger) == {"r1": pytest.approx((2.0, 8 * 1500 * 1.5, 0.0))}
