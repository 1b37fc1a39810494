"""What a new owner of a run reads from the ledger: intents, the run's state, its request and bundle (with
the size cap), and its hosts' log lines (idempotent, appended where the last owner stopped)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from ledger_sql import other_machine, write_by_hand

from tpuctl.errors import LeaseLostError
from tpuctl.store import (
    BlobTooLargeError,
    IntentAction,
    LeaseClaim,
    LeaseOwner,
    Ledger,
    LedgerError,
    LogLine,
    SliceRef,
)
from tpuctl.store import runstate as runstate_module
from tpuctl.testing.clock import wait_for

RUN = "r-state"
A = LeaseOwner("owner-aaaa", "host-a", 1111, None)
B = LeaseOwner("owner-bbbb", "host-b", 2222, None)
ZONE = "us-central1-a"


@pytest.fixture
def ledger(open_ledger: Callable[..., Ledger]) -> Iterator[Ledger]:
    with open_ledger() as opened:
        opened.create_run(RUN, script="train.py")
        yield opened


@pytest.fixture
def claim(ledger: Ledger) -> LeaseClaim:
    return ledger.claim_lease(RUN, A, 300.0)


def test_intents_are_recorded_in_order_with_their_owner(ledger: Ledger, claim: LeaseClaim) -> None:
    created = ledger.record_intent(claim, IntentAction.CREATE, "p-1", ZONE, {"attempt": 1})
    deleted = ledger.record_intent(claim, IntentAction.DELETE, "p-1", ZONE)
    assert created.id < deleted.id and created.at <= deleted.at
    assert ledger.intents(RUN) == [created, deleted]
    assert (created.action, created.pod, created.zone, created.detail) == (
        IntentAction.CREATE,
        "p-1",
        ZONE,
        {"attempt": 1},
    )
    assert (created.generation, created.owner_id) == (1, A.owner_id)
    with pytest.raises(ValueError):
        ledger.record_intent(claim, "resize", "p-1", ZONE)  # type: ignore[arg-type]
    assert ledger.intents("other") == []


def test_a_supervisor_without_the_lease_cannot_record_an_intent(ledger: Ledger) -> None:
    old = ledger.claim_lease(RUN, A, 0.3)
    wait_for(lambda: (h := ledger.lease_of(RUN)) is not None and h.expired, timeout=20.0, what="expiry")
    ledger.claim_lease(RUN, B, 300.0)
    with pytest.raises(LeaseLostError):
        ledger.record_intent(old, IntentAction.DELETE, "p-1", ZONE)
    assert ledger.intents(RUN) == []  # it failed before the cloud could be asked anything


def test_the_run_state_keeps_what_a_write_leaves_out(ledger: Ledger, claim: LeaseClaim) -> None:
    assert ledger.run_state(RUN) is None
    slices = [SliceRef("p-0", ZONE), SliceRef("p-1", ZONE)]
    first = ledger.update_run_state(claim, phase="provisioning", attempt=1, slices=slices)
    assert (first.phase, first.attempt, first.slices, first.generation) == (
        "provisioning",
        1,
        tuple(slices),
        1,
    )
    second = ledger.update_run_state(claim, phase="running")
    assert (second.phase, second.attempt, second.slices) == ("running", 1, tuple(slices))
    assert ledger.run_state(RUN) == second
    cleared = ledger.update_run_state(claim, attempt=None, slices=[])
    assert (cleared.phase, cleared.attempt, cleared.slices) == ("running", None, ())


def test_request_and_bundle_round_trip_from_another_machine(ledger: Ledger) -> None:
    request = '{"request": {"script": "train.py", "env": ["A=1"]}, "budget_usd": null}'
    saved = ledger.save_run_request(RUN, request)
    data = bytes(range(256)) * 100
    bundle = ledger.save_bundle(RUN, data)
    assert (bundle.name, bundle.size) == ("bundle", len(data))
    assert len(bundle.sha256) == 64 and saved.name == "request.json"
    with other_machine(ledger) as elsewhere:
        assert elsewhere.run_request(RUN) == request
        assert elsewhere.bundle(RUN) == data
    ledger.save_bundle(RUN, b"smaller")  # a later save replaces it
    assert ledger.bundle(RUN) == b"smaller"
    assert ledger.bundle("other") is None and ledger.run_request("other") is None
    with pytest.raises(LedgerError, match="no run 'other'"):
        ledger.save_bundle("other", b"x")
    with pytest.raises(ValueError):
        ledger.save_run_request(RUN, "{not json")
    assert ledger.run_request(RUN) == request


def test_a_blob_over_the_cap_is_refused_and_nothing_is_written(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runstate_module, "MAX_BLOB_BYTES", 2 * 1024 * 1024)
    ledger.save_bundle(RUN, b"x" * (2 * 1024 * 1024))  # exactly the cap: stored
    with pytest.raises(BlobTooLargeError) as info:
        ledger.save_bundle(RUN, b"y" * (3 * 1024 * 1024))
    err = info.value
    assert err.exit_code == 2
    assert "3.0 MiB" in err.message and "2.0 MiB" in err.message and "MAX_BLOB_BYTES" in err.message
    assert ".tpuctlignore" in (err.fix or "")
    assert ledger.bundle(RUN) == b"x" * (2 * 1024 * 1024)
    assert runstate_module.MAX_BLOB_BYTES == 2 * 1024 * 1024  # the cap is read where it is named


def test_a_blob_changed_in_the_database_is_refused(ledger: Ledger) -> None:
    ledger.save_bundle(RUN, b"the bundle")
    write_by_hand(
        ledger, "UPDATE run_blobs SET data = :data WHERE run_id = :run", {"data": b"the bundlE", "run": RUN}
    )
    with pytest.raises(LedgerError, match="does not match its SHA-256"):
        ledger.bundle(RUN)


def test_log_lines_are_idempotent_on_worker_and_seq(ledger: Ledger, claim: LeaseClaim) -> None:
    assert ledger.append_log_lines(claim, 0, 0, [(10.0, "a"), (11.0, "b"), (12.0, "c")]) == 3
    # Re-sent from seq 1 with two new lines: only the new ones are stored, the old ones stay as they were.
    assert ledger.append_log_lines(claim, 0, 1, [(99.0, "B?"), (99.0, "C?"), (13.0, "d"), (14.0, "e")]) == 2
    assert ledger.append_log_lines(claim, 0, 1, [(99.0, "B?")]) == 0
    lines = ledger.log_lines(RUN, worker=0)
    assert [(line.seq, line.text) for line in lines] == [(0, "a"), (1, "b"), (2, "c"), (3, "d"), (4, "e")]
    assert lines[1] == LogLine(0, 1, 11.0, "b")
    assert ledger.next_log_seq(RUN, 0) == 5 and ledger.next_log_seq(RUN, 1) == 0
    assert [line.text for line in ledger.log_lines(RUN, worker=0, after_seq=2, limit=1)] == ["d"]
    with pytest.raises(ValueError):
        ledger.append_log_lines(claim, -1, 0, [(1.0, "x")])


def test_every_workers_lines_read_in_the_order_they_arrived(ledger: Ledger, claim: LeaseClaim) -> None:
    ledger.append_log_lines(claim, 1, 0, [(10.5, "w1 first"), (12.5, "w1 second")])
    ledger.append_log_lines(claim, 0, 0, [(10.0, "w0 first"), (12.0, "w0 second")])
    assert [line.text for line in ledger.log_lines(RUN)] == ["w0 first", "w1 first", "w0 second", "w1 second"]


def test_a_new_owner_appends_where_the_old_one_stopped(ledger: Ledger) -> None:
    old = ledger.claim_lease(RUN, A, 0.3)
    ledger.append_log_lines(old, 0, 0, [(1.0, "step 1"), (2.0, "step 2")])
    wait_for(lambda: (h := ledger.lease_of(RUN)) is not None and h.expired, timeout=20.0, what="expiry")
    with other_machine(ledger) as elsewhere:
        new = elsewhere.claim_lease(RUN, B, 300.0)
        start = elsewhere.next_log_seq(RUN, 0)
        # The new owner re-reads the host's log from a point it is sure of and sends it all again.
        elsewhere.append_log_lines(new, 0, 1, [(2.0, "step 2"), (3.0, "step 3")])
        assert start == 2
    with pytest.raises(LeaseLostError):  # the old owner, still streaming, stores nothing more
        ledger.append_log_lines(old, 0, 3, [(4.0, "stale")])
    with other_machine(ledger) as reader:  # `runs logs` on a third machine: each line once
        assert [line.text for line in reader.log_lines(RUN)] == ["step 1", "step 2", "step 3"]
