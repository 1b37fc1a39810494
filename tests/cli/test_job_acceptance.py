"""The LM example's job file, end to end: a set of two slice types, spot, ``setup``, ``run:`` a shell
command, the simulator's bucket and ``secrets: {HF_TOKEN: null}`` with HF_TOKEN set in the submitting
environment. Its plan ranks both types; with the cheaper type stocked out everywhere it lands on the
other; preempted, it recovers; the secret reaches the program (which prints only its digest), again
after the recovery, and is found nowhere else: not in the output, the state dir (the ledger, the run's
logs and saved request, the simulated bucket), the simulated hosts' disks (the bundle, the hosts' logs)
nor the argv of any process of this machine (the hosts' ``ps``) while the program runs.

The default case: two one-host types and a stdlib program (seconds). Behind ``--slow``: the real LM
example on v5e-16 (4 hosts) or v6e-8."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from recovery_helpers import (
    HOST_XLA_ENV,
    V5E_16_ARGS,
    V5E_OTHER,
    V5E_ZONE,
    WORLD,
    Chaos,
    Preempt,
    serve_for_jax_runs,
    steps_program,
)

from tpuctl.sim import SimAdminClient
from tpuctl.sim.vms.layout import VM_MARKER, vm_roots_of
from tpuctl.testing.cli import Cli, CliResult
from tpuctl.testing.exposure import host_processes, leaks, processes

V6E_ZONE = "us-east1-d"
#: The recovery tests' world (v5e in two zones) with v6e in a zone of its own.
JOB_WORLD: dict[str, Any] = {
    **WORLD,
    "zones": {**WORLD["zones"], V6E_ZONE: {"v6e": {"on_demand": 64, "preemptible": 64}}},
}
V5E_ZONES = (V5E_ZONE, V5E_OTHER)
HF_TOKEN = "hf_SENTINELJOBTOKEN4c1d9e"
HF_DIGEST = hashlib.sha256(HF_TOKEN.encode()).hexdigest()
#: The simulator's default bucket.
BUCKET = "tpuctl-sim"

#: Reports the digest of its HF_TOKEN (never the value) and the type it runs on, steps slowly enough to
#: be preempted, and stops at a preemption notice as the runtime's programs do.
PROGRAM = steps_program(
    '"on", os.environ["TPUCTL_ACCELERATOR_TYPE"], "hf_token", '
    'hashlib.sha256(os.environ.get("HF_TOKEN", "").encode()).hexdigest()',
    imports="hashlib",
)

ONE_HOST_JOB = f"""\
name: acceptance
workdir: proj
resources:
  accelerators: {{tpu-v5e-8, tpu-v6e-8}}
  use_spot: true
secrets:
  HF_TOKEN: null
setup: |
  echo "set up $(hostname)"
run: python3 report.py "$@"
bucket: {BUCKET}
runtime_deps: false
max_preemptions: 3
"""


@dataclass
class ProcessWatch:
    """While a run goes on: every process of this machine whose argv holds a value (what ``ps`` on a
    host would show), and for each attempt (TPUCTL_RESTART_COUNT) the environment of the program on
    each simulated host (its VM marker): the first process seen there with ``program`` as a word of its
    argv, of a run of ``state_dir`` (other tests on this machine may run the same program)."""

    values: tuple[str, ...]
    program: str
    state_dir: Path
    in_argv: set[str] = field(default_factory=set)
    environs: dict[str, dict[str, dict[str, str]]] = field(default_factory=dict)
    _halt: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> ProcessWatch:
        self._thread = threading.Thread(target=self._watch, name="process-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._halt.set()
        if self._thread is not None:
            self._thread.join(30)

    def _watch(self) -> None:
        while not self._halt.is_set():
            for pid, argv in processes():
                self.in_argv.update(f"{pid}: {argv!r}" for v in self.values if v.encode() in argv)
            runs = {path.name for path in (self.state_dir / "runs").glob("run-*")}
            for proc in host_processes():
                attempt = proc.environ.get("TPUCTL_RESTART_COUNT")
                ours = proc.environ.get("TPUCTL_RUN_ID") in runs
                if ours and attempt is not None and self.program in proc.argv:
                    self.environs.setdefault(attempt, {}).setdefault(proc.environ[VM_MARKER], proc.environ)
            time.sleep(0.05)  # a poll of /proc, not a wait for simulated time


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _only_run(cli: Cli) -> dict[str, Any]:
    (listed,) = cli("runs", "list", "-o", "json").json["runs"]
    run: dict[str, Any] = cli("runs", "describe", listed["run_id"], "-o", "json").json["run"]
    return run


def _check_the_plan_ranks_both_types(cli: Cli, *, first: str, second: str) -> None:
    planned = cli("run", "job.yaml", "--dry-run", "-o", "json", env={"HF_TOKEN": HF_TOKEN})
    assert planned.code == 0, planned.stderr[-4000:]
    plan = planned.json["plan"]
    assert plan["type_preference"] == "cheapest" and plan["secrets"] == {"HF_TOKEN": "<secret>"}
    create = plan["target"]["create"]
    ranked = [(c["accelerator_type"], c["zone"]) for c in create["candidates"] if c["rank"]]
    # One list, by price: the cheaper type's zones, then the other's.
    assert ranked == [(first, V5E_ZONE), (first, V5E_OTHER), (second, V6E_ZONE)], ranked
    assert HF_TOKEN not in planned.output


def _move_the_stock_then_preempt(admin: SimAdminClient) -> Callable[[str, str, bool], None]:
    """The preemption, with the cheaper type back in stock and the zone the run was in stocked out: the
    recovery (which tries the run's zone first) must go to the cheaper type."""

    def preempt(zone: str, node: str, notice: bool) -> None:
        for v5e in V5E_ZONES:
            admin.stockout(v5e, clear=True)
        admin.stockout(zone)
        admin.preempt(zone, node, notice=notice)

    return preempt


def _run_with_a_preemption(
    cli: Cli, admin: SimAdminClient, state_dir: Path, *, program: str, after_steps: int, timeout: float
) -> tuple[CliResult, ProcessWatch]:
    """``job.yaml`` run with the cheaper type stocked out everywhere, preempted once on its first
    attempt (the cheaper type back in stock), under a process watch."""
    for v5e in V5E_ZONES:
        admin.stockout(v5e)
    chaos = Chaos(admin, state_dir, [Preempt(1, after_steps)], timeout=timeout)
    chaos.preempt = _move_the_stock_then_preempt(admin)
    with ProcessWatch((HF_TOKEN,), program, state_dir) as watch:
        chaos.start()
        try:
            result = cli("run", "job.yaml", env={"HF_TOKEN": HF_TOKEN})
        finally:
            chaos.join(check=False)
    assert result.code == 0, result.output[-6000:]
    chaos.check()
    return result, watch


def _check_the_secret_is_only_in_the_program(
    result: CliResult, watch: ProcessWatch, tmp_path: Path, *, attempts: int
) -> None:
    assert watch.in_argv == set(), watch.in_argv
    for attempt in map(str, range(attempts)):
        on_hosts = watch.environs.get(attempt)
        assert on_hosts, f"the program of attempt {attempt} was never seen running: {watch.environs}"
        assert all(env.get("HF_TOKEN") == HF_TOKEN for env in on_hosts.values()), attempt
    # Every file of the test (the state dir: the ledger, the run's logs and saved request, the bucket),
    # the simulated hosts' disks (the bundle, the hosts' logs) and every captured stream.
    roots = [tmp_path, *vm_roots_of(tmp_path)]
    assert len(roots) > 1, "no simulated host's disk found"
    assert leaks((HF_TOKEN,), texts=[result.output], roots=roots) == []


def test_the_job_lands_on_the_other_type_recovers_and_keeps_its_secret_to_the_program(
    serve_sim: Callable[..., SimAdminClient],
    cli: Cli,
    state_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TPUCTL_STATE_DIR", str(state_dir))
    admin = serve_sim(JOB_WORLD)
    monkeypatch.chdir(tmp_path)
    _write(tmp_path / "job.yaml", ONE_HOST_JOB)
    _write(tmp_path / "proj" / "report.py", PROGRAM)
    _check_the_plan_ranks_both_types(cli, first="v5litepod-8", second="v6e-8")

    result, watch = _run_with_a_preemption(
        cli, admin, state_dir, program="report.py", after_steps=3, timeout=60
    )
    attempts = [line for line in result.stdout.splitlines() if line.startswith("w0 | attempt")]
    # Placed on v6e-8 (v5e stocked out); back on v5e-8, the cheaper, once it is in stock again.
    assert attempts == [
        f"w0 | attempt 0 on v6e-8 hf_token {HF_DIGEST}",
        f"w0 | attempt 1 on v5litepod-8 hf_token {HF_DIGEST}",
    ], result.output[-6000:]
    assert result.stderr.count("1 --setup command(s)… 1/1 done") == 2  # setup: on each new slice
    assert "recovered on another slice type: v6e-8 -> v5litepod-8" in result.stderr
    # The program stopped on the notice itself (its shell waited for it), not killed with its shell.
    assert "killed by SIGTERM" not in result.stderr
    run = _only_run(cli)
    assert (run["status"], run["preemptions"]) == ("succeeded", 1)
    assert run["detail"]["placed_types"] == ["v6e-8", "v5litepod-8"]
    assert {attempt: len(hosts) for attempt, hosts in watch.environs.items()} == {"0": 1, "1": 1}
    _check_the_secret_is_only_in_the_program(result, watch, tmp_path, attempts=2)


_LM_ARGS_WORDS = " ".join(V5E_16_ARGS)
_XLA_FLAGS = HOST_XLA_ENV[1].split("=", 1)[1]
#: The LM example's job file (docs/examples/lm-any-type.yaml) with the recovery tests' tiny model. Its
#: ``run:`` says the digest of HF_TOKEN (printf is the shell's own: the value is in no argv), then runs
#: the example under the shell, which must wait for it to save its checkpoint on the notice.
LM_JOB = f"""\
name: lm-any-type
resources:
  accelerators: {{tpu-v5e-16, tpu-v6e-8}}
  use_spot: true
secrets:
  HF_TOKEN: null
envs:
  XLA_FLAGS: {_XLA_FLAGS}
setup: |
  echo "setting up $(hostname)"
run: |
  echo "hf_token $(printf %s "$HF_TOKEN" | sha256sum | cut -d' ' -f1)"
  python3 -m tpuctl.runtime.examples.lm_train {_LM_ARGS_WORDS} "$@"
bucket: {BUCKET}
checkpoint_every: 4
max_preemptions: 3
"""


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_lm_job_lands_on_v6e_8_recovers_on_v5e_16_and_keeps_its_secret_to_the_program(
    serve_sim: Callable[..., SimAdminClient],
    cli: Cli,
    state_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The LM example: placed on v6e-8 (1 host; v5e stocked out), preempted, recovered on v5e-16 (4
    hosts) from the checkpoint it saved on the notice, with the same global batch."""
    admin = serve_for_jax_runs(
        serve_sim, JOB_WORLD, state_dir=state_dir, jax_cache=tmp_path / "jax-cache", monkeypatch=monkeypatch
    )
    monkeypatch.chdir(tmp_path)
    _write(tmp_path / "job.yaml", LM_JOB)
    _check_the_plan_ranks_both_types(cli, first="v5litepod-16", second="v6e-8")

    result, watch = _run_with_a_preemption(
        cli, admin, state_dir, program="tpuctl.runtime.examples.lm_train", after_steps=6, timeout=800
    )
    hashes = [line for line in result.stdout.splitlines() if " | hf_token " in line]
    assert sorted(hashes) == sorted(
        [f"w0 | hf_token {HF_DIGEST}", *(f"w{w} | hf_token {HF_DIGEST}" for w in range(4))]
    ), result.output[-6000:]
    assert "recovered on another slice type: v6e-8 -> v5litepod-16" in result.stderr
    # The example saved a checkpoint on the notice: its shell waited for it.
    assert "killed by SIGTERM" not in result.stderr
    assert "was preempted [notice, checkpoint at step" in result.stderr, result.stderr[-4000:]
    run = _only_run(cli)
    assert (run["status"], run["preemptions"], run["accelerator_type"]) == ("succeeded", 1, "v5litepod-16")
    assert (run["detail"]["hosts"], run["detail"]["placed_types"]) == (4, ["v6e-8", "v5litepod-16"])
    (preemption,) = run["recovery"]["preemptions"]
    assert preemption["restored_step"] == preemption["checkpoint_step"] is not None, preemption
    # One host's program on v6e-8, then four on v5e-16, each with the secret in its environment.
    assert {attempt: len(hosts) for attempt, hosts in watch.environs.items()} == {"0": 1, "1": 4}
    _check_the_secret_is_only_in_the_program(result, watch, tmp_path, attempts=2)
