"""The report's fast path (closed slices summed from the billing facts the view function stored; slice
and run groups computed in SQL) gives exactly what the interval arithmetic over every slice gives, for
every grouping and window, on a random ledger with open slices, window cuts, price changes (within a day
and across midnight), free and paid preemptions, quota held after preemption, unpriced slices, runs that
created slices, runs on slices they did not create, and recomputed steps; and a --limit keeps the
costliest groups of that same report."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tpuctl.catalog import CapacityType, Catalog
from tpuctl.services.cost import CostService, parse_group_by
from tpuctl.services.prices import PriceSource
from tpuctl.store.billing import crosses_midnight_sql
from tpuctl.store.ledger import Ledger
from tpuctl.store.records import EventKind, NewEvent, SegmentKind
from tpuctl.store.url import DatabaseUrl

T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z
DAY = 86400.0
ZONES = ("us-central1-a", "us-east1-c", "europe-west4-b")
TYPES = (("v5litepod-8", 8), ("v5litepod-64", 64), ("v6e-16", 16))
#: Whose each slice is (by its number, drawing nothing from the seed); None: a row from before workspaces.
WORKSPACES = (None, "ws-a", "ws-b")
PRINCIPALS = (None, "u1@example.com", "u2@example.com", "u3@example.com")


def _ledger(open_ledger: Callable[..., Ledger], seed: int, *, shares: bool = True) -> DatabaseUrl:
    """A random ledger (``seed``); ``shares``: some runs ran on slices they did not create, else every
    segment is on a slice its own run created."""
    rng = random.Random(seed)
    events: list[NewEvent] = []
    runs = [f"r{i}" for i in range(12)]  # r11 has no runs row: its slices name a run the ledger lacks
    segments: list[tuple[str, str, str, float, float, int, int]] = []
    for n in range(300):
        zone = rng.choice(ZONES)
        accel, chips = rng.choice(TYPES)
        capacity = rng.choice((CapacityType.SPOT, CapacityType.PREEMPTIBLE, CapacityType.ON_DEMAND))
        price = None if rng.random() < 0.05 else rng.choice((0.245, 1.2, 3.22))
        ready = T0 + rng.uniform(-3 * DAY, 3 * DAY)
        common: dict[str, Any] = {"pod": f"s{n}", "zone": zone}
        run_id = rng.choice(runs) if rng.random() < 0.5 else None
        events.append(
            NewEvent(EventKind.REQUESTED, accelerator_type=accel, chips=chips, capacity=capacity,
                     price_per_chip_hour=price, labels={"team": rng.choice("ab")}, ts=ready - 60,
                     run_id=run_id, workspace=WORKSPACES[n % 3], principal=PRINCIPALS[n % 4], **common)
        )  # fmt: skip
        events.append(NewEvent(EventKind.READY, ts=ready, **common))
        life = rng.choice((30.0, 45.0, 90.0, rng.expovariate(1 / 20000.0), rng.uniform(DAY, 2.5 * DAY)))
        # (Not on unpriced slices: their time before a first price_change has no recorded price, which
        # the stored facts price from the catalog while the reference bills it at the later price.)
        if price is not None and rng.random() < 0.25:
            events.append(
                NewEvent(EventKind.PRICE_CHANGE, price_per_chip_hour=rng.choice((0.5, 2.0)),
                         ts=ready + life * rng.random(), **common)
            )  # fmt: skip
        end = ready + life
        if rng.random() < 0.3:
            # A run's segment on the slice (its own or, --pod, one it did not create), over part of its
            # life or past its end, sometimes redoing steps lost at a preemption.
            start = ready + rng.uniform(-600, life * 0.5)
            completed = rng.randint(1, 400)
            recomputed = rng.choice((0, 0, rng.randint(0, completed)))
            segment_run = run_id if run_id in runs[:11] else rng.choice(runs[:11])
            if shares or run_id is not None:
                segments.append((segment_run, f"s{n}", zone, start,
                                 start + rng.uniform(60, life + 1200), completed, recomputed))  # fmt: skip
        if end > T0 + 3.5 * DAY or rng.random() < 0.05:
            continue  # still open at report time
        if capacity != "on-demand" and rng.random() < 0.4:
            events.append(NewEvent(EventKind.PREEMPTED, ts=end, **common))
            if rng.random() < 0.8:
                events.append(NewEvent(EventKind.DELETED, ts=end + rng.uniform(10, 7200), **common))
        else:
            events.append(NewEvent(EventKind.DELETED, ts=end, **common))
    events.sort(key=lambda e: e.ts or 0.0)
    with open_ledger() as ledger:
        ledger.record_events_bulk(events)
        assert ledger.check_view() == []
        for run in runs[:11]:
            ledger.create_run(run, script=f"{run}.py", ts=T0 - 4 * DAY)
        for run, pod, zone, start, end, completed, recomputed in segments:
            seg = ledger.add_segment(run, SegmentKind.RUNNING, start=start, pod=pod, zone=zone)
            ledger.close_segment(seg, end=end, steps_completed=completed, steps_recomputed=recomputed)
        # The rollups the triggers kept are what the pods view sums to (check_view, on the ledger's
        # engine); both ways of billing slices crossing midnight and quota held are exercised (schema v8):
        # rolled up (and, per window, some of those read slice by slice) and never rolled (price-changed).
        assert ledger.check_view() == []
        assert _count(ledger, "cost_rollup") > 0
        assert _count(ledger, "pods", "rolled = 1") > 0
        unrolled = "rolled = 0 AND ended_at IS NOT NULL AND ready_at IS NOT NULL AND {crossing}"
        assert _count(ledger, "pods", unrolled) > 0
        assert _count(ledger, "cost_rollup_held") > 0
        # Both ways of costing recomputed work are exercised: figures stored on closed slices (schema v7)
        # and segments on slices still open at report time.
        assert _count(ledger, "pods", "rec_priced > 0") > 0
        open_recomputing = (
            "EXISTS (SELECT 1 FROM pods AS p WHERE p.zone = run_segments.zone AND p.name = run_segments.pod "
            "AND p.ended_at IS NULL)"
        )
        assert _count(ledger, "run_segments", f"steps_recomputed > 0 AND {open_recomputing}") > 0
        shared = "EXISTS (SELECT 1 FROM run_segments AS rs WHERE rs.zone = pods.zone AND rs.pod = pods.name)"
        assert (_count(ledger, "pods", f"run_id IS NULL AND {shared}") > 0) is shares
        return ledger.url


def _count(ledger: Ledger, table: str, where: str = "TRUE") -> int:
    """Rows of ``table`` where ``where`` (``{crossing}``: a closed slice crossing midnight), on the
    ledger's own engine."""
    with ledger._read() as conn:
        where = where.replace("{crossing}", crosses_midnight_sql("", conn.dialect))
        return int(conn.execute(f"SELECT COUNT(*) FROM {table} WHERE {where}").fetchone()[0])


def _rounded(doc: dict[str, Any]) -> dict[str, Any]:
    def walk(value: Any) -> Any:
        if isinstance(value, float):
            return round(value, 4)
        if isinstance(value, dict):
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        return value

    return walk(doc)  # type: ignore[no-any-return]


WINDOWS = [
    (None, None),
    (T0 - DAY, None),  # since a midnight-ish instant
    (T0 - 1.5 * DAY + 1234.5, T0 + 0.7 * DAY),  # cut on both sides, off day boundaries
    (T0 - 2 * DAY, T0 + 5 * DAY),  # until after now
]


# On PostgreSQL with --slow only: by default the both-engines test below holds PostgreSQL's report to
# SQLite's on seed 1's ledger, which this test holds to the interval arithmetic.
@pytest.mark.slow_on_postgresql
@pytest.mark.parametrize("seed", [1, 2])
def test_fast_path_equals_interval_arithmetic(open_ledger: Callable[..., Ledger], seed: int) -> None:
    db = _ledger(open_ledger, seed)
    catalog = Catalog.load()
    source = PriceSource(catalog.prices.source, catalog.prices.date, cached=False)
    now = T0 + 4 * DAY

    def service(fast: bool) -> CostService:
        return CostService(db, catalog, source, clock=lambda: now, workers=1, fast=fast)

    for group in ("slice", "run", "zone", "region", "type", "capacity", "day", "label:team"):
        for since, until in WINDOWS:
            fast, slow = (
                service(f).report(since=since, until=until, group_by=parse_group_by(group)).to_dict()
                for f in (True, False)
            )
            assert _rounded(fast) == _rounded(slow), (group, since, until)
            assert fast["totals"]["cost_usd"] > 0
            assert fast["groups_total"] == len(fast["groups"]) > 0
            if group in ("slice", "run"):
                # The ledger exercises what these groupings add: waste, and runs' shares of slices.
                assert fast["totals"]["recomputed_usd"] > 0 and fast["totals"]["quota_held_usd"] > 0
    runs = {g["key"]: g for g in service(True).report(group_by=parse_group_by("run")).to_dict()["groups"]}
    assert runs["r3"]["status"] == "pending" and runs["r3"]["program"] == "r3.py"
    assert "status" not in runs["r11"]  # slices name it, the runs table does not: no run facts
    assert runs["(none)"]["slices"] > 0


def test_by_run_with_no_shares_the_fast_path_still_equals_interval_arithmetic(
    open_ledger: Callable[..., Ledger],
) -> None:
    """No run ran on a slice it did not create: the fast path finds that out and skips the shares' passes
    (and counts each slice no run created as "(none)"'s) for the same report."""
    db = _ledger(open_ledger, 8, shares=False)
    catalog = Catalog.load()
    source = PriceSource(catalog.prices.source, catalog.prices.date, cached=False)
    for since, until in WINDOWS:
        fast, slow = (
            CostService(db, catalog, source, clock=lambda: T0 + 4 * DAY, workers=1, fast=f)
            .report(since=since, until=until, group_by=parse_group_by("run"))
            .to_dict()
            for f in (True, False)
        )
        assert _rounded(fast) == _rounded(slow), (since, until)
        none = next(g for g in fast["groups"] if g["key"] == "(none)")
        assert none["slices"] > 0 and none["cost_usd"] > 0


@pytest.mark.parametrize(
    "group",
    ["run", *(pytest.param(g, marks=pytest.mark.slow_on_postgresql) for g in ("slice", "zone", "day"))],
)
def test_limit_keeps_the_costliest_groups_of_the_same_report(
    open_ledger: Callable[..., Ledger], group: str
) -> None:
    db = _ledger(open_ledger, 3)
    catalog = Catalog.load()
    source = PriceSource(catalog.prices.source, catalog.prices.date, cached=False)
    now = T0 + 4 * DAY
    since = T0 - 1.5 * DAY + 1234.5
    n = 2
    for fast in (True, False):
        service = CostService(db, catalog, source, clock=lambda: now, workers=1, fast=fast)
        full = service.report(since=since, group_by=parse_group_by(group)).to_dict()
        top = service.report(since=since, group_by=parse_group_by(group), limit=n).to_dict()
        assert top["limit"] == n and full["limit"] is None
        assert top["groups_total"] == full["groups_total"] == len(full["groups"]) > n
        assert (top["totals"], top["by_day"]) == (full["totals"], full["by_day"])  # every group counts
        costliest = sorted(full["groups"], key=lambda g: (-g["cost_usd"], full["groups"].index(g)))[:n]
        if group == "day":
            assert top["groups"] == [g for g in full["groups"] if g in costliest]  # in date order
            assert [g["key"] for g in top["groups"]] == sorted(g["key"] for g in top["groups"])
        else:
            assert top["groups"] == full["groups"][:n] == costliest  # most expensive first
        costs = [g["cost_usd"] for g in full["groups"]]
        if group != "day":
            assert costs == sorted(costs, reverse=True)
        assert service.report(since=since, group_by=parse_group_by(group), limit=0).to_dict() == full


@pytest.mark.parametrize("group", [pytest.param("slice", marks=pytest.mark.slow_on_postgresql), "run"])
def test_the_groups_shown_carry_their_recomputed_work(open_ledger: Callable[..., Ledger], group: str) -> None:
    """With a limit only the groups shown get their recomputed work (it does not rank them): the same
    figures as the full report's, in every window, for the many groups that redid steps."""
    db = _ledger(open_ledger, 6)
    catalog = Catalog.load()
    source = PriceSource(catalog.prices.source, catalog.prices.date, cached=False)
    service = CostService(db, catalog, source, clock=lambda: T0 + 4 * DAY, workers=1)
    for since, until in WINDOWS:
        full = service.report(since=since, until=until, group_by=parse_group_by(group)).to_dict()
        assert sum(1 for g in full["groups"] if g["recomputed_usd"] > 0) >= 3
        for limit in (1, 5, len(full["groups"]) - 1):
            top = service.report(since=since, until=until, group_by=parse_group_by(group), limit=limit)
            assert top.to_dict()["groups"] == full["groups"][:limit], (since, until, limit)


@pytest.mark.slow_on_postgresql  # the limit's SQL on PostgreSQL: test_report's limit tests, by default
@pytest.mark.parametrize("seed", [4, 5])
def test_the_costliest_slices_are_the_full_reports_first_ones_in_every_window(
    open_ledger: Callable[..., Ledger], seed: int
) -> None:
    """The limited slice report ranks only slices that can make it (closed ones down to the stored USD of
    the limit-th, plus open, window-cut and unpriced ones), or all of them when fewer closed slices cost
    anything: either way, the full report's first groups."""
    db = _ledger(open_ledger, seed)
    catalog = Catalog.load()
    source = PriceSource(catalog.prices.source, catalog.prices.date, cached=False)
    service = CostService(db, catalog, source, clock=lambda: T0 + 4 * DAY, workers=1)
    for since, until in WINDOWS:
        full = service.report(since=since, until=until).to_dict()
        assert len(full["groups"]) > 20
        for limit in (1, 3, 20, len(full["groups"]) - 1, len(full["groups"]) + 5):
            top = service.report(since=since, until=until, limit=limit).to_dict()
            assert top["groups"] == full["groups"][:limit], (since, until, limit)
            assert top["groups_total"] == full["groups_total"]


@pytest.mark.parametrize("group", ["slice", "run"])
@pytest.mark.parametrize("limit", [None, 5])
def test_no_correlated_subquery_scans_a_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, group: str, limit: int | None
) -> None:
    """Every look-up a report makes per slice or per group is a SEARCH by key: a SCAN there costs a pass
    over a table per row, quadratic on a big ledger (an untyped temp-table key once did exactly that).
    SQLite's query plans: on SQLite only."""
    from tpuctl.store.cost_reader import SqliteReader

    db = _ledger(lambda: Ledger(tmp_path / "state"), 6)
    plans: list[tuple[str, list[tuple[int, int, str]]]] = []
    real_query, real_execute = SqliteReader.query, SqliteReader.execute

    def explain(reader: Any, sql: str, params: Any) -> None:
        if sql.lstrip().upper().startswith(("SELECT", "INSERT", "WITH")):
            rows = reader._conn.execute("EXPLAIN QUERY PLAN " + sql, dict(params)).fetchall()
            plans.append((sql, [(r[0], r[1], r[3]) for r in rows]))

    def query(reader: Any, sql: str, params: Any) -> Any:
        explain(reader, sql, params)
        return real_query(reader, sql, params)

    def execute(reader: Any, sql: str, params: Any) -> None:
        explain(reader, sql, params)
        real_execute(reader, sql, params)

    monkeypatch.setattr(SqliteReader, "query", query)
    monkeypatch.setattr(SqliteReader, "execute", execute)
    catalog = Catalog.load()
    source = PriceSource(catalog.prices.source, catalog.prices.date, cached=False)
    service = CostService(db, catalog, source, clock=lambda: T0 + 4 * DAY, workers=1)
    service.report(group_by=parse_group_by(group), limit=limit)

    assert any("cost_item_rec" in sql or "cost_item_adj" in sql for sql, _ in plans)
    for sql, plan in plans:
        correlated = {node for node, _parent, detail in plan if detail.startswith("CORRELATED")}
        scans = [d for _n, parent, d in plan if parent in correlated and d.startswith("SCAN")]
        assert not scans, (scans, sql)


# --- regressions found by review (schema v8): price changes and the slices crossing midnight ----------

D0 = 1_800_057_600.0  # 2027-01-16T00:00:00Z: a midnight


def _both(db: DatabaseUrl, now: float, windows: list[tuple[float | None, float | None]]) -> list[str]:
    """Where the fast path differs from the reference (groups, totals, per day), for zone, day and slice."""
    catalog = Catalog.load()
    source = PriceSource(catalog.prices.source, catalog.prices.date, cached=False)
    diffs = []
    for group in ("zone", "day", "slice"):
        for since, until in windows:
            fast, slow = (
                CostService(db, catalog, source, clock=lambda: now, workers=1, fast=f)
                .report(since=since, until=until, group_by=parse_group_by(group))
                .to_dict()
                for f in (True, False)
            )
            if _rounded(fast) != _rounded(slow):
                diffs.append(f"{group} {since} {until}: {fast['totals']} != {slow['totals']}")
    return diffs


def _requested(name: str, ts: float, price: float = 1.0) -> NewEvent:
    return NewEvent(EventKind.REQUESTED, pod=name, zone=ZONES[0], accelerator_type="v5litepod-8", chips=8,
                    capacity=CapacityType.SPOT, price_per_chip_hour=price, ts=ts)  # fmt: skip


def test_a_price_change_stamped_at_the_end_does_not_set_the_days_price(
    open_ledger: Callable[..., Ledger],
) -> None:
    """20:00 -> 06:00 across midnight at 1 USD, a change to 3 USD stamped at the very end: billed wholly
    at 1 USD (80 USD for 8 chips x 10 h), each day at 1 USD, not cut at the last price."""
    ready, end = D0 + 20 * 3600, D0 + DAY + 6 * 3600
    z = ZONES[0]
    with open_ledger() as ledger:
        ledger.record_events_bulk(
            [_requested("a", ready - 60), NewEvent(EventKind.READY, pod="a", zone=z, ts=ready)]
        )
        ledger.record_event(EventKind.PRICE_CHANGE, pod="a", zone=z, price_per_chip_hour=3.0, ts=end)
        ledger.record_event(EventKind.DELETED, pod="a", zone=z, ts=end)
        assert ledger.check_view() == []
        db = ledger.url
    assert _both(db, D0 + 5 * DAY, [(None, None), (D0, D0 + 3 * DAY)]) == []
    catalog = Catalog.load()
    source = PriceSource(catalog.prices.source, catalog.prices.date, cached=False)
    report = CostService(db, catalog, source, clock=lambda: D0 + 5 * DAY).report(
        group_by=parse_group_by("day")
    )
    assert [d["cost_usd"] for d in report.by_day] == [pytest.approx(8 * 4 * 1.0), pytest.approx(8 * 6 * 1.0)]
    assert report.totals.cost_usd == pytest.approx(80.0)


@pytest.mark.parametrize("hours", [10, 2])  # across midnight, and within one day
def test_a_price_change_recorded_after_the_slice_ended_changes_nothing(
    open_ledger: Callable[..., Ledger], hours: int
) -> None:
    """Events out of order: a change stamped inside the slice's life but recorded after its end. The
    ledger's view ignores it, and so do both report paths: billed at the price in force when it ran."""
    ready = D0 + 20 * 3600
    end = ready + hours * 3600
    z = ZONES[0]
    with open_ledger() as ledger:
        ledger.record_events_bulk(
            [_requested("a", ready - 60), NewEvent(EventKind.READY, pod="a", zone=z, ts=ready)]
        )
        ledger.record_event(EventKind.DELETED, pod="a", zone=z, ts=end)
        ledger.record_event(EventKind.PRICE_CHANGE, pod="a", zone=z, price_per_chip_hour=3.0, ts=ready + 1800)
        assert ledger.check_view() == []
        db = ledger.url
    assert _both(db, D0 + 5 * DAY, [(None, None), (D0, D0 + 3 * DAY), (D0 + 21 * 3600, None)]) == []
    catalog = Catalog.load()
    source = PriceSource(catalog.prices.source, catalog.prices.date, cached=False)
    report = CostService(db, catalog, source, clock=lambda: D0 + 5 * DAY).report()
    assert report.totals.cost_usd == pytest.approx(8 * hours * 1.0)


def test_a_bulk_import_never_rolls_up_a_slice_whose_price_change_is_not_written_yet(
    open_ledger: Callable[..., Ledger], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bulk path writes pod rows every _POD_FLUSH dirty pods and events every _EVENT_CHUNK: a slice
    closed in a pod flush must find its price change already written (the trigger reads it)."""
    import tpuctl.store.ledger as ledger_module

    monkeypatch.setattr(ledger_module, "_POD_FLUSH", 2)  # the interleaving of 50,000 pods, in a few events
    rx, ex = D0 + 20 * 3600, D0 + DAY + 6 * 3600
    z = ZONES[0]
    events = [
        _requested("x", rx - 60),
        NewEvent(EventKind.READY, pod="x", zone=z, ts=rx),
        NewEvent(EventKind.PRICE_CHANGE, pod="x", zone=z, price_per_chip_hour=3.0, ts=D0 + 22 * 3600),
        NewEvent(EventKind.DELETED, pod="x", zone=z, ts=ex),
        _requested("y", ex + 1),  # the dirty set reaches the flush size with x closed
    ]
    with open_ledger() as ledger:
        ledger.record_events_bulk(events)
        assert ledger.check_view() == []
        assert _count(ledger, "pods", "name = 'x' AND rolled = 0") == 1
        db = ledger.url
    assert _both(db, D0 + 5 * DAY, [(None, None), (D0, D0 + 3 * DAY)]) == []


def _typed(doc: Any) -> Any:
    """``doc`` with each value's type beside it (an int stays an int: 3 slices, never 3.0)."""
    if isinstance(doc, dict):
        return {k: _typed(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_typed(v) for v in doc]
    return (type(doc).__name__, round(doc, 4) if isinstance(doc, float) else doc)


def test_both_engines_give_the_same_report_to_the_cent(tmp_path: Path, postgres_ledger_url: str) -> None:
    """The same events in a SQLite ledger and a PostgreSQL one: the same report, for every grouping and
    window (the fast path; the reference path is held to it above on each engine)."""
    from tpuctl.store import parse_database_url
    from tpuctl.store.database import open_database

    on_sqlite = _ledger(lambda: Ledger(tmp_path / "state"), 1)
    on_postgresql = _ledger(lambda: Ledger(open_database(parse_database_url(postgres_ledger_url))), 1)
    catalog = Catalog.load()
    source = PriceSource(catalog.prices.source, catalog.prices.date, cached=False)
    for group in ("slice", "run", "zone", "day", "label:team"):
        for since, until in WINDOWS:
            sqlite_doc, postgresql_doc = (
                CostService(db, catalog, source, clock=lambda: T0 + 4 * DAY, workers=1)
                .report(since=since, until=until, group_by=parse_group_by(group))
                .to_dict()
                for db in (on_sqlite, on_postgresql)
            )
            assert _typed(postgresql_doc) == _typed(sqlite_doc), (group, since, until)
            assert postgresql_doc["totals"]["cost_usd"] == sqlite_doc["totals"]["cost_usd"]
