"""Which run a user means: a whole id, a unique prefix or suffix, `latest` (or nothing); several matches
are refused (exit 2) listing them, newest first."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tpuctl.errors import EXIT_USAGE, UsageError
from tpuctl.services.run.lookup import resolve_run_id
from tpuctl.store.ledger import Ledger

IDS = ["run-20261124-150900-ab16", "run-20261124-150901-cd16", "run-20261125-090000-ef01"]


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    ledger = Ledger(tmp_path)
    for i, run_id in enumerate(IDS):
        ledger.create_run(run_id, script="train.py", ts=time.time() + i)  # created in this order
    return ledger


def test_whole_prefix_suffix_and_latest(ledger: Ledger) -> None:
    assert resolve_run_id(ledger, IDS[1]) == IDS[1]
    assert resolve_run_id(ledger, "ab16") == IDS[0]
    assert resolve_run_id(ledger, "run-20261125") == IDS[2]
    assert resolve_run_id(ledger, "latest") == IDS[2]
    assert resolve_run_id(ledger, None) == IDS[2]


def test_an_ambiguous_fragment_lists_the_matches(ledger: Ledger) -> None:
    with pytest.raises(UsageError) as caught:
        resolve_run_id(ledger, "16")
    assert caught.value.exit_code == EXIT_USAGE == 2
    assert caught.value.message == f"'16' matches 2 runs: {IDS[1]}, {IDS[0]}"
    assert caught.value.field == "RUN"


def test_no_match_and_no_runs(ledger: Ledger, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no run 'zz99'"):
        resolve_run_id(ledger, "zz99")
    with pytest.raises(UsageError, match="no run '%'"):  # a LIKE wildcard is a literal here
        resolve_run_id(ledger, "%")
    with pytest.raises(UsageError, match="there are no runs yet"):
        resolve_run_id(Ledger(tmp_path / "empty"), "latest")


def test_only_the_visible_workspaces_runs_are_found(tmp_path: Path) -> None:
    """Another workspace's run is not found, as an absent one, and never makes a fragment ambiguous; a run
    from before workspaces is the local workspace's."""
    ledger = Ledger(tmp_path / "scoped")
    ledger.create_run(IDS[0], script="train.py", ts=time.time(), workspace="team-a")
    ledger.create_run(IDS[1], script="train.py", ts=time.time() + 1, workspace="team-b")
    ledger.create_run(IDS[2], script="train.py", ts=time.time() + 2)  # no workspace: the local one
    team_a = frozenset({"team-a"})
    assert resolve_run_id(ledger, "16", team_a) == IDS[0]  # ambiguous to one who sees both
    assert resolve_run_id(ledger, "latest", team_a) == IDS[0]
    assert resolve_run_id(ledger, IDS[2], frozenset({"default"})) == IDS[2]
    for hidden in (IDS[1], "cd16", "run-20261125"):
        with pytest.raises(UsageError) as caught:
            resolve_run_id(ledger, hidden, team_a)
        assert caught.value.exit_code == 11 and caught.value.message == f"no run {hidden!r}"
    with pytest.raises(UsageError) as none:
        resolve_run_id(ledger, None, frozenset())
    assert none.value.exit_code == 11
