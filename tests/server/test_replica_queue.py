"""The replica and the queue over the in-process simulator, for what needs no host: a run admitted whose
first placement finds no quota anywhere goes back to the queue with that reason and a back-off, never
failed for being early, and is not admitted again before its back-off ends."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_replica import submitted

from tpuctl.server.replica import Replica
from tpuctl.services.session import Session, open_session
from tpuctl.settings import load_settings
from tpuctl.store.queue import REQUEUE_FIRST_S, REQUEUES, RETRY_AT
from tpuctl.store.records import LeaseOwner, RunStatus
from tpuctl.testing.backend import InProcessCli
from tpuctl.testing.clock import wait_for


@pytest.fixture
def sim_world() -> dict[str, Any]:
    """v5e offered in the run's zone, but no quota for it anywhere."""
    return {
        "zones": {"us-central1-a": {"v5e": {"on_demand": 64, "preemptible": 64}}},
        "quotas": {
            "default": {"on_demand": {"zone": 0, "region": 0}, "preemptible": {"zone": 0, "region": 0}}
        },
        "latency": {"base_ms": 0, "jitter_ms": 0},
    }


@pytest.fixture
def session(sim_cli: InProcessCli, state_dir: Path) -> Iterator[Session]:
    settings = load_settings({"backend": "sim", "state_dir": state_dir, "lease_duration": 30})
    with open_session(settings, backend=sim_cli.backend) as opened:
        yield opened


def test_no_quota_at_the_first_placement_sends_the_run_back_to_the_queue(
    session: Session, state_dir: Path
) -> None:
    replica = Replica(session, LeaseOwner.of_this_process(), listen="127.0.0.1:1", max_runs=4, tick_s=3600)
    run_id = submitted(session, state_dir)
    try:
        replica.tick()  # by hand: admits the run and takes it up

        def back() -> Any:
            record = session.ledger.get_run(run_id)
            assert record is not None and not RunStatus(record.status).finished, record
            waiting = record.status == RunStatus.QUEUED and record.admitted_at is None
            return record if waiting and not replica.supervising() else None

        record = wait_for(back, timeout=60.0, interval=0.05, what="the run back in the queue")
        assert record.queue_reason is not None
        assert record.queue_reason.startswith("no room at Google: not enough quota for v5litepod-8")
        assert all(s.end is not None for s in session.ledger.segments(run_id))
        detail = record.detail or {}
        assert detail[REQUEUES] == 1 and detail[RETRY_AT] >= session.ledger.db_now() + REQUEUE_FIRST_S - 5
        assert session.ledger.lease_of(run_id) is None  # nobody holds it: it waits
        replica.tick()  # backing off: not admitted again
        again = session.ledger.get_run(run_id)
        assert again is not None and again.status == RunStatus.QUEUED and replica.supervising() == []
        assert again.queue_reason == record.queue_reason
    finally:
        replica.stop()
