"""Who builds the run's environment and who restores it: on a slice's first setup with an empty bucket,
every host looks, the first builds and stores it (the only one brought uv), the others restore it; a
recovery's fresh hosts only restore; without a bucket every host builds its own; a restore that fails for
another reason than a missing archive names the host and the bucket."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, cast

import pytest

from tpuctl.errors import RunFailedError
from tpuctl.hosts.base import CommandResult
from tpuctl.hosts.envstore import ENV_MISSING
from tpuctl.hosts.setup import RUN_SCRIPT_FROM_STDIN, SetupSpec
from tpuctl.hosts.uv_tool import PRESENT
from tpuctl.services.run.hostsetup import env_bucket, run_setup
from tpuctl.services.run.model import PhaseUpdate, PreparedRun, Silent

SPEC = SetupSpec(None, "zipp\n")
BUCKET = "b"


@dataclass
class Hosts:
    """Hosts that act out the setup's scripts: a disk each (whether it has the environment) and one
    bucket; every call is recorded as (what, workers)."""

    num_hosts: int
    stored: set[str] = field(default_factory=set)
    has_env: set[int] = field(default_factory=set)
    failing_restore: set[int] = field(default_factory=set)
    failing_store: bool = False
    calls: list[tuple[str, list[int]]] = field(default_factory=list)

    def run_command(
        self, command: str, *, on_line: Any, timeout_s: float, workers: Any = None, stdin: bytes = b""
    ) -> dict[int, CommandResult]:
        chosen = list(range(self.num_hosts)) if workers is None else list(workers)
        script = stdin.decode()
        if command != RUN_SCRIPT_FROM_STDIN:
            self.calls.append(("uv", chosen))  # the probe: uv is there already
            return {w: CommandResult(w, 0, (PRESENT,)) for w in chosen}
        what = (
            "restore" if " $ restore gs://" in script else "build+store" if " store " in script else "build"
        )
        self.calls.append((what, chosen))
        return {w: self._act(what, w, on_line) for w in chosen}

    def _act(self, what: str, worker: int, on_line: Any) -> CommandResult:
        if what == "restore" and worker in self.failing_restore:
            return CommandResult(worker, 1, ("[tpuctl-setup] $ restore gs://b/x", "403 Forbidden"))
        if what == "restore" and not self.stored:
            return CommandResult(worker, ENV_MISSING, ("[tpuctl-setup] not in the bucket",))
        if what == "build+store" and self.failing_store:
            step = (
                "[tpuctl-setup] $ python3 /h/.tpuctl/tools/tpuctl-gcs-0123.py store b tpuctl/envs/k/env.tar x"
            )
            return CommandResult(worker, 1, (step, "storing gs://b/... failed (403)"))
        if what == "build+store":
            self.stored.add("env")
        self.has_env.add(worker)
        line = f"[tpuctl-setup] {'restored' if what == 'restore' else 'done'}: env"
        on_line(worker, line)
        return CommandResult(worker, 0, (line,))


class Phases(Silent):
    def __init__(self) -> None:
        self.updates: list[PhaseUpdate] = []

    def phase(self, update: PhaseUpdate) -> None:
        self.updates.append(update)


class Log:
    def write(self, text: str) -> None:
        pass


def _prepared(
    spec: SetupSpec = SPEC, checkpoint_dir: str = f"gs://{BUCKET}/tpuctl/runs/r/checkpoints"
) -> PreparedRun:
    request = SimpleNamespace(ssh_remote_root=".tpuctl")
    return cast(
        PreparedRun, SimpleNamespace(setup=spec, request=request, checkpoint_dir=checkpoint_dir, run_id="r")
    )


def _setup(hosts: Hosts, prepared: PreparedRun, observer: Silent | None = None) -> None:
    logs = {w: Log() for w in range(hosts.num_hosts)}
    run_setup(
        observer or Silent(),
        cast(Any, hosts),
        prepared,
        cast(Any, logs),
        uv_wheelhouse=None,
        uv_download_dir=cast(Any, None),
    )


def test_the_first_host_builds_and_stores_the_others_restore() -> None:
    hosts = Hosts(4)
    phases = Phases()
    _setup(hosts, _prepared(), phases)
    assert hosts.calls == [
        ("restore", [0, 1, 2, 3]),
        ("uv", [0]),
        ("build+store", [0]),
        ("restore", [1, 2, 3]),
    ]
    assert hosts.has_env == {0, 1, 2, 3}
    assert [(u.done, u.total) for u in phases.updates] == [(0, 4), (1, 4), (2, 4), (3, 4), (4, 4), (4, 4)]
    assert phases.updates[-1].ended


def test_setup_commands_run_again_on_restoring_hosts_which_are_brought_uv_for_them() -> None:
    hosts = Hosts(2)
    _setup(hosts, _prepared(SetupSpec(None, "zipp\n", ("uv pip install wandb",))))
    assert hosts.calls == [("uv", [0, 1]), ("restore", [0, 1]), ("build+store", [0]), ("restore", [1])]


def test_a_recoverys_fresh_hosts_only_restore() -> None:
    hosts = Hosts(4, stored={"env"})
    _setup(hosts, _prepared())
    assert hosts.calls == [("restore", [0, 1, 2, 3])]
    assert hosts.has_env == {0, 1, 2, 3}


def test_without_a_bucket_every_host_builds_its_own() -> None:
    hosts = Hosts(2)
    _setup(hosts, _prepared(checkpoint_dir=""))
    assert hosts.calls == [("uv", [0, 1]), ("build", [0, 1])]
    assert hosts.stored == set()


def test_a_restore_that_fails_otherwise_names_the_host_and_the_bucket() -> None:
    hosts = Hosts(4, stored={"env"}, failing_restore={2})
    with pytest.raises(RunFailedError) as failed:
        _setup(hosts, _prepared())
    assert "setup failed on host 2 (exit 1) running: restore gs://b/x" in str(failed.value)
    assert f"can read gs://{BUCKET}" in (failed.value.fix or "")


def test_a_builder_that_cannot_store_is_told_about_the_bucket_not_its_requirements() -> None:
    hosts = Hosts(2, failing_store=True)
    with pytest.raises(RunFailedError) as failed:
        _setup(hosts, _prepared())
    assert "setup failed on host 0 (exit 1)" in str(failed.value)
    assert (failed.value.fix or "").startswith(f"let the hosts' service account write gs://{BUCKET}")


def test_env_bucket_is_the_checkpoint_bucket() -> None:
    assert env_bucket(_prepared()) == BUCKET
    assert env_bucket(_prepared(checkpoint_dir="")) is None
