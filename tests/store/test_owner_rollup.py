"""Revision 0004: ``cost_rollup_owner``, the billed slices of ``cost_rollup`` keyed by owner, kept by
triggers on both engines through single, bulk and hand-made writes, backfilled when a ledger at 0003 is
upgraded, and re-derived by ``check_view``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from ledger_sql import write_by_hand

from tpuctl.catalog import CapacityType
from tpuctl.store import EventKind, Ledger, NewEvent, billing, migrate
from tpuctl.store.database import open_database
from tpuctl.store.engine import create_engine
from tpuctl.store.owner_rollup import OWNER
from tpuctl.store.sql import POSTGRESQL, SQLITE, Dialect, SqlAlchemyConnection
from tpuctl.store.url import parse_database_url

DAY = 86400.0
D0 = 20_000 * DAY  # a UTC midnight
DAY0 = 20_000
Z = "us-central1-a"
OpenLedger = Callable[..., Ledger]


def _life(
    name: str, ready: float, end: float, kind: EventKind = EventKind.DELETED, **opening: Any
) -> list[NewEvent]:
    """A slice requested a minute before ``ready`` (with ``opening``'s attributes), READY, then ended."""
    attrs = {"chips": 8, "accelerator_type": "v5e-8", "capacity": CapacityType.ON_DEMAND,
             "price_per_chip_hour": 1.5, **opening}  # fmt: skip
    return [
        NewEvent(EventKind.REQUESTED, pod=name, zone=Z, ts=ready - 60, **attrs),
        NewEvent(EventKind.READY, pod=name, zone=Z, ts=ready),
        NewEvent(kind, pod=name, zone=Z, ts=end),
    ]


def _one_by_one(ledger: Ledger, events: list[NewEvent]) -> None:
    for event in events:
        ledger.record_event(**event._asdict())


def _rows(ledger: Ledger, sql: str | Callable[[Dialect], str]) -> list[tuple[Any, ...]]:
    with ledger._read() as conn:
        text = sql if isinstance(sql, str) else sql(conn.dialect)
        return [tuple(r) for r in conn.execute(text).fetchall()]


def _table(ledger: Ledger) -> list[tuple[Any, ...]]:
    return _rows(ledger, "SELECT * FROM cost_rollup_owner ORDER BY 1, 2, 3, 4, 5, 6")


def _assert_kept(ledger: Ledger) -> list[tuple[Any, ...]]:
    """The table equals its check, and ``check_view`` finds nothing wrong with it; its rows."""
    have, want = _table(ledger), _rows(ledger, OWNER.check_sql)
    assert [r[:7] for r in have] == [r[:7] for r in want]
    assert [r[7:] for r in have] == [pytest.approx(r[7:]) for r in want]
    assert [p for p in ledger.check_view() if p.startswith("cost_rollup_owner")] == []
    return have


def _null(ledger: Ledger) -> str:
    return billing.null_key(SQLITE if ledger.url.path is not None else POSTGRESQL)


def test_the_triggers_keep_the_owner_rollup_through_every_write(open_ledger: OpenLedger) -> None:
    with open_ledger() as ledger:
        alice: dict[str, Any] = {"principal": "alice@example.com", "workspace": "ml"}
        _one_by_one(ledger, _life("day", D0 + 3600, D0 + 7200, **alice))
        _one_by_one(ledger, _life("midnight", D0 + 80_000, D0 + DAY + 3600, **alice))  # crosses: not here
        spot = CapacityType.SPOT
        _one_by_one(ledger, _life("free", D0 + 1000, D0 + 1030, EventKind.PREEMPTED, capacity=spot, **alice))
        # Owned only from its closing event (a slice first learnt of from the listing).
        _one_by_one(ledger, _life("closing", D0 + 1000, D0 + 4600)[:2])
        ledger.record_event(EventKind.PREEMPTED, pod="closing", zone=Z, ts=D0 + 4600, principal="bob",
                            workspace="infra")  # fmt: skip
        # An event after it closed carries an owner: the view keeps a slice's owner as its billing
        # closed (nobody's here), and so does the rollup.
        _one_by_one(ledger, _life("late", D0 + 2000, D0 + 5000, EventKind.PREEMPTED, capacity=spot))
        ledger.record_event(EventKind.DELETED, pod="late", zone=Z, ts=D0 + 9000, principal="carol",
                            workspace="ml")  # fmt: skip
        ledger.record_events_bulk([
            *_life("bulk-a", D0 + DAY + 100, D0 + DAY + 3700, **alice),
            *_life("bulk-b", D0 + DAY + 200, D0 + DAY + 1000, **alice),
            *_life("bulk-untyped", D0 + DAY + 300, D0 + DAY + 900, accelerator_type=None, capacity=None),
            *_life("bulk-open", D0 + DAY + 400, D0 + DAY + 900)[:2],
        ])  # fmt: skip
        rows = _assert_kept(ledger)
        assert ledger.check_view() == []
        null = _null(ledger)
        assert [r[:7] for r in rows] == [
            (DAY0, null, null, Z, "v5e-8", "spot", 1),  # late
            (DAY0, "infra", "bob", Z, "v5e-8", "on-demand", 1),  # closing
            (DAY0, "ml", "alice@example.com", Z, "v5e-8", "on-demand", 1),  # day
            (DAY0 + 1, null, null, Z, null, null, 1),  # bulk-untyped
            (DAY0 + 1, "ml", "alice@example.com", Z, "v5e-8", "on-demand", 2),  # bulk-a, bulk-b
        ]
        assert rows[2][8] == pytest.approx(8 * 3600.0)  # day: billed chip-seconds


def test_a_closed_slice_given_another_owner_moves_its_sums(open_ledger: OpenLedger) -> None:
    with open_ledger() as ledger:
        ledger.record_events_bulk([
            *_life("a", D0 + 100, D0 + 3700, principal="alice", workspace="ml"),
            *_life("b", D0 + 200, D0 + 1000, principal="alice", workspace="ml"),
            *_life("c", D0 + 300, D0 + 900),
        ])  # fmt: skip
        # As a tool attributes existing slices (a plain UPDATE, no event): each slice's sums move.
        write_by_hand(ledger, "UPDATE pods SET workspace = 'infra' WHERE name = 'a'")
        write_by_hand(ledger, "UPDATE pods SET principal = 'bob', workspace = 'infra' WHERE name = 'c'")
        rows = _assert_kept(ledger)
        assert [(r[1], r[2], r[6]) for r in rows] == [
            ("infra", "alice", 1),
            ("infra", "bob", 1),
            ("ml", "alice", 1),
        ]
        assert rows[0][7] == pytest.approx(3600.0)
        # The last slice of a key leaves: its row goes rather than staying as zeros.
        write_by_hand(ledger, "UPDATE pods SET principal = 'bob' WHERE name IN ('a', 'b')")
        rows = _assert_kept(ledger)
        assert [(r[1], r[2], r[6]) for r in rows] == [("infra", "bob", 2), ("ml", "bob", 1)]
        # An owner set to what it is already, or on a slice not rolled, moves nothing.
        write_by_hand(ledger, "UPDATE pods SET principal = 'bob'")
        assert _assert_kept(ledger) == rows


def test_check_view_reports_a_tampered_owner_row(open_ledger: OpenLedger) -> None:
    with open_ledger() as ledger:
        _one_by_one(ledger, _life("a", D0 + 100, D0 + 3700, principal="alice", workspace="ml"))
        assert ledger.check_view() == []
        write_by_hand(ledger, "UPDATE cost_rollup_owner SET billed_usd_s = billed_usd_s + 1")
        (problem,) = ledger.check_view()
        assert problem.startswith(f"cost_rollup_owner ({DAY0}, 'ml', 'alice', '{Z}', 'v5e-8', 'on-demand')")


# --- a ledger at revision 0003, upgraded ------------------------------------------------------------------


@contextmanager
def _ledger_at_0003(url: str) -> Iterator[SqlAlchemyConnection]:
    """A connection to a new ledger made by the history up to 0003_teams, in a transaction committed
    after the block."""
    from alembic import command

    engine = create_engine(parse_database_url(url))
    try:
        with engine.begin() as conn:
            command.upgrade(migrate._config(conn), "0003_teams")
            yield SqlAlchemyConnection.of(conn)
    finally:
        engine.dispose()


_POD = (
    "INSERT INTO pods (id, zone, name, incarnation, state, accelerator_type, chips, capacity, ready_at, "
    "ended_at, end_reason, updated_at, last_event_id, billed_s, billed_chip_s, billed_usd_s, principal, "
    "workspace) VALUES (:id, :zone, :name, 1, 'DELETED', 'v5e-8', 8, 'spot', :ready, :end, :reason, :end, "
    ":id, :end - :ready, 8 * (:end - :ready), 12 * (:end - :ready), :principal, :workspace)"
)


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_a_ledger_at_0003_is_backfilled_when_upgraded(
    engine: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = (
        f"sqlite:///{tmp_path / 'ledger.db'}"
        if engine == "sqlite"
        else request.getfixturevalue("postgres_url")
    )
    slices = [  # id, name, ready, end, reason, principal, workspace
        (1, "a", D0 + 100, D0 + 3700, "deleted", "alice", "ml"),
        (2, "b", D0 + 200, D0 + 1000, "deleted", "alice", "ml"),
        (3, "c", D0 + 300, D0 + 900, "deleted", None, None),
        (4, "free", D0 + 300, D0 + 310, "preempted", "alice", "ml"),  # a free preemption: not rolled
        (5, "x", D0 + 300, D0 + DAY + 310, "deleted", "alice", "ml"),  # crosses midnight: not rolled
    ]
    with _ledger_at_0003(url) as conn:
        for id_, name, ready, end, reason, principal, workspace in slices:
            owner = {"principal": principal, "workspace": workspace}
            times = {"ready": ready, "end": end, "reason": reason}
            conn.execute(_POD, {"id": id_, "zone": Z, "name": name, **times, **owner})
    with Ledger(open_database(parse_database_url(url))) as ledger:
        rows = _assert_kept(ledger)
        null = _null(ledger)
        assert [r[:7] for r in rows] == [
            (DAY0, null, null, Z, "v5e-8", "spot", 1),
            (DAY0, "ml", "alice", Z, "v5e-8", "spot", 2),
        ]
        assert rows[1][7:] == pytest.approx((4400.0, 8 * 4400.0, 12 * 4400.0, 0.0))
        # The upgraded ledger's triggers keep it from here on.
        _one_by_one(ledger, _life("d", D0 + 500, D0 + 600, principal="alice", workspace="ml",
                                  capacity=CapacityType.SPOT))  # fmt: skip
        assert _assert_kept(ledger)[1][6] == 3
