"""Hosts with no route to the package index: a run's environment, built once by a host that had one and
kept in the bucket, sets up the hosts of a later run with the same inputs, and of its recovery after a
preemption, from the bucket alone; the package mirror's log shows each wheel fetched at most once."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from recovery_helpers import V5E_ZONE, WORLD, Chaos, Preempt, steps_program

from tpuctl.hosts.envstore import env_record
from tpuctl.hosts.setup import SetupSpec
from tpuctl.sim import SimAdminClient
from tpuctl.sim.network import mirror_fetch_log, mirror_fetches
from tpuctl.sim.storage import storage_dir_for, stored_objects
from tpuctl.testing.cli import Cli, CliResult

# These runs watch their environment built from the index and stored: the bucket starts without one.
pytestmark = pytest.mark.fresh_bucket

#: A program whose one dependency (zipp) only the environment has, stopping at the notice as the
#: runtime's programs do.
PROGRAM = steps_program('"with", zipp.__name__, "from", sys.prefix', imports="zipp")
REQUIREMENTS = "zipp\n"


def _run_args(work: Path, accelerator: str) -> tuple[str, ...]:
    """``tpuctl run``'s arguments for PROGRAM on ``accelerator``, its environment only REQUIREMENTS."""
    work.mkdir()
    (work / "steps.py").write_text(PROGRAM)
    (work / "requirements.txt").write_text(REQUIREMENTS)
    return (str(work / "steps.py"), "--type", accelerator, "--zone", V5E_ZONE, "--no-runtime-deps",
            "--requirements", str(work / "requirements.txt"))  # fmt: skip


def _preempted_once_without_a_route(
    admin: SimAdminClient, cli: Cli, state_dir: Path, args: tuple[str, ...]
) -> CliResult:
    """The hosts lose their route to the index; then a spot run of ``args``, preempted once with notice,
    must finish."""
    admin.reset({**WORLD, "hosts_reach_package_index": False})
    chaos = Chaos(admin, state_dir, [Preempt(1, 3, notice=True)]).start()
    try:
        result = cli("run", *args, "--spot")
    finally:
        chaos.join(check=False)
    assert result.code == 0, result.output[-4000:]
    chaos.check()
    return result


def test_a_spot_run_with_no_route_to_the_index_recovers_from_the_bucket(
    serve_sim: Callable[..., SimAdminClient], cli: Cli, state_dir: Path, tmp_path: Path
) -> None:
    admin = serve_sim(WORLD)
    args = _run_args(tmp_path / "proj", "v5e-8")
    storage = storage_dir_for(state_dir)
    log = mirror_fetch_log(storage)

    # An earlier run, whose hosts reach the index: its host 0 builds the environment and stores it.
    first = cli("run", *args)
    assert first.code == 0, first.output[-4000:]
    key = SetupSpec(None, REQUIREMENTS).key()
    assert env_record(key) in stored_objects(storage, prefix="tpuctl/envs/")
    built = mirror_fetches(log)
    assert built and all(f.served for f in built)

    # Now the hosts have no route to it: a spot run, preempted once, sets up both slices from the bucket.
    result = _preempted_once_without_a_route(admin, cli, state_dir, args)
    worker_lines = [line for line in result.stdout.splitlines() if line.startswith("w0 | ")]
    assert [line.split(" with ")[0] for line in worker_lines] == [
        "w0 | attempt 0",
        "w0 | attempt 1",
        "w0 | done",
    ]
    assert all(f"/envs/{key}" in line for line in worker_lines[:2]), worker_lines

    fetches = mirror_fetches(log)
    assert fetches[len(built) :] == []  # no host of the second run asked the index at all
    per_wheel = Counter(f.file for f in fetches if f.byte_range is None)
    assert per_wheel and max(per_wheel.values()) == 1, per_wheel


@pytest.mark.slow
def test_a_4_host_spot_run_with_no_route_to_the_index_recovers_from_the_bucket(
    serve_sim: Callable[..., SimAdminClient], cli: Cli, state_dir: Path, tmp_path: Path
) -> None:
    """The same on v5e-16 (4 hosts): host 0 builds, the 3 others restore, and so do the 4 of the
    recovery, with one fetch per wheel in all."""
    admin = serve_sim(WORLD)
    args = _run_args(tmp_path / "proj", "v5e-16")
    log = mirror_fetch_log(storage_dir_for(state_dir))
    first = cli("run", *args, "-v")
    assert first.code == 0, first.output[-4000:]
    assert sum("[tpuctl-setup] restored: " in line for line in first.stdout.splitlines()) == 3
    built = mirror_fetches(log)
    _preempted_once_without_a_route(admin, cli, state_dir, args)
    assert mirror_fetches(log)[len(built) :] == []
    per_wheel = Counter(f.file for f in built if f.byte_range is None)
    assert per_wheel and max(per_wheel.values()) == 1, per_wheel
