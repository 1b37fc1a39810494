"""Reading runs back: a run named by a unique start or end of its id or `latest` (the default of `runs
describe` and `runs logs`), an ambiguous one refused listing the matches; `runs describe` says why the run
failed, each host's exit status and sparklines of the reported step times and losses, with ISO times in
its JSON; `runs logs` marks each attempt, shows arrival times with --timestamps, and leaves the
simulator's Gloo lines out of the console (they stay in the files)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tpuctl.sim import SimAdminClient
from tpuctl.testing.cli import Cli, CliResult

WORLD: dict[str, Any] = {
    "speed": 1000,
    "zones": {"us-central2-b": {"v4": {"on_demand": 256, "preemptible": 256}}},
    "quotas": {
        "default": {"on_demand": {"zone": -1, "region": -1}, "preemptible": {"zone": -1, "region": -1}}
    },
    "latency": {"base_ms": 0, "jitter_ms": 0},
}
GLOO = "[Gloo] Rank 0 is connected to 1 peer ranks. Expected number of connected peer ranks is : 1"
# Host 0 reports three steps (times and losses) and succeeds; host 1 fails with status 3 when told to.
PROGRAM = f"""
import json, os, sys, time
worker = int(os.environ["TPUCTL_WORKER_ID"])
print({GLOO!r}, flush=True)
if worker == 0:
    for step, dt, loss in ((1, 0.5, 4.0), (2, 0.25, 3.0), (3, 0.25, 2.0)):
        event = {{"event": "step", "step": step, "dt": dt, "loss": loss}}
        print("TPUCTL_EVENT " + json.dumps(event), flush=True)
print("hello from", worker, flush=True)
if worker == 1 and os.environ.get("FAIL"):
    time.sleep(1)  # host 0 has ended by then, with status 0
    sys.exit(3)
"""


@pytest.fixture
def admin(serve_sim: Callable[..., SimAdminClient]) -> SimAdminClient:
    return serve_sim(WORLD)


def _run_id(result: CliResult) -> str:
    match = re.search(r"run (run-[0-9a-z-]+) (succeeded|failed)", result.stdout + result.stderr)
    assert match, result.stdout + result.stderr
    return match.group(1)


@pytest.fixture
def runs(tmp_path: Path, admin: SimAdminClient, cli: Cli) -> tuple[str, str]:
    """Two runs on a 2-host slice: one that succeeds, then one whose host 1 fails (the latest). The program
    is stdlib-only: nothing to install on the hosts (the runtime's setup is other tests')."""
    script = tmp_path / "proj" / "prog.py"
    script.parent.mkdir()
    script.write_text(PROGRAM)
    assert cli("pod", "create", "v4-16", "--zone", "us-central2-b", "--name", "p2").code == 0
    ok = cli("run", str(script), "--pod", "p2", "--no-runtime-deps")
    assert ok.code == 0, ok.stderr
    failed = cli("run", str(script), "--pod", "p2", "--no-runtime-deps", "--env", "FAIL=1", "--grace", "1")
    assert failed.code == 8, failed.stderr
    # The console never showed the simulator's noise; the log files keep it.
    assert "[Gloo]" not in ok.stdout + ok.stderr and "hello from 0" in ok.stdout
    return _run_id(ok), _run_id(failed)


# One test reads the two runs three ways: the runs take seconds to make, and the readings a second.
def test_two_runs_are_named_described_and_logged(cli: Cli, runs: tuple[str, str], state_dir: Path) -> None:
    check_naming(cli, runs)
    check_describe(cli, runs)
    check_logs(cli, runs, state_dir)


def check_naming(cli: Cli, runs: tuple[str, str]) -> None:
    """A run is named by a unique start or end of its id, by its whole id, or `latest` (the default)."""
    ok, failed = runs
    assert cli("runs", "describe", "latest", "-o", "json").json["run"]["run_id"] == failed
    assert cli("runs", "describe", "-o", "json").json["run"]["run_id"] == failed
    assert cli("runs", "describe", ok[-4:], "-o", "json").json["run"]["run_id"] == ok
    assert cli("runs", "describe", ok, "-o", "json").json["run"]["run_id"] == ok
    # The list says how often each run was preempted and restarted.
    header, *rows = cli("runs", "list").stdout.splitlines()
    assert header.split()[9:11] == ["PREEMPTIONS", "RESTARTS"], header
    assert [row.split()[0] for row in rows] == [failed, ok] and rows[1].split()[9:11] == ["0", "0"]

    ambiguous = cli("runs", "describe", "run-")
    assert ambiguous.code == 2
    assert f"'run-' matches 2 runs: {failed}, {ok}" in ambiguous.stderr
    unknown = cli("runs", "logs", "nope")
    assert unknown.code == 11 and "no run 'nope'" in unknown.stderr  # not found, as for a slice
    assert cli("runs", "cancel", ok[-4:]).code == 0  # a finished run: nothing to cancel, but it is found


def check_describe(cli: Cli, runs: tuple[str, str]) -> None:
    """`runs describe` says why each host ended and draws the steps."""
    ok, failed = runs
    table = cli("runs", "describe")
    assert table.code == 0, table.stderr
    assert re.search(rf"reason\s+run {failed} failed: host 1 exited with status 3", table.stdout)
    assert re.search(r"host exits\s+w0 0, w1 3 \(failed first\)\s*$", table.stdout, re.M), table.stdout
    assert re.search(r"step time\s+█▁▁  0\.5 s \.\. 0\.25 s", table.stdout), table.stdout
    assert re.search(r"loss\s+█▅▁  4 \.\. 2", table.stdout), table.stdout

    doc = cli("runs", "describe", ok, "-o", "json").json["run"]
    assert doc["reason"] is None and doc["series"] == {
        "step_time_s": [0.5, 0.25, 0.25],
        "loss": [4.0, 3.0, 2.0],
    }
    assert [h["exit_code"] for h in doc["host_exits"]] == [0, 0]
    iso = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
    assert all(iso.match(s["start"]) and iso.match(s["end"]) for s in doc["segments"])
    assert cli("runs", "describe", ok, "-o", "csv").code == 2  # one object: no CSV


def check_logs(cli: Cli, runs: tuple[str, str], state_dir: Path) -> None:
    """`runs logs` marks attempts, shows times and events in words, and hides Gloo's lines."""
    ok, _ = runs
    logs = cli("runs", "logs", ok[-4:])
    assert logs.code == 0, logs.stderr
    lines = logs.stdout.splitlines()
    assert re.match(r"w0 \| === tpuctl: attempt 1 on p2 \(us-central2-b\), \S+Z ===$", lines[0])
    assert "w1 | hello from 1" in lines and "[Gloo]" not in logs.stdout
    assert GLOO in (state_dir / "runs" / ok / "worker-0.log").read_text()
    assert GLOO in cli("runs", "logs", ok, "--all").stdout
    # The runtime's events read as words; --raw shows them as the program printed them.
    worded = cli("runs", "logs", ok, "--worker", "0").stdout.splitlines()
    assert "[tpuctl] step 2 took 0.250 s, loss 3.0" in worded and "TPUCTL_EVENT" not in "".join(worded)
    raw = cli("runs", "logs", ok, "--worker", "0", "--raw").stdout.splitlines()
    assert 'TPUCTL_EVENT {"event": "step", "step": 2, "dt": 0.25, "loss": 3.0}' in raw

    timed = cli("runs", "logs", ok, "--worker", "1", "--timestamps").stdout.splitlines()
    assert all(re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ", line) for line in timed)
    assert timed[-1].endswith(" hello from 1")
    followed = cli("runs", "logs", "--follow", "--worker", "0")  # the latest run has ended: returns
    assert followed.code == 0 and followed.stdout.splitlines()[-1] == "hello from 0"
