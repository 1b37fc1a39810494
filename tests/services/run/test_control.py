"""A background supervisor that did not start fails the run, unless another supervisor holds it; a
cancel from another machine reaches the hosts as the run did (the saved request itself: test_saved)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, cast

from tpuctl.errors import EXIT_LEASE_HELD, LeaseHeldError
from tpuctl.services.run.control import _not_started
from tpuctl.services.run.model import RecoveryPolicy, RunRequest
from tpuctl.services.run.rundir import RunDir
from tpuctl.store.ledger import Ledger
from tpuctl.store.records import LeaseOwner, RunStatus
from tpuctl.store.secrets import load_secret_key

if TYPE_CHECKING:
    from tpuctl.services.session import Session


def test_a_supervisor_that_found_the_lease_held_fails_nothing(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path)
    ledger.create_run("r1", script="train.py")
    session = cast("Session", SimpleNamespace(ledger=ledger))
    other = ledger.claim_lease("r1", LeaseOwner("owner-o", "host-o", 77, 1), 300.0)
    error = _not_started(session, "r1", "exited at once (status 9)", tmp_path / "log", returncode=9)
    assert isinstance(error, LeaseHeldError) and error.pid == 77 and error.exit_code == EXIT_LEASE_HELD
    ledger.release_lease(other)  # held when the child looked, released since: still not this one's to fail
    error = _not_started(session, "r1", "exited at once (status 9)", tmp_path / "log", returncode=9)
    assert "another supervisor held its lease" in error.message
    record = ledger.get_run("r1")
    assert record is not None and record.status == RunStatus.PENDING.value
    _not_started(session, "r1", "exited at once (status 1)", tmp_path / "log", returncode=1)
    record = ledger.get_run("r1")
    assert record is not None and record.status == RunStatus.FAILED.value


def test_a_cancel_on_another_machine_reaches_the_hosts_as_the_run_did(tmp_path: Path) -> None:
    """The saved request's ProxyCommand (hosts without external IPs: the only way in) and remote root
    are what a cancel from another machine stops the run's programs with; defaults without a request."""
    from tpuctl.services.run.control import _host_access
    from tpuctl.services.run.hosts import HostAccess
    from tpuctl.services.run.saved import record_request

    proxy = "gcloud compute start-iap-tunnel %n %p --listen-on-stdin --zone=%z"
    request = RunRequest(example="lm", ssh_proxy_command=proxy, ssh_remote_root="/opt/t")
    key = load_secret_key(env_key=None, key_file=tmp_path / "secret.key")
    with Ledger(tmp_path / "shared") as ledger:
        ledger.create_run("run-x", script="example:lm")
        record_request(ledger, RunDir.of(tmp_path / "one", "run-x"), request, run_id="run-x",
                       budget_usd=None, policy=RecoveryPolicy(), key=key)  # fmt: skip
        elsewhere = RunDir.of(tmp_path / "two", "run-x")
        assert _host_access(ledger, "run-x", elsewhere) == HostAccess("/opt/t", proxy)
        ledger.create_run("run-y", script="example:lm")
        assert _host_access(ledger, "run-y", RunDir.of(tmp_path / "two", "run-y")) == HostAccess(".tpuctl")
