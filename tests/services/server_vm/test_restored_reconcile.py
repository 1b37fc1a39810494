"""A ledger restored from a stale copy is reconciled with the simulated cloud: a slice made after the
copy (this ledger's identity on its labels) is deleted, a slice the copy thinks live that is gone is
recorded gone, and what both know is left alone."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from allocator_helpers import InProcessEnv

from tpuctl.cloud.base import LABEL_LEDGER, LABEL_MANAGED_BY, LABEL_OWNER, NodeRequest
from tpuctl.errors import NotFoundError
from tpuctl.services.server_vm.backup import online_copy
from tpuctl.services.server_vm.reconcile import reconcile_restored
from tpuctl.services.session import open_session
from tpuctl.settings import load_settings

ZONE = "us-central1-a"
RT = "v2-alpha-tpuv5-lite"


@pytest.fixture
def env(in_process_sim: Callable[..., InProcessEnv], monkeypatch: pytest.MonkeyPatch) -> InProcessEnv:
    monkeypatch.setenv("TPUCTL_OWNER", "alice")
    return in_process_sim(zones={ZONE: {"v5e": {"on_demand": 64, "preemptible": 64}}})


def test_a_stale_copy_learns_what_changed_after_it(env: InProcessEnv, tmp_path: Path) -> None:
    live = env.session()
    allocator = env.allocator(live)
    allocator.place(env.request("v5e-4", session=live, zones=[ZONE], name="steady"))
    allocator.place(env.request("v5e-4", session=live, zones=[ZONE], name="lost"))
    copy = tmp_path / "copy.db"
    online_copy(Path(live.settings.resolved_database.text.removeprefix("sqlite:///")), copy)
    # After the copy: the old server made a slice (recorded in its ledger, not in the copy), and "lost"
    # was deleted behind its back.
    labels = {LABEL_MANAGED_BY: "tpuctl", LABEL_OWNER: "alice", LABEL_LEDGER: live.ledger.identity}
    live.cloud.create_node(NodeRequest("after", ZONE, "v5litepod-4", RT, labels=labels))
    live.cloud.delete_node(ZONE, "lost")

    settings = load_settings({"state_dir": env.state_dir, "backend": "sim", "database": f"sqlite:///{copy}"})
    restored = open_session(settings, backend=env.runner.backend)
    try:
        assert restored.ledger.identity == live.ledger.identity  # the copy carries the ledger's identity
        result = reconcile_restored(restored)
        assert [(r.item.name, r.deleted) for r in result.deleted] == [("after", True)]
        assert result.recorded_gone == [(ZONE, "lost")]
        with pytest.raises(NotFoundError):
            restored.cloud.get_node(ZONE, "after")
        assert restored.cloud.get_node(ZONE, "steady").state == "READY"
        lost = restored.ledger.get_pod("lost", zone=ZONE)
        assert lost is not None and not lost.alive
        steady = restored.ledger.get_pod("steady", zone=ZONE)
        assert steady is not None and steady.alive
        # A second pass finds nothing left to do.
        again = reconcile_restored(restored)
        assert again.deleted == [] and again.recorded_gone == []
    finally:
        restored.close()
