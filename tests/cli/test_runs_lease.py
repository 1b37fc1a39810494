"""Runs as leased records, end to end: two "machines" (two state dirs) over one simulated cloud (one served
simulator, ``TPUCTL_SIM_URL``) and one ledger (``TPUCTL_DATABASE_URL``), with short leases.

Supervisor A (a `tpuctl run` process from state dir 1) runs a program; `runs resume` B from state dir 2
is refused while A's lease lives (exit 9, naming A) and sends the cloud nothing; after `kill -9` A, B takes
the run over only once A's lease expired, and finishes it, one slice created per attempt; `runs logs`
from state dir 2 shows every line once. A supervisor whose lease is stolen (its token rewritten in the
ledger) sends no mutating request and writes nothing after its next renewal, and exits 9; `runs cancel`
from state dir 2 then cleans up after it. A run on the user's own slice (made by `pod create` with state dir
1's key) is taken over from state dir 2 with the run's key from the ledger, state dir 2 making none.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tpuctl.hosts.ssh import ensure_key_pair
from tpuctl.services.run.runkey import SECRET_NAME
from tpuctl.sim import SimAdminClient
from tpuctl.store.ledger import Ledger
from tpuctl.store.records import LeaseAction, RunStatus
from tpuctl.store.secrets import generate_key
from tpuctl.testing.cli import Cli, CliResult
from tpuctl.testing.clock import wait_for

ZONE = "us-central1-a"
WORLD: dict[str, Any] = {
    "speed": 1000,
    "zones": {ZONE: {"v5e": {"on_demand": 64, "preemptible": 64}}},
    "quotas": {
        "default": {"on_demand": {"zone": -1, "region": -1}, "preemptible": {"zone": -1, "region": -1}}
    },
    "latency": {"base_ms": 0, "jitter_ms": 0},
}
LINES = 24
#: Each attempt prints numbered lines: the first a quarter second apart (long enough to be caught
#: running), a takeover's quickly (it is only waited for).
PROGRAM = f"""
import os, time
attempt = os.environ.get("TPUCTL_RESTART_COUNT", "0")
for i in range({LINES}):
    print(f"attempt {{attempt}} line {{i}}", flush=True)
    time.sleep(0.25 if attempt == "0" else 0.02)
"""
LEASE_ENV = {"TPUCTL_LEASE_DURATION": "3", "TPUCTL_LEASE_RENEW_EVERY": "1"}


@dataclass
class Team:
    """Two machines' state dirs over one ledger and one simulated cloud."""

    one: Path
    two: Path
    db: Path
    env: dict[str, str]
    admin: SimAdminClient
    script: Path

    def on(self, state_dir: Path) -> dict[str, str | None]:
        return {**self.env, "TPUCTL_STATE_DIR": str(state_dir)}

    def ledger(self) -> Ledger:
        return Ledger(self.db)

    def start_run(self, *where: str) -> subprocess.Popen[bytes]:
        """`tpuctl run` as its own process on machine one (so it can be killed -9), on a new slice or
        ``where`` (e.g. ``--pod NAME``). The program is stdlib-only: no host installs anything, in either
        supervisor's attempt (the runtime's setup is other tests')."""
        env = {**os.environ, **self.env, "TPUCTL_STATE_DIR": str(self.one)}
        where = where or ("--type", "v5e-8", "--zone", ZONE)
        argv = [sys.executable, "-m", "tpuctl", "run", str(self.script), *where, "--no-runtime-deps"]
        return subprocess.Popen(
            argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
        )

    def mutations(self, *, method: str | None = None, suffix: str = "") -> list[dict[str, Any]]:
        return [
            m
            for m in self.admin.mutations()
            if (method is None or m["method"] == method) and m["path"].endswith(suffix)
        ]


@pytest.fixture
def team(tmp_path: Path, serve_sim: Callable[..., SimAdminClient]) -> Team:
    admin = serve_sim(WORLD)  # points TPUCTL_SIM_URL at it
    db = tmp_path / "shared" / "team.db"
    env = {
        "TPUCTL_SIM_URL": os.environ["TPUCTL_SIM_URL"],
        "TPUCTL_DATABASE_URL": f"sqlite:///{db}",
        "TPUCTL_SECRET_KEY": generate_key().decode("ascii"),
        **LEASE_ENV,
    }
    script = tmp_path / "proj" / "prog.py"
    script.parent.mkdir()
    script.write_text(PROGRAM)
    return Team(tmp_path / "one", tmp_path / "two", db, env, admin, script)


def running_run(team: Team, proc: subprocess.Popen[bytes], lines: int = 3) -> str:
    """The run ``proc`` supervises, once it holds the lease and host 0 printed ``lines`` lines."""

    def started() -> str | None:
        assert proc.poll() is None, (proc.stdout.read() if proc.stdout else b"").decode()[-3000:]
        with team.ledger() as ledger:
            for record in ledger.list_runs():
                held = ledger.lease_of(record.run_id)
                ours = held is not None and held.owner.pid == proc.pid
                if ours and len(ledger.log_lines(record.run_id, worker=0)) >= lines:
                    return record.run_id
        return None

    found = wait_for(started, timeout=120.0, interval=0.2, what="the run to be leased and printing")
    assert found is not None
    return found


def kill_9(proc: subprocess.Popen[bytes]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


def resume_once_the_lease_expired(cli: Cli, team: Team, run_id: str) -> CliResult:
    """`runs resume` from state dir two, again while the killed owner's lease is live (exit 9), bounded."""

    def resumed() -> CliResult | None:
        result = cli("runs", "resume", run_id, env=team.on(team.two))
        return None if result.code == 9 else result

    taken = wait_for(resumed, timeout=60.0, interval=0.2, what="the takeover")
    assert taken is not None
    return taken


def test_two_machines_one_ledger_refuse_then_take_over_after_expiry_and_log_every_line_once(
    team: Team, cli: Cli
) -> None:
    a = team.start_run()
    run_id = running_run(team, a)
    before = len(team.mutations())

    # B, on machine two, while A lives: refused, naming A, and nothing sent to the cloud.
    refused = cli("runs", "resume", run_id, env=team.on(team.two))
    assert refused.code == 9, refused.stderr[-3000:]
    assert f"pid {a.pid}" in refused.stderr and "lease expires at" in refused.stderr
    assert len(team.mutations()) == before

    kill_9(a)
    with team.ledger() as ledger:
        last = ledger.lease_of(run_id)
    assert last is not None and last.owner.pid == a.pid

    taken = resume_once_the_lease_expired(cli, team, run_id)
    assert taken.code == 0, taken.stderr[-4000:]

    with team.ledger() as ledger:
        record = ledger.get_run(run_id)
        history = ledger.lease_history(run_id)
        stored = ledger.log_lines(run_id, worker=0)
    assert record is not None and record.status is RunStatus.SUCCEEDED
    a_entries = [h for h in history if h.owner.pid == a.pid]
    takeover = next(h for h in history if h.action is LeaseAction.TAKEOVER)
    # A's last renewal, then B's takeover at or after the expiry that renewal set.
    assert a_entries[-1].action in (LeaseAction.CLAIM, LeaseAction.RENEW)
    assert a_entries[-1].expires_at == last.expires_at
    assert takeover.at >= last.expires_at and takeover.owner.pid == os.getpid()
    # One slice per attempt: A's first, B's after the takeover.
    assert len(team.mutations(method="POST", suffix="/nodes")) == 2
    assert team.admin.status()["nodes"] == []

    # `runs logs` on machine two: every line the ledger has, each once, both attempts.
    shown = cli("runs", "logs", run_id, "--worker", "0", env=team.on(team.two))
    assert shown.code == 0, shown.stderr
    lines = [line for line in shown.stdout.splitlines() if " line " in line]
    assert len(lines) == len(set(lines)) == len([s for s in stored if " line " in s.text])
    assert all(f"attempt 1 line {i}" in shown.stdout for i in range(LINES))
    assert sorted(s.seq for s in stored) == list(range(len(stored)))  # B appended where A stopped


def test_a_stolen_lease_stops_its_supervisor_and_cancel_from_the_other_machine_cleans_up(
    team: Team, cli: Cli
) -> None:
    a = team.start_run()
    run_id = running_run(team, a)
    with sqlite3.connect(team.db) as raw:  # someone rewrites the token by hand
        raw.execute("UPDATE run_leases SET token = 'stolen' WHERE run_id = ?", (run_id,))
    assert a.wait(timeout=30) == 9
    output = (a.stdout.read() if a.stdout else b"").decode()
    assert run_id in output and "lease" in output
    with team.ledger() as ledger:
        lost = next(h for h in ledger.lease_history(run_id) if h.action is LeaseAction.LOST)
        row, segments = ledger.get_run(run_id), ledger.segments(run_id)
        intents = ledger.intents(run_id)
    assert not [m for m in team.mutations() if m["at"] >= lost.at]  # nothing sent after the loss
    assert [str(i.action) for i in intents] == ["create"]  # its slice stays for the next owner
    with team.ledger() as ledger:
        assert (ledger.get_run(run_id), ledger.segments(run_id)) == (row, segments)  # nothing written

    # Machine two cancels: nobody can stop it (the stolen lease runs out), so it cleans up itself.
    cancelled = cli("runs", "cancel", run_id, "-o", "json", env=team.on(team.two))
    assert cancelled.code == 0, cancelled.stderr[-3000:]
    assert cancelled.json["cancel"]["status"] == "cancelled"
    assert team.admin.status()["nodes"] == []
    with team.ledger() as ledger:
        record = ledger.get_run(run_id)
        assert record is not None and record.status is RunStatus.CANCELLED
        assert [str(i.action) for i in ledger.intents(run_id)] == ["create", "delete"]


def test_a_run_on_the_users_pod_is_taken_over_from_another_state_dir_with_the_runs_key(
    team: Team, cli: Cli
) -> None:
    made = cli("pod", "create", "v5e-8", "--zone", ZONE, "--name", "mine", env=team.on(team.one))
    assert made.code == 0, made.stderr[-3000:]
    a = team.start_run("--pod", "mine")
    run_id = running_run(team, a)
    stored = sqlite3.connect(team.db).execute(
        "SELECT ciphertext FROM run_secrets WHERE run_id = ? AND name = ?", (run_id, SECRET_NAME)
    )
    ciphertext = bytes(stored.fetchone()[0])
    assert ensure_key_pair(team.one).private_bytes() not in ciphertext
    kill_9(a)

    taken = resume_once_the_lease_expired(cli, team, run_id)
    assert taken.code == 0, taken.stderr[-4000:]
    with team.ledger() as ledger:
        record = ledger.get_run(run_id)
        lines = [line.text for line in ledger.log_lines(run_id, worker=0)]
    assert record is not None and record.status is RunStatus.SUCCEEDED
    assert all(f"attempt 1 line {i}" in lines for i in range(LINES))
    # Machine two reached state dir one's hosts with the run's key, and made no key of its own.
    assert not (team.two / "ssh").exists()
    assert [n["name"] for n in team.admin.status()["nodes"]] == ["mine"]  # the user's slice stays
    assert len(team.mutations(method="POST", suffix="/nodes")) == 1  # pod create's, no other
