"""Revision 0007: ``cost_rollup_norun``, the rolled slices no run created per day, zone, type and capacity,
kept by triggers on both engines through single, bulk and hand-made writes (a slice given a run moves out,
one whose run is taken away moves in), backfilled when a ledger at 0006 is upgraded, and re-derived by
``check_view``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from ledger_sql import ledger_at_revision, write_by_hand
from test_owner_rollup import D0, DAY0, OpenLedger, Z, _life, _null, _one_by_one, _rows

from tpuctl.catalog import CapacityType
from tpuctl.store import EventKind, Ledger
from tpuctl.store.billing import DAY_S
from tpuctl.store.norun_rollup import NORUN


def _kept(ledger: Ledger) -> list[tuple[Any, ...]]:
    """The table's rows, equal to its check, ``check_view`` finding nothing wrong with it."""
    have: list[tuple[Any, ...]] = _rows(ledger, f"SELECT * FROM {NORUN.table} ORDER BY 1, 2, 3, 4")
    want = _rows(ledger, NORUN.check_sql)
    assert [r[:5] for r in have] == [r[:5] for r in want]
    assert [r[5:] for r in have] == [pytest.approx(r[5:]) for r in want]
    assert [p for p in ledger.check_view() if p.startswith(NORUN.table)] == []
    return have


def test_the_triggers_keep_the_slices_no_run_created(open_ledger: OpenLedger) -> None:
    with open_ledger() as ledger:
        ledger.create_run("r1", script="train.py", ts=D0)
        _one_by_one(ledger, _life("day", D0 + 3600, D0 + 7200))
        _one_by_one(ledger, _life("runs", D0 + 3600, D0 + 7200, run_id="r1"))  # a run's: not here
        _one_by_one(ledger, _life("midnight", D0 + 80_000, D0 + DAY_S + 3600))  # crosses: not here
        spot = CapacityType.SPOT
        _one_by_one(ledger, _life("free", D0 + 1000, D0 + 1030, EventKind.PREEMPTED, capacity=spot))
        ledger.record_events_bulk([
            *_life("bulk-a", D0 + DAY_S + 100, D0 + DAY_S + 3700),
            *_life("bulk-b", D0 + DAY_S + 200, D0 + DAY_S + 1000),
            *_life("bulk-untyped", D0 + DAY_S + 300, D0 + DAY_S + 900, accelerator_type=None, capacity=None),
            *_life("bulk-open", D0 + DAY_S + 400, D0 + DAY_S + 900)[:2],
        ])  # fmt: skip
        rows = _kept(ledger)
        null = _null(ledger)
        assert {r[:5] for r in rows} == {
            (DAY0, Z, "v5e-8", "on-demand", 1),  # day
            (DAY0 + 1, Z, "v5e-8", "on-demand", 2),  # bulk-a, bulk-b
            (DAY0 + 1, Z, null, null, 1),  # bulk-untyped
        }
        assert rows[0][6] == pytest.approx(8 * 3600.0)  # billed chip-seconds
        assert rows[0][7] == pytest.approx(8 * 3600.0 * 1.5)  # USD x 3600


def test_a_closed_slice_given_or_relieved_of_a_run_moves_out_or_in(open_ledger: OpenLedger) -> None:
    with open_ledger() as ledger:
        ledger.record_events_bulk([*_life("a", D0 + 100, D0 + 3700), *_life("b", D0 + 200, D0 + 1000)])
        assert [r[4] for r in _kept(ledger)] == [2]
        # As a tool attributes existing slices (a plain UPDATE, no event).
        write_by_hand(ledger, "UPDATE pods SET run_id = 'r1' WHERE name = 'a'")
        rows = _kept(ledger)
        assert [r[4] for r in rows] == [1] and rows[0][7] == pytest.approx(8 * 800 * 1.5)
        write_by_hand(ledger, "UPDATE pods SET run_id = 'r2' WHERE name = 'a'")  # run to run: nothing
        assert _kept(ledger) == rows
        write_by_hand(ledger, "UPDATE pods SET run_id = 'r1'")  # the last slice leaves: no row of zeros
        assert _kept(ledger) == []
        write_by_hand(ledger, "UPDATE pods SET run_id = NULL WHERE name = 'a'")
        assert [r[4] for r in _kept(ledger)] == [1]


def test_check_view_reports_a_tampered_row(open_ledger: OpenLedger) -> None:
    with open_ledger() as ledger:
        ledger.record_events_bulk(_life("a", D0 + 100, D0 + 1100))
        assert ledger.check_view() == []
        write_by_hand(ledger, f"UPDATE {NORUN.table} SET billed_usd_s = billed_usd_s + 1")
        (problem,) = ledger.check_view()
        assert problem.startswith(f"{NORUN.table} ({DAY0}, ")


_POD = (
    "INSERT INTO pods (id, zone, name, incarnation, state, accelerator_type, chips, capacity, "
    "price_per_chip_hour, ready_at, ended_at, end_reason, deleted_at, updated_at, last_event_id, run_id, "
    "billed_s, billed_chip_s, billed_usd_s, billed_unpriced_chip_s, rolled) "
    "VALUES (:id, :zone, :name, 1, 'DELETED', 'v5e-8', 8, 'on-demand', 1.5, :ready, :end, 'deleted', :end, "
    ":end, :id, :run, :s, 8 * :s, 8 * :s * 1.5, 0, 1)"
)


def test_a_ledger_at_0006_is_backfilled_when_upgraded(tmp_path: Path) -> None:
    pods = [(_POD, {"id": id_, "zone": Z, "name": name, "run": run, "ready": D0 + 100 * id_, "end": D0 + 1100,
                    "s": 1100 - 100 * id_})
            for id_, name, run in ((1, "a", None), (2, "b", None), (3, "c", "r1"))]  # fmt: skip
    with ledger_at_revision(tmp_path / "ledger.db", "0006_run_closed_time", pods) as ledger:
        rows = _kept(ledger)
        assert [r[:5] for r in rows] == [(DAY0, Z, "v5e-8", "on-demand", 2)]
        assert rows[0][6] == pytest.approx(8 * (1000 + 900))
