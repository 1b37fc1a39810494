"""`tpuctl server` end to end, one host and a tiny program on the served simulator: a client submits with
``--server`` and is interrupted (Ctrl-C) once the run prints; the run goes on under server A; A is killed
-9 mid-run; server B on the same ledger adopts the run only once A's lease expired (the lease history says
so), and finishes it: one slice created per attempt, the last one deleted. SIGTERM stops B cleanly (exit
0, its place given back). A run submitted with ``--detach`` is cancelled through the server while it runs:
its supervisor (a thread of the server) stops it and deletes its slice.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from server_place import LINES, ZONE, Place, ended_under, output

from tpuctl.store.records import LeaseAction, RunStatus
from tpuctl.testing.clock import wait_for
from tpuctl.testing.ports import unused_port


@pytest.mark.slow  # the same behaviour on PostgreSQL is in the default suite (two servers, below)
def test_a_submitted_run_outlives_its_client_and_its_server_and_is_adopted_after_the_lease_expires(
    place: Place, tmp_path: Path
) -> None:
    a = place.start_server()
    followed = tmp_path / "client.out"
    client, run_id = _submitted(place, followed)

    def running_under_a() -> bool:
        assert a.poll() is None, output(a)
        with place.ledger() as ledger:
            held = ledger.lease_of(run_id)
            lines = ledger.log_lines(run_id, worker=0)
        return held is not None and held.owner.pid == a.pid and len(lines) >= 3

    wait_for(running_under_a, timeout=120.0, interval=0.1, what="the run to print under server A")
    # The laptop follows the run's lines; Ctrl-C there stops following, not the run, and says how to stop it.
    wait_for(
        lambda: "w0 | attempt 0 line 0" in followed.read_text(), timeout=60.0, interval=0.1, what="lines"
    )
    client.send_signal(signal.SIGINT)
    assert client.wait(timeout=30) == 130
    said = followed.read_text()
    assert f"run {run_id}; it goes on under the server" in said
    assert f"tpuctl --server {place.url} runs cancel {run_id}" in said
    a.send_signal(signal.SIGKILL)
    a.wait(timeout=10)
    with place.ledger() as ledger:
        last = ledger.lease_of(run_id)
    assert last is not None and last.owner.pid == a.pid

    b = place.start_server()  # A's place is taken over at once: A's pid is provably dead

    assert ended_under(place, b, run_id) is RunStatus.SUCCEEDED

    with place.ledger() as ledger:
        history = ledger.lease_history(run_id)
        stored = ledger.log_lines(run_id, worker=0)
    takeover = next(h for h in history if h.action is LeaseAction.TAKEOVER)
    a_entries = [h for h in history if h.owner.pid == a.pid]
    # A's last renewal set the expiry; B took the run at or after it, not before.
    assert a_entries[-1].expires_at == last.expires_at
    assert takeover.at >= last.expires_at and takeover.owner.pid == b.pid
    assert {h.owner.pid for h in history} == {a.pid, b.pid}
    assert place.creates() == 2  # one slice per attempt
    assert place.admin.status()["nodes"] == []  # the last one deleted
    assert any(s.text == f"attempt 1 line {LINES - 1}" for s in stored)

    # Read back through B, as a client does.
    listed = subprocess.run(
        [sys.executable, "-m", "tpuctl", "runs", "list", "-o", "json"],
        env=place.client_env,
        capture_output=True,
        timeout=60,
    )
    assert listed.returncode == 0, listed.stderr.decode()
    assert [(r["run_id"], r["status"]) for r in json.loads(listed.stdout)["runs"]] == [(run_id, "succeeded")]

    b.send_signal(signal.SIGTERM)
    assert b.wait(timeout=30) == 0, output(b)
    with place.ledger() as ledger:
        assert ledger.replicas() == []  # B gave its place back


def test_a_detached_submission_is_cancelled_through_the_server_by_its_supervisor(place: Place) -> None:
    server = place.start_server()
    run_id = place.submit_detached()

    def printing() -> bool:
        assert server.poll() is None, output(server)
        with place.ledger() as ledger:
            held = ledger.lease_of(run_id)
            return held is not None and held.owner.pid == server.pid and len(ledger.log_lines(run_id)) >= 2

    wait_for(printing, timeout=120.0, interval=0.1, what="the detached run to print")
    cancel = subprocess.run(
        [sys.executable, "-m", "tpuctl", "runs", "cancel", run_id, "-o", "json"],
        env=place.client_env,
        capture_output=True,
        timeout=120,
    )
    assert cancel.returncode == 0, cancel.stderr.decode()
    document = json.loads(cancel.stdout)["cancel"]
    assert document["cancelled"] is True and document["status"] == "cancelled"
    assert document["by"] == f"its supervisor (pid {server.pid})"
    assert server.poll() is None  # the server never signals itself
    assert place.admin.status()["nodes"] == []  # the run's slice deleted
    with place.ledger() as ledger:
        assert ledger.lease_of(run_id) is None  # given back by its supervisor


@pytest.mark.slow
def test_sigterm_mid_run_leaves_the_lease_to_expire_and_the_next_server_adopts_the_run(place: Place) -> None:
    a = place.start_server()
    run_id = place.submit_detached()

    def printing() -> bool:
        with place.ledger() as ledger:
            held = ledger.lease_of(run_id)
            return held is not None and held.owner.pid == a.pid and len(ledger.log_lines(run_id)) >= 3

    wait_for(printing, timeout=120.0, interval=0.1, what="the run to print under A")
    a.send_signal(signal.SIGTERM)
    assert a.wait(timeout=30) == 0, output(a)
    with place.ledger() as ledger:
        left = ledger.lease_of(run_id)
        assert ledger.replicas() == []  # A gave its place back ...
    assert left is not None and left.owner.pid == a.pid  # ... and left the run's lease to expire

    b = place.start_server()

    ended_under(place, b, run_id)
    with place.ledger() as ledger:
        record = ledger.get_run(run_id)
        takeover = next(h for h in ledger.lease_history(run_id) if h.action is LeaseAction.TAKEOVER)
    assert record is not None and record.status == RunStatus.SUCCEEDED
    assert takeover.at >= left.expires_at and takeover.owner.pid == b.pid
    assert place.creates() == 2 and place.admin.status()["nodes"] == []


def test_two_servers_on_postgresql_share_a_run_and_the_survivor_adopts_it_after_the_lease(
    team_place: Place, tmp_path: Path
) -> None:
    place = team_place
    a = place.start_server()
    b_url = f"http://127.0.0.1:{unused_port()}"
    b_place = dataclasses.replace(place, url=b_url)
    b = b_place.start_server()  # a second replica on the same database: PostgreSQL takes several
    with place.ledger() as ledger:
        assert sorted(r.owner.pid for r in ledger.replicas()) == sorted([a.pid, b.pid])
    followed = tmp_path / "client.out"
    client, run_id = _submitted(place, followed)

    def holder_printing() -> int | None:
        with place.ledger() as ledger:
            held = ledger.lease_of(run_id)
            lines = ledger.log_lines(run_id, worker=0)
        return held.owner.pid if held is not None and len(lines) >= 3 else None

    holder_pid = wait_for(holder_printing, timeout=120.0, interval=0.1, what="a replica to run it")
    # The laptop follows the run's lines; Ctrl-C there stops following, not the run, and says how to stop it.
    wait_for(
        lambda: "w0 | attempt 0 line 0" in followed.read_text(), timeout=60.0, interval=0.1, what="lines"
    )
    client.send_signal(signal.SIGINT)
    assert client.wait(timeout=30) == 130
    said = followed.read_text()
    assert f"run {run_id}; it goes on under the server" in said
    assert f"tpuctl --server {place.url} runs cancel {run_id}" in said
    holder, survivor = (a, b) if holder_pid == a.pid else (b, a)
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=10)
    with place.ledger() as ledger:
        last = ledger.lease_of(run_id)
    assert last is not None and last.owner.pid == holder.pid

    assert ended_under(place, survivor, run_id) is RunStatus.SUCCEEDED
    with place.ledger() as ledger:
        history = ledger.lease_history(run_id)
    takeover = next(h for h in history if h.action is LeaseAction.TAKEOVER)
    assert takeover.owner.pid == survivor.pid and takeover.at >= last.expires_at  # after expiry, not before
    assert {h.owner.pid for h in history} == {holder.pid, survivor.pid}
    assert place.creates() == 2  # one slice per attempt
    assert place.admin.status()["nodes"] == []  # the last one deleted

    # Read back through the survivor, as a client does.
    survivor_url = place.url if survivor is a else b_url
    listed = subprocess.run(
        [sys.executable, "-m", "tpuctl", "runs", "list", "-o", "json"],
        env={**place.client_env, "TPUCTL_SERVER": survivor_url},
        capture_output=True,
        timeout=60,
    )
    assert listed.returncode == 0, listed.stderr.decode()
    assert [(r["run_id"], r["status"]) for r in json.loads(listed.stdout)["runs"]] == [(run_id, "succeeded")]
    survivor.send_signal(signal.SIGTERM)
    assert survivor.wait(timeout=30) == 0, output(survivor)
    with place.ledger() as ledger:
        assert survivor.pid not in [r.owner.pid for r in ledger.replicas()]  # it gave its place back


@pytest.mark.slow
def test_a_cancelled_run_resumed_through_the_server_is_carried_on_to_its_end(place: Place) -> None:
    server = place.start_server()
    run_id = place.submit_detached()

    def printing() -> bool:
        with place.ledger() as ledger:
            return len(ledger.log_lines(run_id, worker=0)) >= 2

    wait_for(printing, timeout=120.0, interval=0.1, what="the run to print")
    cancel = place.client("runs", "cancel", run_id, "-o", "json")
    assert cancel.wait(timeout=120) == 0, output(cancel)
    resume = place.client("runs", "resume", run_id, "--detach", "-o", "json")
    out = resume.communicate(timeout=120)[0].decode()
    assert resume.returncode == 0, out
    assert json.loads(out[out.index("{") :])["run"]["run_id"] == run_id
    assert ended_under(place, server, run_id) is RunStatus.SUCCEEDED
    with place.ledger() as ledger:
        lines = [line.text for line in ledger.log_lines(run_id, worker=0)]
    assert f"attempt 1 line {LINES - 1}" in lines  # the second start ran to its end
    assert place.creates() == 2 and place.admin.status()["nodes"] == []


def _submitted(place: Place, followed: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A client process that submits the place's script and follows the run into ``followed``, and the
    run's id once the ledger has it."""
    client = place.client(
        "run", str(place.script), "--type", "v5e-8", "--zone", ZONE, "--no-runtime-deps", output=followed
    )

    def submitted() -> str | None:
        assert client.poll() is None, output(client)
        with place.ledger() as ledger:
            runs = ledger.list_runs()
        return runs[0].run_id if runs else None

    run_id = wait_for(submitted, timeout=60.0, interval=0.05, what="the submission")
    assert run_id is not None
    return client, run_id
