"""Simulated multi-host slices: local processes joined by jax.distributed over loopback.

Each host gets exactly the environment of ``sim_host_env`` (as the launcher sets it) and runs a program
that does not import tpuctl itself where that matters: the sitecustomize hook must do the rest.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

LM = ["-m", "tpuctl.runtime.examples.lm_train"]
# Short, but long enough that the loss falls clearly and checkpoints land mid-run.
# A one-layer model: compile time is most of a run on a small CPU, and depth adds nothing here.
LM_ARGS = [
    "--steps",
    "16",
    "--checkpoint-every",
    "4",
    "--log-every",
    "1",
    "--batch",
    "16",
    "--seed",
    "5",
    "--model-parallel",
    "2",
    "--param-sharding",
    "fsdp",
    "--layers",
    "1",
    "--d-model",
    "32",
    "--heads",
    "2",
    "--vocab",
    "64",
    "--seq-len",
    "32",
]
HASH = re.compile(r"^final_params_sha256 ([0-9a-f]{64})$", re.M)
STEP = re.compile(r"^step (\d+) loss ([0-9.]+)", re.M)
HOST_TIMEOUT = 150


@pytest.mark.parametrize("hosts", [2, 4])
def test_unmodified_script_sees_the_whole_slice(
    hosts: int, start_hosts: Callable[..., Any], scripts_dir: Path, tmp_path: Path
) -> None:
    chips = 2
    results = start_hosts(tmp_path, hosts, chips, [str(scripts_dir / "psum_user.py")]).wait(HOST_TIMEOUT)
    n = hosts * chips
    seen = set()
    for proc in results:
        assert proc.returncode == 0, proc.describe()
        line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
        _, pid, pcount, dcount, local, total = line.split()
        seen.add(int(pid))
        assert (int(pcount), int(dcount), int(local)) == (hosts, n, chips)
        assert float(total) == n * (n + 1) / 2  # every device's k + 1, summed across all hosts
    assert seen == set(range(hosts))


# ~50 s on a loaded CI machine: two slices joining one job stay in the default suite end to end
# (tests/cli/test_multislice_run.py's unmodified psum over both slices).
@pytest.mark.slow
def test_two_slices_of_two_hosts_train_as_one_job(
    start_hosts: Callable[..., Any], scripts_dir: Path, tmp_path: Path
) -> None:
    """4 hosts x 2 chips as 2 slices (TPUCTL_NUM_SLICES=2, hosts 0-1 slice 0, 2-3 slice 1), as the
    launcher numbers them: make_mesh puts each slice in its own dcn row, the bundled step trains, every
    host agrees, and the numbers match the same devices used as one slice."""
    hosts, per_slice = 4, 2
    results = start_hosts(
        tmp_path,
        hosts,
        2,
        [str(scripts_dir / "multislice_train.py")],
        env={"TPUCTL_NUM_SLICES": "2"},
        worker_env=lambda w: {"TPUCTL_SLICE_ID": str(w // per_slice)},
    ).wait(HOST_TIMEOUT)
    reports = []
    for proc in results:
        assert proc.returncode == 0, proc.describe()
        line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
        reports.append(json.loads(line.removeprefix("RESULT ")))
    assert [r["process"] for r in reports] == [0, 1, 2, 3]
    for r in reports:
        assert r["mesh"] == {"dcn": 2, "data": 2, "model": 2}
        assert r["rows"] == [r["slice_id"]] == [r["process"] // per_slice]
        assert all("dcn" not in s for s in r["slices"]["specs"]), r["slices"]["specs"]
    first = reports[0]["slices"]
    losses = first["losses"]
    assert losses[-1] < 0.7 * losses[0], losses
    # Every host got the same replicated loss and ends with the same params, bit for bit.
    assert all(r["slices"] == first for r in reports)
    # Two slices train as one slice of the same devices, up to the order of the float sums.
    one = reports[0]["one_slice"]
    assert all(r["one_slice"] == one for r in reports)
    assert losses == pytest.approx(one["losses"], rel=1e-5)


@pytest.mark.slow  # ~9 s; the bundled step's two-slice case above stays in the default suite
def test_example_runs_on_two_slices_with_no_flag_of_its_own(
    start_hosts: Callable[..., Any], tmp_path: Path
) -> None:
    """The LM example, unchanged arguments, on 2 slices of 2 hosts x 2 chips: the slices come from the
    environment and its start-up line says so."""
    results = start_hosts(
        tmp_path,
        4,
        2,
        [*LM, *LM_ARGS, "--checkpoint-every", "0"],
        env={"TPUCTL_NUM_SLICES": "2"},
        worker_env=lambda w: {"TPUCTL_SLICE_ID": str(w // 2)},
    ).wait(HOST_TIMEOUT)
    _hash(results)
    for w, proc in enumerate(results):
        assert f"process {w}/4 devices 2/8" in proc.stdout
    assert "\nmesh dcn=2 data=2 model=2\n" in results[0].stdout, results[0].describe()
    steps = [(int(s), float(loss)) for s, loss in STEP.findall(results[0].stdout)]
    assert [s for s, _ in steps] == list(range(1, 17))
    assert steps[-1][1] < 0.7 * steps[0][1], steps


def _lm(start_hosts: Callable[..., Any], workdir: Path, ckpt: Path, *extra: str) -> list[Any]:
    return list(start_hosts(workdir, 2, 2, [*LM, *LM_ARGS, *extra], checkpoint_dir=ckpt).wait(HOST_TIMEOUT))


def _hash(results: list[Any]) -> str:
    for proc in results:
        assert proc.returncode == 0, proc.describe()
    m = HASH.search(results[0].stdout)
    assert m, results[0].describe()
    return m.group(1)


@pytest.fixture(scope="module")
def reference(
    tmp_path_factory: pytest.TempPathFactory,
    start_hosts: Callable[..., Any],
    procs_once_per_run: Callable[[str, Callable[[], Sequence[Any]]], list[Any]],
) -> list[Any]:
    """One uninterrupted 2-host x 2-chip run of the example (once per test run, whichever worker asks);
    the other tests compare against it."""

    def run() -> list[Any]:
        work = tmp_path_factory.mktemp("lm-reference")
        return _lm(start_hosts, work, work / "ckpt")

    return procs_once_per_run("lm-reference", run)


def test_example_trains_on_two_hosts(reference: list[Any]) -> None:
    digest = _hash(reference)
    assert len(digest) == 64
    for w, proc in enumerate(reference):
        assert f"process {w}/2 devices 2/4" in proc.stdout
    steps = [(int(s), float(loss)) for s, loss in STEP.findall(reference[0].stdout)]
    assert [s for s, _ in steps] == list(range(1, 17))
    assert steps[-1][1] < 0.7 * steps[0][1], steps
    assert not STEP.search(reference[1].stdout), "only process 0 logs steps"


@pytest.mark.slow  # ~15 s; a crashed run resumed bit for bit equal to the reference (below) shows it too
def test_same_seed_same_hash(reference: list[Any], start_hosts: Callable[..., Any], tmp_path: Path) -> None:
    again = _lm(start_hosts, tmp_path, tmp_path / "ckpt")
    assert _hash(again) == _hash(reference)


@pytest.fixture(scope="module")
def crashed(
    tmp_path_factory: pytest.TempPathFactory,
    start_hosts: Callable[..., Any],
    once_per_run: Callable[[str, Callable[[], Any]], Any],
) -> Path:
    """Checkpoints of a run that died hard right after step 8 (checkpoints at 4 and 8, no final one):
    made once per test run, whichever worker asks; the tests copy them before use."""

    def crash() -> str:
        work = tmp_path_factory.mktemp("lm-crashed")
        procs = _lm(start_hosts, work, work / "ckpt", "--crash-after-step", "8")
        # Host 1 exits 3 too, unless it sees the coordinator (host 0) go first: then JAX's coordination
        # client aborts it (SIGABRT), or its next collective raises (the coordination service's socket
        # closed: the runtime's crash hook exits 1). Either way the run died hard right after step 8.
        assert procs[0].returncode == 3, procs[0].describe()
        lost_coordinator = procs[1].returncode == 1 and "coordination service" in procs[1].stderr
        assert procs[1].returncode in (3, -6) or lost_coordinator, procs[1].describe()
        assert not HASH.search(procs[0].stdout)
        assert sorted(p.name for p in (work / "ckpt").iterdir() if p.name.isdigit()) == ["4", "8"]
        return str(work / "ckpt")

    return Path(once_per_run("lm-crashed", crash))


def test_crash_and_resume_is_bit_identical(
    reference: list[Any], crashed: Path, start_hosts: Callable[..., Any], tmp_path: Path
) -> None:
    ckpt = tmp_path / "ckpt"
    shutil.copytree(crashed, ckpt)
    resumed = _lm(start_hosts, tmp_path, ckpt)
    assert "restored step 8 from" in resumed[0].stdout, resumed[0].describe()
    assert [int(s) for s, _ in STEP.findall(resumed[0].stdout)] == list(range(9, 17))
    assert _hash(resumed) == _hash(reference)


def test_corrupt_latest_checkpoint_falls_back_on_every_host(
    reference: list[Any], crashed: Path, start_hosts: Callable[..., Any], tmp_path: Path
) -> None:
    """Step 8 damaged (a data file cut in half): all hosts agree to resume from 4, and the end result
    is still bit-identical, just with more steps redone."""
    ckpt = tmp_path / "ckpt"
    shutil.copytree(crashed, ckpt)
    data = [p for p in (ckpt / "8").rglob("*") if p.is_file() and p.parent.name == "d"]
    victim = max(data, key=lambda p: p.stat().st_size)
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    resumed = _lm(start_hosts, tmp_path, ckpt)
    for proc in resumed:
        assert "checkpoint step 8 unreadable (" in proc.stderr, proc.describe()
        assert "); falling back to step 4" in proc.stderr
    assert "restored step 4 from" in resumed[0].stdout, resumed[0].describe()
    assert [int(s) for s, _ in STEP.findall(resumed[0].stdout)] == list(range(5, 17))
    assert _hash(resumed) == _hash(reference)


@pytest.mark.slow
def test_sigkill_mid_run_and_resume_is_bit_identical(
    reference: list[Any], start_hosts: Callable[..., Any], tmp_path: Path
) -> None:
    """A preemption-like kill: every host SIGKILLed as soon as the first checkpoint is committed.

    Where exactly the kill lands is up to the scheduler; the final hash must not depend on it. (Slow:
    two more runs; ``test_crash_and_resume_is_bit_identical`` covers the same guarantee deterministically.)
    """
    ckpt = tmp_path / "ckpt"
    hosts = start_hosts(tmp_path / "a", 2, 2, [*LM, *LM_ARGS], checkpoint_dir=ckpt)
    deadline = time.monotonic() + HOST_TIMEOUT
    try:
        while time.monotonic() < deadline and not (ckpt / "4").is_dir():
            if any(p.poll() is not None for p in hosts.procs):
                break
            time.sleep(0.01)
    finally:
        hosts.kill()
    killed_mid_run = not HASH.search(hosts.read(0)[0])
    resumed = _lm(start_hosts, tmp_path / "b", ckpt)
    assert _hash(resumed) == _hash(reference)
    if killed_mid_run:
        m = re.search(r"^restored step (\d+) from", resumed[0].stdout, re.M)
        assert m and int(m.group(1)) in (4, 8, 12), resumed[0].describe()
