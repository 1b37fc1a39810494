"""The month's spend the server's queue orders by: what runs spent since the start of the calendar month
(UTC), per workspace and per principal in it; a slice of last month and one of no run count for none."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tpuctl.catalog import CapacityType
from tpuctl.services.queue_spend import month_spend
from tpuctl.services.session import Session, open_session
from tpuctl.settings import load_settings
from tpuctl.store.records import EventKind, NewEvent
from tpuctl.testing.backend import InProcessCli

NOW = datetime(2026, 11, 15, 12, 0, tzinfo=UTC).timestamp()
HOUR = 3600.0


@pytest.fixture
def session(sim_cli: InProcessCli, state_dir: Path) -> Iterator[Session]:
    with open_session(
        load_settings({"backend": "sim", "state_dir": state_dir}), backend=sim_cli.backend
    ) as s:
        yield s


def billed(session: Session, pod: str, run_id: str | None, *, ready: float, hours: float, chips: int) -> None:
    """A slice of ``run_id`` at 1 USD per chip-hour, READY for ``hours``."""
    common: dict[str, Any] = {"pod": pod, "zone": "us-central1-a"}
    session.ledger.record_events_bulk([
        NewEvent(EventKind.REQUESTED, accelerator_type=f"v5litepod-{chips}", chips=chips,
                 capacity=CapacityType.SPOT, price_per_chip_hour=1.0, run_id=run_id, ts=ready - 60, **common),
        NewEvent(EventKind.READY, ts=ready, **common),
        NewEvent(EventKind.DELETED, ts=ready + hours * HOUR, **common),
    ])  # fmt: skip


def test_spend_this_month_per_workspace_and_principal(session: Session) -> None:
    ledger = session.ledger
    for run_id, principal, workspace in (
        ("a-run", "a1@example.com", "team-a"),
        ("a-run-2", "a2@example.com", "team-a"),
        ("b-run", "b1@example.com", "team-b"),
    ):
        ledger.create_run(run_id, script="x.py", principal=principal, workspace=workspace)
    billed(session, "s1", "a-run", ready=NOW - 5 * HOUR, hours=1, chips=8)  # 8 USD
    billed(session, "s2", "a-run-2", ready=NOW - 5 * HOUR, hours=0.5, chips=4)  # 2 USD
    billed(session, "s3", "b-run", ready=NOW - 5 * HOUR, hours=1, chips=1)  # 1 USD
    billed(session, "s4", "a-run", ready=datetime(2026, 10, 31, 20, tzinfo=UTC).timestamp(), hours=1, chips=8)
    billed(session, "s5", None, ready=NOW - 5 * HOUR, hours=1, chips=8)  # no run's
    spend = month_spend(session, now=NOW)
    assert spend.month == "2026-11"
    assert {k: round(v, 6) for k, v in spend.by_workspace.items()} == {"team-a": 10.0, "team-b": 1.0}
    assert {k: round(v, 6) for k, v in spend.by_principal.items()} == {
        ("team-a", "a1@example.com"): 8.0,
        ("team-a", "a2@example.com"): 2.0,
        ("team-b", "b1@example.com"): 1.0,
    }
