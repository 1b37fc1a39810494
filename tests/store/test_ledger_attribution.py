"""Whose each row is, on both engines: a run's slices, events and attempts are its owner's whoever writes
them (another supervisor that took the run over too); a slice outside any run is its maker's, its later
events too; the pods view takes the slice's first attributed event's, and its replay agrees; rows from
before workspaces (NULL) read as the local workspace; `db copy` carries all of it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.store.ledger_sql import other_machine, write_by_hand
from tpuctl.catalog import CapacityType, Catalog
from tpuctl.services.db_copy import copy_database
from tpuctl.services.prices import PriceSource
from tpuctl.services.run.views import RunView
from tpuctl.store import Ledger
from tpuctl.store.records import AttemptOutcome, EventKind, NewEvent, RunStatus
from tpuctl.store.url import sqlite_url

T0 = 1_800_000_000.0
Z = "us-central1-a"
A1 = ("a1@x.com", "team-a")


@pytest.fixture
def ledger(open_ledger: Callable[..., Ledger]) -> Iterator[Ledger]:
    with open_ledger() as led:
        yield led


def _owners(ledger: Ledger) -> tuple[set[tuple[str | None, str | None]], ...]:
    events = {(e.principal, e.workspace) for e in ledger.events()}
    pods = {(p.principal, p.workspace) for p in ledger.list_pods()}
    return events, pods


def test_a_runs_rows_are_its_owners_whoever_writes_them(ledger: Ledger) -> None:
    ledger.create_run("r1", script="t.py", principal=A1[0], workspace=A1[1], ts=T0)
    ledger.record_event(
        EventKind.REQUESTED, pod="s1", zone=Z, accelerator_type="v5litepod-8", chips=8,
        capacity=CapacityType.SPOT, run_id="r1", request_id="q1", ts=T0 + 1,
    )  # fmt: skip
    ledger.record_attempt("q1", zone=Z, outcome=AttemptOutcome.CREATED, run_id="r1", ts=T0 + 2)
    # Another supervisor (a replica acting as itself, on its own connection) carries the run on: its
    # events name only the slice, and still are the run owner's.
    with other_machine(ledger) as replica:
        replica.record_event(EventKind.READY, pod="s1", zone=Z, ts=T0 + 3)
        replica.record_event(EventKind.PREEMPTED, pod="s1", zone=Z, ts=T0 + 60)

    assert _owners(ledger) == ({A1}, {A1})
    (attempt,) = ledger.attempts("q1")
    assert (attempt.principal, attempt.workspace) == A1
    assert ledger.check_view() == []


def test_a_slice_outside_any_run_is_its_makers_to_the_end(ledger: Ledger) -> None:
    ledger.record_event(
        EventKind.REQUESTED, pod="p", zone=Z, chips=8, principal="b1", workspace="team-b", ts=T0
    )
    ledger.record_event(EventKind.READY, pod="p", zone=Z, ts=T0 + 1)
    ledger.record_event(EventKind.DELETED, pod="p", zone=Z, ts=T0 + 9)
    # A name used again is a new slice, with its new maker.
    ledger.record_event(
        EventKind.REQUESTED, pod="p", zone=Z, chips=8, principal=A1[0], workspace=A1[1], ts=T0 + 10
    )

    first, second = ledger.list_pods()
    assert (first.principal, first.workspace) == ("b1", "team-b")
    assert (second.principal, second.workspace) == A1
    assert [e.workspace for e in ledger.events()] == ["team-b", "team-b", "team-b", "team-a"]
    assert [p.name for p in ledger.list_pods(workspaces={"team-a"})] == ["p"]
    assert ledger.check_view() == []


def test_a_bulk_import_attributes_the_runs_slices(ledger: Ledger) -> None:
    ledger.create_run("r1", script="t.py", principal=A1[0], workspace=A1[1], ts=T0)
    ledger.record_events_bulk(
        [
            NewEvent(EventKind.REQUESTED, pod="s", zone=Z, chips=8, run_id="r1", ts=T0 + 1),
            NewEvent(EventKind.READY, pod="s", zone=Z, ts=T0 + 2),
            NewEvent(EventKind.REQUESTED, pod="t", zone=Z, chips=8, ts=T0 + 3),
        ]
    )

    assert {(p.name, p.principal, p.workspace) for p in ledger.list_pods()} == {
        ("s", *A1),
        ("t", None, None),
    }


def test_rows_from_before_workspaces_are_the_local_ones(ledger: Ledger) -> None:
    ledger.create_run("old", script="t.py", ts=T0)
    ledger.record_event(EventKind.REQUESTED, pod="p", zone=Z, chips=8, run_id="old", ts=T0)
    write_by_hand(ledger, "UPDATE runs SET principal = NULL, workspace = NULL")
    ledger.create_run("new", script="t.py", principal=A1[0], workspace=A1[1], ts=T0 + 1)

    assert [r.run_id for r in ledger.list_runs(workspaces={"default"})] == ["old"]
    assert [r.run_id for r in ledger.list_runs(principal=A1[0])] == ["new"]
    assert [p.name for p in ledger.list_pods(workspaces={"default"})] == ["p"]
    old = ledger.get_run("old")
    assert old is not None
    view = RunView.of(old).to_dict()
    assert (view["workspace"], view["principal"]) == ("default", "(unknown)")


def test_db_copy_carries_whose_each_row_is(tmp_path: Path) -> None:
    source = sqlite_url(tmp_path / "laptop.db")
    with Ledger.open(source) as laptop:
        laptop.create_run("r1", script="t.py", principal=A1[0], workspace=A1[1], ts=T0)
        laptop.record_event(EventKind.REQUESTED, pod="s", zone=Z, chips=8, run_id="r1", request_id="q", ts=T0)
        laptop.record_attempt("q", zone=Z, outcome=AttemptOutcome.CREATED, run_id="r1", ts=T0 + 1)
        laptop.record_event(EventKind.DELETED, pod="s", zone=Z, ts=T0 + 5)
        laptop.update_run("r1", status=RunStatus.SUCCEEDED, ended_at=T0 + 5)
    target = sqlite_url(tmp_path / "team.db")
    catalog = Catalog.load()
    prices = PriceSource(catalog.prices.source, catalog.prices.date, cached=False)

    copy_database(source, target, catalog=catalog, prices=prices, clock=lambda: T0 + 10)

    with Ledger.open(target) as team:
        run = team.get_run("r1")
        assert run is not None and (run.principal, run.workspace) == A1
        assert _owners(team) == ({A1}, {A1})
        assert [(a.principal, a.workspace) for a in team.attempts("q")] == [A1]
