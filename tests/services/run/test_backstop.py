"""A run's backstop from the supervisor's side: which runs get one and when the cloud ends their slices,
the commands that arm the deadman and check in (run here in a real shell, as host 0's login shell runs
them), and the executor that arms host 0 while the bundle ships, checks in until it closes, arms again when
host 0 lost its deadman, and says so when it cannot arm one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from tpuctl.cloud.base import PlannedRequest
from tpuctl.hosts import deadman
from tpuctl.hosts.base import CommandResult
from tpuctl.services.run import backstop
from tpuctl.services.run.backstop import Backstopped, BackstopPlan, checkin_every
from tpuctl.testing.clock import wait_for

NODE_URL = "https://tpu.googleapis.com/v2/projects/p/locations/z/nodes/s"


def _plan(grace_s: float = 600.0, deadline_at: float | None = None) -> BackstopPlan:
    return BackstopPlan(
        run_id="run-1",
        remote_root=".tpuctl",
        grace_s=grace_s,
        deadline_at=deadline_at,
        delete=(PlannedRequest("DELETE", NODE_URL),),
    )


def _prepared(*, creates: bool = True, keep_pod: bool = False, deadline_at: float | None = None) -> Any:
    request = SimpleNamespace(keep_pod=keep_pod, deadline_at=deadline_at, ssh_remote_root=".tpuctl")
    return SimpleNamespace(target=SimpleNamespace(creates=creates), request=request, run_id="run-1")


def test_only_slices_the_run_makes_and_deletes_are_guarded_and_the_cloud_ends_them_after_the_grace() -> None:
    session = cast(Any, SimpleNamespace(settings=SimpleNamespace(backstop_grace=600.0)))
    assert backstop.guards(_prepared())
    assert not backstop.guards(_prepared(creates=False))  # --pod: the user's slice
    assert not backstop.guards(_prepared(keep_pod=True))
    assert backstop.termination_at(session, _prepared()) is None  # no --max-hours: no deadline
    assert backstop.termination_at(session, _prepared(deadline_at=1000.0)) == 1600.0
    assert backstop.termination_at(session, _prepared(keep_pod=True, deadline_at=1000.0)) is None
    assert checkin_every(600.0) == 60.0 and checkin_every(2.0) == 0.5 and checkin_every(0.1) == 0.2


def test_the_deletes_go_other_slices_first_and_host_zeros_own_last() -> None:
    nodes = [SimpleNamespace(name=f"s-{i}", zone="z", queued_resource=None) for i in range(3)]
    cloud = SimpleNamespace(
        plan_delete_node=lambda zone, name: [PlannedRequest("DELETE", f"{zone}/{name}")],
        plan_delete_queued_resource=lambda zone, qr, force: PlannedRequest(
            "DELETE", f"{zone}/qr/{qr}?{force}"
        ),
    )
    session = cast(Any, SimpleNamespace(cloud=cloud, settings=SimpleNamespace(backstop_grace=90.0)))
    plan = backstop.plan_for(session, _prepared(deadline_at=5.0), cast(Any, SimpleNamespace(nodes=nodes)))
    assert plan is not None and [r.url for r in plan.delete] == ["z/s-1", "z/s-2", "z/s-0"]
    assert plan.config() == {
        "grace_s": 90.0,
        "deadline_at": 5.0,
        "runs_dir": ".tpuctl/runs/run-1",
        "delete": [{"method": "DELETE", "url": u} for u in ("z/s-1", "z/s-2", "z/s-0")],
    }
    assert (
        backstop.plan_for(session, _prepared(keep_pod=True), cast(Any, SimpleNamespace(nodes=nodes))) is None
    )
    # A multislice a queued resource made: the queued resource goes, forced, with every slice of it.
    qr = "projects/p/locations/z/queuedResources/m"
    made = [SimpleNamespace(name=f"m-{i}", zone="z", queued_resource=qr) for i in range(2)]
    plan = backstop.plan_for(session, _prepared(), cast(Any, SimpleNamespace(nodes=made)))
    assert plan is not None and [r.url for r in plan.delete] == ["z/qr/m?True"]


def _login_shell(command: str, home: Path, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "HOME": str(home), "GCE_METADATA_HOST": "127.0.0.1:9"}
    return subprocess.run(
        ["sh", "-c", command], input=stdin, cwd=home, env=env, capture_output=True, timeout=30
    )


def test_the_arm_and_check_in_commands_work_in_a_login_shell(tmp_path: Path) -> None:
    plan = _plan()
    armed = _login_shell(plan.arm_command(), tmp_path, backstop.script_text())
    assert armed.returncode == 0, armed.stderr
    pid = int(armed.stdout.split()[1])
    try:
        folder = tmp_path / plan.directory
        assert (folder / deadman.SCRIPT).read_bytes() == backstop.script_text()
        config = json.loads((folder / deadman.CONFIG).read_text())
        assert config["runs_dir"] == str(tmp_path / ".tpuctl/runs/run-1")  # absolute on the host
        assert config["metadata_host"] == "127.0.0.1:9" and config["delete"][0]["url"] == NODE_URL
        assert _login_shell(plan.checkin_command(), tmp_path).returncode == 0
        (folder / deadman.CHECKIN).unlink()
        assert _login_shell(plan.checkin_command(), tmp_path).returncode != 0  # then it is armed again
    finally:
        os.kill(pid, signal.SIGKILL)


class FakeHost0:
    """An executor's ``run_command`` for host 0: answers each command with the next status of its kind."""

    def __init__(self, *, arm: list[int] | None = None, checkin: list[int] | None = None) -> None:
        self.commands: list[str] = []
        self.statuses = {"arm": arm or [], "checkin": checkin or []}
        self.closed = False
        self.shipped = threading.Event()

    @property
    def num_hosts(self) -> int:
        return 1

    def ship(self, bundle: Any) -> list[Any]:
        self.shipped.set()
        return []

    def run_command(
        self,
        command: str,
        *,
        on_line: Callable[[int, str], None],
        timeout_s: float,
        workers: Sequence[int] | None = None,
        stdin: bytes = b"",
    ) -> dict[int, CommandResult]:
        assert workers == [0]
        kind = "arm" if " arm " in command else "checkin"
        assert (stdin == backstop.script_text()) == (kind == "arm")
        self.commands.append(kind)
        queue = self.statuses[kind]
        status = queue.pop(0) if queue else 0
        return {0: CommandResult(0, status, ("deadman: bad config",) if status else ())}

    def close(self) -> None:
        self.closed = True


def test_it_arms_while_shipping_checks_in_until_closed_and_rearms_a_lost_deadman() -> None:
    host = FakeHost0(checkin=[0, 1])  # the second check-in finds no deadman: armed again
    said: list[str] = []
    armed: list[BackstopPlan] = []
    executor = Backstopped(cast(Any, host), _plan(grace_s=0.8), status=said.append, on_armed=armed.append)
    executor.ship(object())
    assert host.shipped.is_set()
    wait_for(lambda: host.commands.count("checkin") >= 4 or None, timeout=20.0, what="four check-ins")
    executor.close()
    seen = len(host.commands)
    assert host.closed and host.commands[:4] == ["arm", "checkin", "checkin", "arm"]
    assert len(armed) == 1 and said == []  # armed: recorded (on_armed), nothing on the console
    assert len(host.commands) == seen  # closed: no more check-ins


@pytest.mark.parametrize("deadline", [None, 1.0])
def test_a_deadman_that_cannot_be_armed_is_said_and_the_attempt_goes_on(deadline: float | None) -> None:
    host = FakeHost0(arm=[2])
    said: list[str] = []
    executor = Backstopped(cast(Any, host), _plan(grace_s=0.8, deadline_at=deadline), status=said.append)
    executor.ship(object())
    wait_for(lambda: said or None, timeout=20.0, what="the warning")
    executor.close()
    assert host.commands == ["arm"] and host.shipped.is_set()
    assert said == ["warning: the run's backstop could not be armed on host 0: deadman: bad config"]


def test_an_executor_closed_while_arming_ends_the_backstop_quietly(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SSH executor cancels a command in flight when it closes: the arming thread ends, raising
    nothing (an exception there would surface as a crash of a thread of tpuctl's)."""
    crashes: list[threading.ExceptHookArgs] = []
    monkeypatch.setattr(threading, "excepthook", crashes.append)

    class ClosedWhileArming(FakeHost0):
        def run_command(self, command: str, **kw: Any) -> dict[int, CommandResult]:
            self.commands.append("arm")
            raise CancelledError

    host = ClosedWhileArming()
    said: list[str] = []
    executor = Backstopped(cast(Any, host), _plan(grace_s=0.8), status=said.append)
    executor.ship(object())
    wait_for(lambda: host.commands or None, timeout=20.0, what="the arm command")
    executor.close()
    assert executor._thread is None or not executor._thread.is_alive()
    assert crashes == [] and said == [] and host.commands == ["arm"]
