"""Whether a run ever ran on a slice no run created (revision 0009): triggers set the row, on both engines,
whichever write makes the share possible first (the segment, the slice, the slice relieved of its run);
nothing unsets it; ``check_view`` reports it unset where a share exists; the revision sets it for a ledger
that already holds one."""

from __future__ import annotations

from pathlib import Path

from ledger_sql import ledger_at_revision, write_by_hand
from test_owner_rollup import D0, OpenLedger, Z, _life, _one_by_one, _rows

from tpuctl.store import Ledger, shares_seen
from tpuctl.store.records import SegmentKind


def _seen(ledger: Ledger) -> bool:
    return bool(_rows(ledger, shares_seen.SEEN_SQL)[0][0])


def test_a_run_on_its_own_slices_sets_nothing(open_ledger: OpenLedger) -> None:
    with open_ledger() as ledger:
        ledger.create_run("r1", script="train.py", ts=D0)
        _one_by_one(ledger, _life("own", D0 + 100, D0 + 3700, run_id="r1"))
        ledger.add_segment("r1", SegmentKind.RUNNING, start=D0 + 200, pod="own", zone=Z)
        _one_by_one(ledger, _life("nobodys", D0 + 100, D0 + 3700))  # no run's, and no segment on it
        assert not _seen(ledger) and ledger.check_view() == []


def test_a_segment_on_a_slice_no_run_created_sets_it(open_ledger: OpenLedger) -> None:
    with open_ledger() as ledger:
        ledger.create_run("r1", script="train.py", ts=D0)
        _one_by_one(ledger, _life("made-by-pod-create", D0 + 100, D0 + 3700))
        assert not _seen(ledger)
        segment = ledger.add_segment(
            "r1", SegmentKind.RUNNING, start=D0 + 200, pod="made-by-pod-create", zone=Z
        )
        assert _seen(ledger) and ledger.check_view() == []
        # A share that goes away leaves it set: a bound, never a count.
        write_by_hand(ledger, f"DELETE FROM run_segments WHERE id = {segment}")
        assert _seen(ledger) and ledger.check_view() == []


def test_a_slice_recorded_after_the_segment_naming_it_sets_it(open_ledger: OpenLedger) -> None:
    with open_ledger() as ledger:
        ledger.create_run("r1", script="train.py", ts=D0)
        ledger.add_segment("r1", SegmentKind.RUNNING, start=D0 + 200, pod="later", zone=Z)
        assert not _seen(ledger)
        ledger.record_events_bulk(_life("later", D0 + 100, D0 + 3700))  # the bulk path: its triggers too
        assert _seen(ledger) and ledger.check_view() == []


def test_a_slice_relieved_of_its_run_under_a_segment_sets_it(open_ledger: OpenLedger) -> None:
    with open_ledger() as ledger:
        ledger.create_run("r1", script="train.py", ts=D0)
        _one_by_one(ledger, _life("own", D0 + 100, D0 + 3700, run_id="r1"))
        ledger.add_segment("r1", SegmentKind.RUNNING, start=D0 + 200, pod="own", zone=Z)
        assert not _seen(ledger)
        write_by_hand(ledger, "UPDATE pods SET run_id = NULL WHERE name = 'own'")  # a tool un-attributing it
        assert _seen(ledger)


def test_check_view_reports_it_unset_under_a_share(open_ledger: OpenLedger) -> None:
    with open_ledger() as ledger:
        ledger.create_run("r1", script="train.py", ts=D0)
        _one_by_one(ledger, _life("shared", D0 + 100, D0 + 3700))
        ledger.add_segment("r1", SegmentKind.RUNNING, start=D0 + 200, pod="shared", zone=Z)
        write_by_hand(ledger, f"DELETE FROM ledger_meta WHERE key = '{shares_seen.KEY}'")
        (problem,) = ledger.check_view()
        assert problem.startswith(f"ledger_meta: no {shares_seen.KEY} row") and "shared" in problem


_POD = (
    "INSERT INTO pods (id, zone, name, incarnation, state, accelerator_type, chips, capacity, ready_at, "
    "ended_at, end_reason, updated_at, last_event_id) "
    "VALUES (:id, :zone, :name, 0, 'DELETED', 'v5e-8', 8, 'on-demand', :ready, :end, 'deleted', :end, 0)"
)
_RUN = (
    "INSERT INTO runs (run_id, script, status, created_at, updated_at) "
    "VALUES ('r1', 'train.py', 'RUNNING', :at, :at)"
)
_SEGMENT = (
    "INSERT INTO run_segments (run_id, kind, zone, pod, started_at) "
    "VALUES ('r1', 'running', :zone, :pod, :at)"
)


def test_the_revision_sets_it_for_a_ledger_that_holds_a_share(tmp_path: Path) -> None:
    writes = [
        (_RUN, {"at": D0}),
        (_POD, {"id": 1, "zone": Z, "name": "shared", "ready": D0, "end": D0 + 3600}),
        (_SEGMENT, {"zone": Z, "pod": "shared", "at": D0 + 10}),
    ]
    with ledger_at_revision(tmp_path / "shared.db", "0008_ids_in_indexes", writes) as ledger:
        assert _seen(ledger)
    with ledger_at_revision(tmp_path / "none.db", "0008_ids_in_indexes", writes[:2]) as ledger:
        assert not _seen(ledger)
