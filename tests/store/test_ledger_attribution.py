"""Whose each row is, on both engines: a run's slices, events and attempts are its owner's whoever writes
them (another supervisor that took the run over too; a bulk import too); a slice outside any run is its
maker's, its later events too; the pods view takes the slice's first attributed event's, and its replay
agrees; rows from before workspaces (NULL) read as the local workspace; `db copy` carries all of it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.store.ledger_sql import other_machine
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
B1 = ("b1@x.com", "team-b")


def _whose(ledger: Ledger, name: str) -> set[tuple[str | None, str | None]]:
    return {(e.principal, e.workspace) for e in ledger.pod_events(name, Z)}


def test_whose_each_row_is(open_ledger: Callable[..., Ledger]) -> None:
    with open_ledger() as ledger:
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
        ledger.record_events_bulk(
            [
                NewEvent(EventKind.REQUESTED, pod="s2", zone=Z, chips=8, run_id="r1", ts=T0 + 70),
                NewEvent(EventKind.READY, pod="s2", zone=Z, ts=T0 + 71),
                NewEvent(EventKind.REQUESTED, pod="t", zone=Z, chips=8, ts=T0 + 72),
            ]
        )
        # A slice outside any run is its maker's to the end; a name used again, its new maker's.
        ledger.record_event(
            EventKind.REQUESTED, pod="p", zone=Z, chips=8, principal=B1[0], workspace=B1[1], ts=T0
        )
        ledger.record_event(EventKind.READY, pod="p", zone=Z, ts=T0 + 1)
        ledger.record_event(EventKind.DELETED, pod="p", zone=Z, ts=T0 + 9)
        ledger.record_event(
            EventKind.REQUESTED, pod="p", zone=Z, chips=8, principal=A1[0], workspace=A1[1], ts=T0 + 10
        )
        # A run and its slice from before workspaces: no principal, no workspace.
        ledger.create_run("old", script="t.py", ts=T0 - 1)
        ledger.record_event(EventKind.REQUESTED, pod="o", zone=Z, chips=8, run_id="old", ts=T0)

        assert _whose(ledger, "s1") == _whose(ledger, "s2") == {A1}
        assert [(a.principal, a.workspace) for a in ledger.attempts("q1")] == [A1]
        pods = [(p.name, p.incarnation, p.principal, p.workspace) for p in ledger.list_pods()]
        assert sorted(pods) == [
            ("o", 1, None, None), ("p", 1, *B1), ("p", 2, *A1), ("s1", 1, *A1), ("s2", 1, *A1),
            ("t", 1, None, None),
        ]  # fmt: skip
        assert [e.workspace for e in ledger.events() if e.pod == "p"] == ["team-b"] * 3 + ["team-a"]
        assert ledger.check_view() == []  # the replay gives each slice the same owner
        assert [r.run_id for r in ledger.list_runs(workspaces={"default"})] == ["old"]
        assert [r.run_id for r in ledger.list_runs(principal=A1[0])] == ["r1"]
        assert sorted(p.name for p in ledger.list_pods(workspaces={"default"})) == ["o", "t"]
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
        assert _whose(team, "s") == {A1}
        assert [(p.principal, p.workspace) for p in team.list_pods()] == [A1]
        assert [(a.principal, a.workspace) for a in team.attempts("q")] == [A1]
