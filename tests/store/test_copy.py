"""`db copy` (``tpuctl.store.copy``, checked by ``tpuctl.services.db_copy``): a laptop's SQLite ledger
copied into PostgreSQL gives the same rows and the same cost report to the cent; a second copy writes
nothing; a copy stopped after some chunks goes on without duplicates; a ledger still in use is refused;
every table of the schema has a decision."""

from __future__ import annotations

import importlib
import random
import shutil
from pathlib import Path
from typing import Any

import pytest

from tpuctl.catalog import CapacityType, Catalog
from tpuctl.errors import UsageError
from tpuctl.services.cost import CostService, parse_group_by
from tpuctl.services.db_copy import CopyResult, copy_database
from tpuctl.services.prices import PriceSource
from tpuctl.store import (
    AttemptOutcome,
    EventKind,
    IntentAction,
    LeaseOwner,
    Ledger,
    NewEvent,
    RunStatus,
    SegmentKind,
    SliceRef,
)
from tpuctl.store.copy import TABLES, CopyStep, progress_key
from tpuctl.store.tables import build_metadata
from tpuctl.store.url import DatabaseUrl, parse_database_url, sqlite_url

T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z
DAY = 86400.0
NOW = T0 + 6 * DAY
ZONES = ("us-central1-a", "europe-west4-b")
#: The groupings compared in the default suite (the slow test compares every one).
GROUPS = ("zone", "run", "day")


def laptop(path: Path, *, tag: str = "a", slices: int = 60, seed: int = 1) -> DatabaseUrl:
    """A quiet laptop ledger: finished runs with every record a run has, slices (all ended) with
    preemptions, quota held, price changes and midnight crossings, placement attempts; ~4 events a slice."""
    rng = random.Random(seed)
    url = sqlite_url(path)
    runs = [f"run-{tag}{i}" for i in range(3)]
    with Ledger.open(url, clock=lambda: NOW) as ledger:
        owner = LeaseOwner(f"owner-{tag}", "laptop", 4242, 7)
        for run_id in runs:
            ledger.create_run(run_id, script="train.py", labels={"team": tag}, ts=T0 - DAY)
            claim = ledger.claim_lease(run_id, owner, 60.0)
            ledger.save_run_request(run_id, '{"script": "train.py"}')
            ledger.save_bundle(run_id, b"\x00\xffbundle of " + run_id.encode())
            ledger.record_intent(claim, IntentAction.CREATE, f"{run_id}-s", ZONES[0])
            ledger.update_run_state(claim, phase="running", attempt=1, slices=[SliceRef("s0", ZONES[0])])
            ledger.append_log_lines(claim, 0, 0, [(T0, "step 1"), (T0 + 1, "step 2")])
            ledger.remember_submission(f"key-{run_id}", run_id, "0" * 64)
            ledger.release_lease(claim)
        events: list[NewEvent] = []
        segments: list[tuple[str, str, str, float, float]] = []
        for n in range(slices):
            where: dict[str, Any] = {"pod": f"{tag}{n}", "zone": rng.choice(ZONES)}
            capacity = rng.choice((CapacityType.SPOT, CapacityType.ON_DEMAND))
            ready = T0 + rng.uniform(-2 * DAY, 2 * DAY)
            owner_run = rng.choice((*runs, None))
            events.append(NewEvent(EventKind.REQUESTED, accelerator_type="v5litepod-8", chips=8,
                                   capacity=capacity, price_per_chip_hour=rng.choice((0.245, 1.2)),
                                   labels={"team": tag}, run_id=owner_run, ts=ready - 60,
                                   **where))  # fmt: skip
            events.append(NewEvent(EventKind.READY, ts=ready, **where))
            life = rng.choice((45.0, rng.expovariate(1 / 20000.0), rng.uniform(DAY, 1.5 * DAY)))
            if rng.random() < 0.2:
                events.append(NewEvent(EventKind.PRICE_CHANGE, price_per_chip_hour=0.5, ts=ready + life / 2,
                                       **where))  # fmt: skip
            if owner_run is not None:
                segments.append((owner_run, where["pod"], where["zone"], ready, ready + life))
            if capacity == CapacityType.SPOT and rng.random() < 0.4:
                events.append(NewEvent(EventKind.PREEMPTED, ts=ready + life, **where))
                events.append(NewEvent(EventKind.DELETED, ts=ready + life + 600, **where))
            else:
                events.append(NewEvent(EventKind.DELETED, ts=ready + life, **where))
        events.sort(key=lambda e: e.ts or 0.0)
        ledger.record_events_bulk(events)
        for i in range(5):
            ledger.record_attempt(f"req-{tag}{i}", zone=ZONES[i % 2], outcome=AttemptOutcome.STOCKOUT,
                                  pod=f"{tag}-try{i}", detail={"i": i}, ts=T0 + i)  # fmt: skip
        for run_id, pod, zone, start, end in segments:
            seg = ledger.add_segment(run_id, SegmentKind.RUNNING, start=start, pod=pod, zone=zone)
            ledger.close_segment(seg, end=end, steps_completed=100, steps_recomputed=rng.choice((0, 10)))
        for run_id in runs:
            ledger.update_run(run_id, status=RunStatus.SUCCEEDED, ended_at=T0 + 3 * DAY)
        assert ledger.check_view() == []
    return url


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The laptops' ledgers, built once for the module; each test copies the file it uses."""
    where = tmp_path_factory.mktemp("laptops")
    laptop(where / "a.db", slices=40)
    laptop(where / "b.db", tag="b", slices=20, seed=2)
    return {"a": where / "a.db", "b": where / "b.db"}


def own(built: dict[str, Path], name: str, tmp_path: Path) -> DatabaseUrl:
    """This test's copy of the laptop ledger ``name`` (the same identity as every other copy of it)."""
    path = tmp_path / f"{name}.db"
    shutil.copyfile(built[name], path)
    return sqlite_url(path)


def copy(source: DatabaseUrl, target: DatabaseUrl, *, now: float = NOW, **kwargs: Any) -> CopyResult:
    catalog = Catalog.load()
    prices = PriceSource(catalog.prices.source, catalog.prices.date, cached=False)
    return copy_database(source, target, catalog=catalog, prices=prices, clock=lambda: now, **kwargs)


def reports(url: DatabaseUrl, groups: tuple[str, ...] = GROUPS, now: float = NOW) -> dict[str, Any]:
    """`cost report` by each grouping, every figure to the cent: what the acceptance compares."""
    catalog = Catalog.load()
    prices = PriceSource(catalog.prices.source, catalog.prices.date, cached=False)
    service = CostService(url, catalog, prices, clock=lambda: now, workers=1)
    return {group: _cents(service.report(group_by=parse_group_by(group)).to_dict()) for group in groups}


def _cents(value: Any) -> Any:
    """``value`` with every figure to the cent (the instants a slice's or run's line shows compared as
    printed: to the second, on both engines alike)."""
    if isinstance(value, float):
        return round(value, 2)
    if isinstance(value, dict):
        return {k: _cents(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_cents(v) for v in value]
    return value


def test_every_table_of_the_schema_has_a_decision() -> None:
    assert set(TABLES) == set(build_metadata().tables) - {"alembic_version"}


def test_a_laptop_ledger_copied_into_postgresql_gives_the_same_cost_report_and_rows(
    built: dict[str, Path], tmp_path: Path, postgres_url: str
) -> None:
    source, target = own(built, "a", tmp_path), parse_database_url(postgres_url)
    first = copy(source, target)
    assert first.scope == "ledger" and first.outcome is not None
    assert (first.outcome.runs_copied, first.outcome.events_copied, first.outcome.attempts_copied) == (
        3,
        first.source_rows["events"],
        5,
    )
    assert first.target_rows == first.source_rows and first.source_rows["run_log_lines"] == 6
    assert first.source_cost["cost_usd"] > 0 and first.source_cost == pytest.approx(first.target_cost)
    assert reports(target) == reports(source)
    with Ledger.open(target) as copied, Ledger.open(source) as original:
        assert copied.check_view() == []
        assert copied.bundle("run-a0") == original.bundle("run-a0")
        assert [a.pod for a in copied.attempts("req-a3")] == ["a-try3"]
        # Each attempt points at its own event, renumbered into the target.
        (attempt,) = copied.attempts("req-a3")
        (event,) = [e for e in copied.events(kinds=[EventKind.ATTEMPT]) if e.id == attempt.event_id]
        assert event.request_id == "req-a3"
        assert copied.segments("run-a0") == original.segments("run-a0") != []
        assert copied.lease_history("run-a0")[-1].action == original.lease_history("run-a0")[-1].action
        assert copied.log_lines("run-a0") == original.log_lines("run-a0")
        assert [r.steps for r in copied.list_runs()] == [r.steps for r in original.list_runs()]


def test_a_copy_stopped_after_some_chunks_goes_on_without_duplicates_and_then_writes_nothing(
    built: dict[str, Path], tmp_path: Path
) -> None:
    source, target = own(built, "a", tmp_path), sqlite_url(tmp_path / "team.db")
    steps: list[CopyStep] = []

    def stop_after_two_chunks(step: CopyStep) -> None:
        steps.append(step)
        if step.phase == "events" and step.done >= 100:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        copy(source, target, chunk=50, on_step=stop_after_two_chunks)
    with Ledger.open(target) as half, Ledger.open(source) as original:
        assert sum(1 for _ in half.events()) == 100  # two whole chunks, nothing of the third
        identity, last_event = original.identity, max(e.id for e in original.events())
    resumed = copy(source, target, chunk=50)
    assert resumed.scope == "ledger" and resumed.outcome is not None
    assert resumed.outcome.events_copied == resumed.source_rows["events"] - 100
    assert resumed.target_rows == resumed.source_rows
    assert reports(target) == reports(source)
    with Ledger.open(target) as done:
        assert done.check_view() == []
        assert done.identity != identity
    again = copy(source, target, chunk=50)
    assert again.outcome is not None and (again.outcome.runs_copied, again.outcome.events_copied) == (0, 0)
    assert again.outcome.runs_present == 3 and again.target_rows == resumed.target_rows
    assert again.outcome.progress.event == last_event
    assert progress_key(identity) == f"copied:{identity}"


def test_a_second_laptop_into_the_same_database_adds_its_own_history(
    built: dict[str, Path], tmp_path: Path
) -> None:
    first, second = own(built, "a", tmp_path), own(built, "b", tmp_path)
    target = sqlite_url(tmp_path / "team.db")
    copy(first, target)
    merged = copy(second, target)
    assert merged.scope == "copied"  # the target holds the first laptop's too: only the copy is compared
    assert merged.target_rows["runs"] == 6
    with Ledger.open(target) as team:
        # The second laptop's events got new ids after the first's: its attempts point at their own.
        attempts = {i: team.attempts(f"req-b{i}") for i in range(5)}
        by_id = {e.id: e for e in team.events(kinds=[EventKind.ATTEMPT])}
        assert all(len(found) == 1 for found in attempts.values())
        assert [by_id[found[0].event_id].request_id for found in attempts.values()] == [
            f"req-b{i}" for i in range(5)
        ]
    a, b, both = (reports(url, ("run",))["run"] for url in (first, second, target))
    assert both["totals"]["cost_usd"] == pytest.approx(a["totals"]["cost_usd"] + b["totals"]["cost_usd"])


def test_a_ledger_in_use_is_refused_naming_its_runs_and_slices(
    built: dict[str, Path], tmp_path: Path
) -> None:
    source, target = own(built, "b", tmp_path), sqlite_url(tmp_path / "team.db")
    with Ledger.open(source) as ledger:
        ledger.create_run("run-live", script="train.py")
        ledger.record_event(EventKind.READY, pod="busy", zone=ZONES[0], chips=8, ts=T0)
    with pytest.raises(UsageError) as refused:
        copy(source, target)
    assert refused.value.exit_code == 2
    assert "run-live (pending)" in refused.value.message and f"busy in {ZONES[0]}" in refused.value.message
    assert "runs cancel" in (refused.value.fix or "") and not target.path.exists()  # type: ignore[union-attr]


def test_a_dry_run_counts_and_writes_nothing(built: dict[str, Path], tmp_path: Path) -> None:
    source, target = own(built, "b", tmp_path), sqlite_url(tmp_path / "team.db")
    plan = copy(source, target, dry_run=True).plan
    assert plan is not None and (plan.runs, plan.runs_present, plan.events_copied_before) == (3, 0, 0)
    assert plan.events > 0 and not target.path.exists()  # type: ignore[union-attr]
    copy(source, target)
    replanned = copy(source, target, dry_run=True).plan
    assert replanned is not None and (replanned.runs, replanned.runs_present, replanned.events) == (0, 3, 0)


def test_a_ledger_is_not_copied_into_itself(built: dict[str, Path], tmp_path: Path) -> None:
    source = own(built, "b", tmp_path)
    with pytest.raises(UsageError, match="same database"):
        copy(source, source)
    twin = tmp_path / "twin.db"
    shutil.copyfile(built["b"], twin)  # a copy of the file: the same ledger, its history twice
    with pytest.raises(UsageError, match="same ledger"):
        copy(source, sqlite_url(twin))


@pytest.mark.slow
@pytest.mark.timeout(1800)  # about a minute on a quiet 2-core machine; much more on a shared, loaded one
def test_a_ledger_of_100000_events_copied_into_postgresql_gives_the_same_cost_report_to_the_cent(
    tmp_path: Path, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The benchmark's ledger (scripts/bench_cost.py's mix of slices, runs and segments, ended).
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "scripts"))
    bench_copy, bench_cost = (importlib.import_module(name) for name in ("bench_copy", "bench_cost"))
    state = tmp_path / "state"
    built_events = bench_copy.quiet_ledger(state, 100_000, 6)["events"]
    source, target = sqlite_url(state / "ledger.db"), parse_database_url(postgres_url)
    now = bench_cost.START + bench_cost.SPAN_S + DAY
    result = copy(source, target, now=now)
    assert result.scope == "ledger" and result.target_rows["events"] == built_events >= 100_000
    every = ("slice", "run", "zone", "region", "type", "capacity", "day", "label:team")
    assert reports(target, every, now) == reports(source, every, now)
