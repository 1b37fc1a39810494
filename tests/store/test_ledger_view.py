"""Events and the pods view: each kind's effect, incarnations, ambiguity, atomicity, and a replay property."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ledger_sql import write_by_hand

from tpuctl.catalog import CapacityType
from tpuctl.errors import EXIT_USAGE, UsageError
from tpuctl.store import (
    AmbiguousPodError,
    EventKind,
    Ledger,
    NewEvent,
    PodRecord,
    PodState,
)
from tpuctl.store import ledger as ledger_module

Z1, Z2 = "us-central1-a", "europe-west4-b"


class FakeClock:
    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def ledger(open_ledger: Callable[..., Ledger], clock: FakeClock) -> Iterator[Ledger]:
    with open_ledger(clock=clock) as led:
        yield led


def request(ledger: Ledger, name: str = "p", zone: str = Z1, **kw: object) -> int:
    args: dict[str, object] = {
        "accelerator_type": "v5litepod-64",
        "chips": 64,
        "capacity": CapacityType.SPOT,
        "price_per_chip_hour": 0.245,
        "labels": {"tpuctl": "yes", "team": "ml"},
        "request_id": "req-1",
        "run_id": "run-1",
        "hosts": 16,
        "backend": "sim",
        "project": "proj",
    }
    args.update(kw)
    return ledger.record_event(EventKind.REQUESTED, pod=name, zone=zone, **args)  # type: ignore[arg-type]


def test_requested_inserts_a_row_with_its_attributes(ledger: Ledger) -> None:
    event_id = request(ledger, ts=100.0)
    pod = ledger.get_pod("p")
    assert pod is not None
    assert (pod.zone, pod.name, pod.incarnation, pod.state) == (Z1, "p", 1, PodState.REQUESTED)
    assert (pod.accelerator_type, pod.chips, pod.hosts, pod.capacity) == ("v5litepod-64", 64, 16, "spot")
    assert pod.capacity is CapacityType.SPOT
    assert pod.price_per_chip_hour == 0.245
    assert pod.labels == {"team": "ml", "tpuctl": "yes"}
    assert (pod.request_id, pod.run_id, pod.backend, pod.project) == ("req-1", "run-1", "sim", "proj")
    assert (pod.requested_at, pod.created_at, pod.ready_at, pod.ended_at) == (100.0, None, None, None)
    assert pod.alive and pod.last_event_id == event_id and pod.updated_at == 100.0


def test_full_lifecycle_moves_the_view(ledger: Ledger) -> None:
    request(ledger, ts=100.0)
    ledger.record_event(EventKind.CREATED, pod="p", zone=Z1, ts=110.0, queued_resource=None)
    pod = ledger.get_pod("p", Z1)
    assert pod is not None and pod.state == PodState.CREATING and pod.created_at == 110.0
    ready_id = ledger.record_event(EventKind.READY, pod="p", zone=Z1, ts=150.0)
    pod = ledger.get_pod("p", Z1)
    assert pod is not None and pod.state == PodState.READY and pod.ready_at == 150.0
    assert pod.last_event_id == ready_id
    ledger.record_event(EventKind.DELETED, pod="p", zone=Z1, ts=300.0)
    pod = ledger.get_pod("p", Z1)
    assert pod is not None
    assert (pod.state, pod.ended_at, pod.end_reason, pod.deleted_at) == (
        PodState.DELETED,
        300.0,
        "deleted",
        300.0,
    )
    assert not pod.alive
    assert [e.kind for e in ledger.pod_events("p")] == ["requested", "created", "ready", "deleted"]
    assert ledger.check_view() == []


def test_queued_then_ready(ledger: Ledger) -> None:
    ledger.record_event(EventKind.QUEUED, pod="q", zone=Z1, queued_resource="qr-1", ts=10.0)
    pod = ledger.get_pod("q")
    assert pod is not None and pod.state == PodState.QUEUED and pod.requested_at == 10.0
    assert pod.queued_resource == "qr-1"
    ledger.record_event(EventKind.READY, pod="q", zone=Z1, ts=50.0, slice_index=1)
    pod = ledger.get_pod("q")
    assert pod is not None and pod.state == PodState.READY
    assert (pod.created_at, pod.ready_at, pod.slice_index) == (50.0, 50.0, 1)  # first seen READY


def test_preempted_then_deleted_keeps_the_billing_end(ledger: Ledger) -> None:
    request(ledger, ts=0.0)
    ledger.record_event(EventKind.READY, pod="p", zone=Z1, ts=10.0)
    ledger.record_event(EventKind.PREEMPTED, pod="p", zone=Z1, ts=500.0)
    pod = ledger.get_pod("p")
    assert pod is not None
    assert (pod.state, pod.ended_at, pod.end_reason, pod.deleted_at) == (
        PodState.PREEMPTED,
        500.0,
        "preempted",
        None,
    )
    assert ledger.list_pods(state=PodState.PREEMPTED) == [pod]  # what `pod gc` looks for
    ledger.record_event(EventKind.DELETED, pod="p", zone=Z1, ts=900.0)
    pod = ledger.get_pod("p")
    assert pod is not None
    # Billing stopped at the preemption; the slice held quota until the delete.
    assert (pod.state, pod.ended_at, pod.end_reason, pod.deleted_at) == (
        PodState.DELETED,
        500.0,
        "preempted",
        900.0,
    )
    assert ledger.check_view() == []


@pytest.mark.parametrize(
    ("kind", "state", "deleted"),
    [
        (EventKind.FAILED, PodState.FAILED, False),
        (EventKind.GONE, PodState.DELETED, True),
        (EventKind.DELETED, PodState.DELETED, True),
        (EventKind.PREEMPTED, PodState.PREEMPTED, False),
    ],
)
def test_end_kinds(ledger: Ledger, kind: EventKind, state: PodState, deleted: bool) -> None:
    request(ledger, ts=1.0)
    ledger.record_event(kind, pod="p", zone=Z1, ts=2.0, detail={"why": "x"})
    pod = ledger.get_pod("p")
    assert pod is not None
    assert (pod.state, pod.ended_at, pod.end_reason) == (state, 2.0, kind.value)
    assert pod.deleted_at == (2.0 if deleted else None)
    assert ledger.list_pods(alive=True) == []
    assert ledger.list_pods(alive=False) == [pod]


def test_duplicate_end_event_is_logged_but_does_not_move_the_view(ledger: Ledger) -> None:
    request(ledger, ts=1.0)
    first = ledger.record_event(EventKind.DELETED, pod="p", zone=Z1, ts=2.0)
    again = ledger.record_event(EventKind.DELETED, pod="p", zone=Z1, ts=3.0)
    late = ledger.record_event(EventKind.PREEMPTED, pod="p", zone=Z1, ts=4.0)
    pod = ledger.get_pod("p")
    assert pod is not None
    assert (pod.ended_at, pod.deleted_at, pod.last_event_id, pod.updated_at) == (2.0, 2.0, first, 2.0)
    events = ledger.pod_events("p")
    assert [e.id for e in events][-2:] == [again, late]
    assert all(e.pod_id == pod.id for e in events)


def test_late_created_after_ready_does_not_regress(ledger: Ledger) -> None:
    request(ledger, ts=1.0)
    ledger.record_event(EventKind.READY, pod="p", zone=Z1, ts=5.0)
    ledger.record_event(EventKind.CREATED, pod="p", zone=Z1, ts=6.0)
    pod = ledger.get_pod("p")
    assert pod is not None and pod.state == PodState.READY
    assert (pod.created_at, pod.ready_at) == (5.0, 5.0)
    assert ledger.check_view() == []


def test_end_event_for_an_unknown_pod_creates_an_ended_row(ledger: Ledger) -> None:
    ledger.record_event(EventKind.GONE, pod="stray", zone=Z2, ts=7.0, chips=8)
    pod = ledger.get_pod("stray")
    assert pod is not None
    assert (pod.state, pod.incarnation, pod.chips, pod.ended_at, pod.deleted_at) == (
        PodState.DELETED,
        1,
        8,
        7.0,
        7.0,
    )


def test_name_reuse_after_delete_is_a_new_incarnation(ledger: Ledger) -> None:
    request(ledger, ts=1.0, price_per_chip_hour=1.0)
    ledger.record_event(EventKind.READY, pod="p", zone=Z1, ts=2.0)
    ledger.record_event(EventKind.DELETED, pod="p", zone=Z1, ts=3.0)
    request(ledger, ts=4.0, price_per_chip_hour=2.0, request_id="req-2")
    ledger.record_event(EventKind.READY, pod="p", zone=Z1, ts=5.0)
    pods = ledger.list_pods()
    assert [(p.incarnation, p.state, p.price_per_chip_hour) for p in pods] == [
        (1, PodState.DELETED, 1.0),
        (2, PodState.READY, 2.0),
    ]
    current = ledger.get_pod("p")
    assert current is not None and current.incarnation == 2 and current.request_id == "req-2"
    assert [e.ts for e in ledger.pod_events("p")] == [4.0, 5.0]  # this life's events only
    assert ledger.check_view() == []


def test_price_change_applies_to_open_pods_only(ledger: Ledger) -> None:
    request(ledger, ts=1.0, price_per_chip_hour=1.0)
    ledger.record_event(EventKind.READY, pod="p", zone=Z1, ts=2.0)
    change = ledger.record_event(EventKind.PRICE_CHANGE, pod="p", zone=Z1, price_per_chip_hour=1.5, ts=3.0)
    pod = ledger.get_pod("p")
    assert pod is not None and pod.price_per_chip_hour == 1.5 and pod.last_event_id == change
    ledger.record_event(EventKind.DELETED, pod="p", zone=Z1, ts=4.0)
    ledger.record_event(EventKind.PRICE_CHANGE, pod="p", zone=Z1, price_per_chip_hour=9.0, ts=5.0)
    pod = ledger.get_pod("p")
    assert pod is not None and pod.price_per_chip_hour == 1.5
    prices = [(e.ts, e.price_per_chip_hour) for e in ledger.events(kinds=[EventKind.PRICE_CHANGE])]
    assert prices == [(3.0, 1.5), (5.0, 9.0)]
    with pytest.raises(ValueError, match="price_per_chip_hour"):
        ledger.record_event(EventKind.PRICE_CHANGE, pod="p", zone=Z1)


def test_events_carry_the_attributes_and_price_in_force(ledger: Ledger) -> None:
    request(ledger, ts=1.0, price_per_chip_hour=1.0)
    ledger.record_event(EventKind.PRICE_CHANGE, pod="p", zone=Z1, price_per_chip_hour=2.0, ts=2.0)
    ledger.record_event(EventKind.READY, pod="p", zone=Z1, ts=3.0)
    ready = ledger.pod_events("p")[-1]
    assert (ready.kind, ready.price_per_chip_hour, ready.chips, ready.capacity) == ("ready", 2.0, 64, "spot")
    assert (ready.accelerator_type, ready.run_id, ready.request_id) == ("v5litepod-64", "run-1", "req-1")
    assert ready.labels is None  # labels live on the pod; events keep only what was given with them


def test_log_only_kinds_do_not_touch_pods(ledger: Ledger) -> None:
    ledger.record_event(EventKind.GC, detail={"found": 3})
    ledger.record_event(EventKind.ATTEMPT, pod="p", zone=Z1, detail={"outcome": "stockout"})
    assert ledger.list_pods() == []
    request(ledger, ts=10.0)
    before = ledger.get_pod("p")
    gc = ledger.record_event(EventKind.GC, pod="p", zone=Z1, ts=11.0)
    assert ledger.get_pod("p") == before
    (event,) = [e for e in ledger.events() if e.id == gc]
    assert before is not None and event.pod_id == before.id


def test_validation(ledger: Ledger) -> None:
    with pytest.raises(ValueError, match="needs both pod and zone"):
        ledger.record_event(EventKind.READY, pod="p")
    with pytest.raises(ValueError, match="unknown event kind"):
        ledger.record_event("exploded", pod="p", zone=Z1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="price_per_chip_hour"):
        ledger.record_event(EventKind.REQUESTED, pod="p", zone=Z1, price_per_chip_hour=-1.0)
    with pytest.raises(ValueError, match="finite"):
        ledger.record_event(EventKind.GC, ts=float("nan"))
    with pytest.raises(ValueError, match="chips"):
        ledger.record_event(EventKind.REQUESTED, pod="p", zone=Z1, chips=-4)
    with pytest.raises(ValueError, match="labels"):
        ledger.record_event(EventKind.REQUESTED, pod="p", zone=Z1, labels={"a": 1})  # type: ignore[dict-item]
    with pytest.raises(UsageError, match="capacity"):
        ledger.record_event(EventKind.REQUESTED, pod="p", zone=Z1, capacity="cheap")  # type: ignore[arg-type]
    assert list(ledger.events()) == []
    # Plain strings for kinds and capacity types are accepted, as the CLI and services may pass them.
    ledger.record_event("requested", pod="p", zone=Z1, capacity="on_demand")  # type: ignore[arg-type]
    pod = ledger.get_pod("p")
    assert pod is not None and pod.capacity is CapacityType.ON_DEMAND


def test_get_pod_ambiguity_across_zones(ledger: Ledger) -> None:
    assert ledger.get_pod("p") is None
    request(ledger, "p", Z1, ts=1.0)
    request(ledger, "p", Z2, ts=2.0)
    with pytest.raises(AmbiguousPodError) as info:
        ledger.get_pod("p")
    err = info.value
    assert err.exit_code == EXIT_USAGE and err.zones == sorted([Z1, Z2])
    assert Z1 in str(err) and Z2 in str(err) and "--zone" in (err.fix or "")
    assert err.to_dict()["zones"] == sorted([Z1, Z2])
    with pytest.raises(AmbiguousPodError):
        ledger.pod_events("p")
    one = ledger.get_pod("p", Z2)
    assert one is not None and one.zone == Z2
    # Once only one zone has it open, that one is meant.
    ledger.record_event(EventKind.DELETED, pod="p", zone=Z1, ts=3.0)
    alive = ledger.get_pod("p")
    assert alive is not None and alive.zone == Z2
    # With both ended, the name is ambiguous again.
    ledger.record_event(EventKind.DELETED, pod="p", zone=Z2, ts=4.0)
    with pytest.raises(AmbiguousPodError):
        ledger.get_pod("p")
    assert ledger.get_pod("p", "asia-east1-c") is None


def test_list_pods_filters(ledger: Ledger) -> None:
    request(ledger, "a", Z1, ts=100.0, run_id="r1")
    ledger.record_event(EventKind.DELETED, pod="a", zone=Z1, ts=200.0)
    request(ledger, "b", Z2, ts=300.0, run_id="r2")
    request(ledger, "c", Z1, ts=400.0, run_id="r2")

    def names(pods: list[PodRecord]) -> list[str]:
        return [p.name for p in pods]

    assert names(ledger.list_pods()) == ["a", "b", "c"]
    assert names(ledger.list_pods(alive=True)) == ["b", "c"]
    assert names(ledger.list_pods(zone=Z1)) == ["a", "c"]
    assert names(ledger.list_pods(run_id="r2")) == ["b", "c"]
    assert names(ledger.list_pods(state=PodState.DELETED)) == ["a"]
    # Lives overlapping a window: a lived 100..200, b from 300, c from 400.
    assert names(ledger.list_pods(since=150.0, until=350.0)) == ["a", "b"]
    assert names(ledger.list_pods(since=200.5)) == ["b", "c"]
    assert names(ledger.list_pods(until=300.0)) == ["a"]


def test_event_and_view_change_are_one_transaction(ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    request(ledger, ts=1.0)
    before = ledger.get_pod("p")

    def boom(*args: object) -> None:
        raise RuntimeError("crash between the event insert and the pods update")

    monkeypatch.setattr(ledger_module, "_flush_pods", boom)
    with pytest.raises(RuntimeError):
        ledger.record_event(EventKind.READY, pod="p", zone=Z1, ts=2.0)
    monkeypatch.undo()
    assert ledger.get_pod("p") == before
    assert [e.kind for e in ledger.events()] == ["requested"]
    ledger.record_event(EventKind.READY, pod="p", zone=Z1, ts=3.0)  # the connection is still usable
    assert ledger.check_view() == []


def test_default_timestamps_come_from_the_clock(ledger: Ledger, clock: FakeClock) -> None:
    ledger.record_event(EventKind.REQUESTED, pod="p", zone=Z1)
    pod = ledger.get_pod("p")
    assert pod is not None and pod.requested_at == clock.now


# -- replay property: for any sequence of events, view == replay(log), and bulk == one at a time ------

_KINDS = [
    EventKind.REQUESTED,
    EventKind.QUEUED,
    EventKind.CREATED,
    EventKind.READY,
    EventKind.PREEMPTED,
    EventKind.FAILED,
    EventKind.DELETED,
    EventKind.GONE,
    EventKind.PRICE_CHANGE,
    EventKind.GC,
    EventKind.ATTEMPT,
]

event_strategy = st.builds(
    lambda kind, pod, zone, chips, price, label, ts: NewEvent(
        kind,
        pod=pod,
        zone=zone,
        chips=chips,
        price_per_chip_hour=price if price is not None or kind != EventKind.PRICE_CHANGE else 1.0,
        labels=None if label is None else {"team": label},
        ts=ts,
    ),
    st.sampled_from(_KINDS),
    st.sampled_from(["a", "b"]),
    st.sampled_from([Z1, Z2]),
    st.none() | st.sampled_from([4, 8]),
    st.none() | st.sampled_from([0.5, 1.0, 2.0]),
    st.none() | st.sampled_from(["x", "y"]),
    st.floats(min_value=0, max_value=1e6, allow_nan=False),
)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=st.lists(event_strategy, max_size=40))
def test_view_is_the_replay_of_the_log_and_bulk_matches_singles(
    tmp_path_factory: pytest.TempPathFactory, events: list[NewEvent]
) -> None:
    base = tmp_path_factory.mktemp("replay")
    with Ledger(base / "single") as single, Ledger(base / "bulk") as bulk:
        for ev in events:
            single.record_event(**ev._asdict())
        assert bulk.record_events_bulk(events) == len(events)
        assert single.check_view() == []
        assert bulk.check_view() == []
        assert single.list_pods() == bulk.list_pods()
        assert list(single.events()) == list(bulk.events())
        pods = single.list_pods()
        # At most one open incarnation per zone+name, incarnations numbered 1..n.
        open_keys = [(p.zone, p.name) for p in pods if p.alive]
        assert len(open_keys) == len(set(open_keys))
        for key in {(p.zone, p.name) for p in pods}:
            incs = sorted(p.incarnation for p in pods if (p.zone, p.name) == key)
            assert incs == list(range(1, len(incs) + 1))


def test_check_view_reports_a_tampered_view(ledger: Ledger) -> None:
    request(ledger, ts=1.0)
    assert ledger.check_view() == []
    write_by_hand(ledger, "UPDATE pods SET state = 'READY'")
    problems = ledger.check_view()
    assert len(problems) == 1 and "REQUESTED" in problems[0]
