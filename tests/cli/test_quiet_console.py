"""A run preempted once, as its console shows it without -v: one line per phase per slice, no setup
commands, no library plumbing (tensorstore looking for credentials, JAX's SIGTERM, Gloo), the whole of it
in a screenful. The one-host case is a stdlib program (a few seconds); the 4-host LM run is --slow."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from recovery_helpers import (
    HOST_XLA_ENV,
    LM_ARGS,
    V5E_ZONE,
    WORLD,
    Chaos,
    Preempt,
    serve_for_jax_runs,
    steps_program,
)

from tpuctl.cli.run_console import QUIET_LIMIT_S
from tpuctl.sim import SimAdminClient
from tpuctl.testing.cli import Cli, CliResult

#: How a line that only says a wait goes on begins (``tpuctl.cli.run_console``).
STILL = "tpuctl: still "
#: Plumbing that must never reach the console (it stays in the host logs).
PLUMBING = ("google_auth_provider", "application-default login", "[Gloo]", "SIGTERM caught", "[tpuctl-setup]")

#: A program with no dependencies that stops at the notice, as the runtime's programs do.
STEPPER = steps_program()


@pytest.fixture
def admin(
    serve_sim: Callable[..., SimAdminClient], state_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> SimAdminClient:
    return serve_for_jax_runs(
        serve_sim, WORLD, state_dir=state_dir, jax_cache=tmp_path / "jax-cache", monkeypatch=monkeypatch
    )


def console_lines(result: CliResult) -> list[str]:
    """What the user saw, less the lines that only say a wait goes on: every non-empty line of both
    streams but tpuctl's "still …" lines (a terminal shows those on its status line, not as lines; piped,
    ``check_quiet`` bounds their number)."""
    lines = (result.stdout + result.stderr).splitlines()
    return [line for line in lines if line.strip() and not line.startswith(STILL)]


def preempted_once(admin: SimAdminClient, state_dir: Path, cli: Cli, *args: str) -> CliResult:
    chaos = Chaos(admin, state_dir, [Preempt(1, 3, notice=True)]).start()
    try:
        result = cli("run", *args)
    finally:
        chaos.join(check=False)
    assert result.code == 0, result.output[-4000:]
    chaos.check()
    return result


def check_quiet(result: CliResult, *, hosts: int) -> list[str]:
    lines = console_lines(result)
    told = [line for line in lines if line.startswith("tpuctl: ")]
    # Piped, a wait says it goes on: a line per QUIET_LIMIT_S of silence at most, never more often.
    still = [line for line in result.stderr.splitlines() if line.startswith(STILL)]
    assert len(still) <= result.seconds / QUIET_LIMIT_S, still
    # Each attempt: its slice made, its hosts set up, one line each, with the count of hosts.
    creating = [line for line in told if line.startswith("tpuctl: creating ")]
    assert len(creating) == 2 and all("… READY in " in line for line in creating), told
    setting_up = [line for line in told if line.startswith(f"tpuctl: setting up {hosts} host")]
    assert len(setting_up) == 2 and all(f"… {hosts}/{hosts} done in " in line for line in setting_up), told
    for detail in ("shipping bundle", "bundle on", "started ", "deleting "):  # -v only
        assert not any(line.startswith(f"tpuctl: {detail}") for line in told), told
    for plumbing in PLUMBING:
        leaked = [line for line in lines if plumbing in line]
        assert not leaked, (plumbing, leaked)
    return lines


def test_a_one_host_run_preempted_once_says_each_phase_once(
    admin: SimAdminClient, cli: Cli, state_dir: Path, tmp_path: Path
) -> None:
    script = tmp_path / "proj" / "stepper.py"
    script.parent.mkdir()
    script.write_text(STEPPER)
    result = preempted_once(admin, state_dir, cli, str(script), "--type", "v5e-8", "--spot", "--zone",
                            V5E_ZONE, "--no-runtime-deps", "--setup", "echo set up")  # fmt: skip
    lines = check_quiet(result, hosts=1)
    assert [line for line in lines if line.startswith("w0 | ")] == ["w0 | attempt 0", "w0 | attempt 1",
                                                                     "w0 | done"]  # fmt: skip
    assert len(lines) <= 14, "\n".join(lines)
    # -v brings the details back: the setup's own lines (the command's output too), and tpuctl's steps.
    verbose = cli("run", str(script), "--type", "v5e-8", "--zone", V5E_ZONE, "--no-runtime-deps", "--setup",
                  "echo set up", "-v")  # fmt: skip
    assert verbose.code == 0, verbose.output[-3000:]
    assert "w0 | [tpuctl-setup] $ echo set up" in verbose.stdout and "w0 | set up" in verbose.stdout
    for detail in ("shipping bundle", "started ", "deleting "):
        assert f"tpuctl: {detail}" in verbose.stderr, verbose.stderr


@pytest.mark.slow
def test_a_v5e_16_lm_run_preempted_once_fits_a_screen(
    admin: SimAdminClient, cli: Cli, state_dir: Path
) -> None:
    # The LM of the recovery tests on 16 devices, saying only its first and last step of each start.
    args = [*LM_ARGS[: LM_ARGS.index("--batch") + 1], "16", *LM_ARGS[LM_ARGS.index("--batch") + 2 :]]
    args[args.index("--log-every") + 1] = "1000"
    result = preempted_once(admin, state_dir, cli, "--example", "lm", "--type", "v5e-16", "--spot", "--zone",
                            V5E_ZONE, "--checkpoint-every", "4", *HOST_XLA_ENV, "--", *args)  # fmt: skip
    # The program checkpointed to the bucket through tensorstore, which found the VM's credentials as
    # on Google (its log says which account), instead of asking for `gcloud auth application-default
    # login` on every host.
    run_dir = next((state_dir / "runs").glob("run-*"))
    logs = [(run_dir / f"worker-{w}.log").read_text() for w in range(4)]
    assert all("Running on GCE, using service account" in log for log in logs)
    assert not any("application-default login" in log for log in logs)
    lines = check_quiet(result, hosts=4)
    assert len(lines) <= 25, "\n".join(lines)
