"""The detached program: its output followed across cut connections with every line exactly once, its
exit status or signal, a lost host, stop through the process group, leftovers of a run, setup commands
on every host, and the plan that says exactly what start runs."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import time
from pathlib import Path

from test_ssh_executor import LoopbackSsh, collect, executor_for, key, servers, spec

from tpuctl.hosts.base import REDACTED, HostEvent
from tpuctl.hosts.bundle import build_bundle
from tpuctl.hosts.ssh import SITECUSTOMIZE_DIR, KeyPair, SshExecutor

FOLLOW_MODULE = "from tpuctl.hosts.follow"

__all__ = ["key", "servers"]  # fixtures shared with test_ssh_executor


def _bundle_of(tmp_path: Path, name: str, source: str) -> Path:
    work = tmp_path / "proj"
    work.mkdir(exist_ok=True)
    (work / name).write_text(source)
    return work


CHATTY = """\
import os, sys, time
worker = os.environ["TPUCTL_WORKER_ID"]
for i in range(300):
    # Every 50th line is long, so lines straddle the reads' chunks and a cut lands inside one.
    pad = "x" * 70000 if i % 50 == 0 else ""
    print(f"w{worker} line {i} {pad}", flush=True)
    time.sleep(0.008)
print(f"w{worker} last, no newline", end="", flush=True)
"""


def _expected(worker: int) -> list[str]:
    return [f"w{worker} line {i} " + ("x" * 70000 if i % 50 == 0 else "") for i in range(300)] + [
        f"w{worker} last, no newline"
    ]


def test_every_line_exactly_once_while_every_connection_is_cut_again_and_again(
    tmp_path: Path, servers: LoopbackSsh, key: KeyPair
) -> None:
    executor = executor_for(servers, key)
    try:
        executor.ship(build_bundle(_bundle_of(tmp_path, "chatty.py", CHATTY)))
        executor.start(spec(("chatty.py",), {}))
        events: list[HostEvent] = []
        cuts, next_cut, lines_at_cut = 0, time.monotonic() + 0.3, 0
        deadline = time.monotonic() + 60
        while sum(e.kind == "exit" for e in events) < 2:
            assert time.monotonic() < deadline, events[-5:]
            # Every 0.4 s, once some lines came through since the last cut: on a loaded machine a
            # reconnection may take longer than 0.4 s, and cutting it again before it delivers would
            # test nothing but the deadline.
            due = time.monotonic() >= next_cut and len(events) >= lines_at_cut + 10
            if due and not any(e.kind == "exit" for e in events):
                executor.close_connections()
                cuts, next_cut, lines_at_cut = cuts + 1, time.monotonic() + 0.4, len(events)
            event = executor.next_event(0.05)
            if event is not None:
                events.append(event)
    finally:
        executor.close()
    assert cuts >= 4  # the program runs ~2.5 s: cut every 0.4 s while both hosts ran
    for worker in (0, 1):
        mine = [e for e in events if e.worker == worker]
        assert [e.text for e in mine if e.kind == "line"] == _expected(worker)
        assert mine[-1].kind == "exit" and mine[-1].returncode == 0
        # The launch's own session tailed from offset 0; each cut made the follower resume with a new
        # tail from the last complete line's offset.
        commands = servers.hosts[worker].commands
        assert (
            sum(f"{FOLLOW_MODULE} import main" in c and " launch " in c and " --tail " in c for c in commands)
            == 1
        )
        tails = [c for c in commands if f"{FOLLOW_MODULE} import main" in c and " tail " in c]
        offsets = [int(c.rsplit(" ", 1)[1]) for c in tails]
        assert len(tails) >= 3 and offsets == sorted(offsets) and offsets[0] > 0


ENDINGS = """\
import os, signal, sys
print("ending", flush=True)
if os.environ["TPUCTL_WORKER_ID"] == "0":
    sys.exit(3)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_an_exit_status_and_a_signal_death_are_reported(
    tmp_path: Path, servers: LoopbackSsh, key: KeyPair
) -> None:
    executor = executor_for(servers, key)
    try:
        executor.ship(build_bundle(_bundle_of(tmp_path, "endings.py", ENDINGS)))
        executor.start(spec(("endings.py",), {}))
        events = collect(executor, 2)
    finally:
        executor.close()
    for worker, status in ((0, 3), (1, -9)):
        mine = [(e.kind, e.text, e.returncode) for e in events if e.worker == worker]
        assert mine == [("line", "ending", None), ("exit", "", status)]
    exits = servers.hosts[1].home / ".tpuctl" / "runs" / "run-ssh-0001" / "0" / "exit"
    assert exits.read_text() == "-9\n"


FAMILY = """\
import os, signal, subprocess, sys, time
if os.environ["TPUCTL_WORKER_ID"] == "1":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only SIGKILL ends this one
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
print("pids", os.getpid(), child.pid, flush=True)
time.sleep(300)
"""


def test_stop_signals_the_detached_process_group_then_kills_it_after_the_grace(
    tmp_path: Path, servers: LoopbackSsh, key: KeyPair
) -> None:
    executor = executor_for(servers, key)
    pids: dict[int, list[int]] = {}
    try:
        executor.ship(build_bundle(_bundle_of(tmp_path, "family.py", FAMILY)))
        executor.start(spec(("family.py",), {}))
        deadline = time.monotonic() + 30
        while len(pids) < 2:
            assert time.monotonic() < deadline
            event = executor.next_event(0.1)
            if event is not None and event.text.startswith("pids "):
                pids[event.worker] = [int(p) for p in event.text.split()[1:]]
        started = time.monotonic()
        executor.stop(grace_s=1.0)
        assert time.monotonic() - started < 1.0 + 4.0
        events = collect(executor, 2, timeout_s=5)
    finally:
        executor.close()
    assert {e.worker: e.returncode for e in events if e.kind == "exit"} == {0: -15, 1: -9}
    # The whole group went, the program's own child too; none was the SSH session's.
    deadline = time.monotonic() + 5
    while any(Path(f"/proc/{p}").exists() for ps in pids.values() for p in ps):
        assert time.monotonic() < deadline, pids
        time.sleep(0.05)


SLEEPY = """\
import time
print("up", flush=True)
time.sleep(300)
"""


def test_a_host_unreachable_for_lost_after_s_is_lost_and_only_it(
    tmp_path: Path, servers: LoopbackSsh, key: KeyPair
) -> None:
    executor = executor_for(servers, key, lost_after_s=1.5)
    try:
        executor.ship(build_bundle(_bundle_of(tmp_path, "sleepy.py", SLEEPY)))
        executor.start(spec(("sleepy.py",), {}))
        ups = [executor.next_event(10), executor.next_event(10)]
        assert sorted((e.worker, e.text) for e in ups if e is not None) == [(0, "up"), (1, "up")]
        servers.stop_host(1)  # the machine drops off the network; its program runs on
        gone = time.monotonic()
        lost = [e for e in collect(executor, 1, timeout_s=10) if e.worker == 1]
        # lost_after_s counts from the last byte heard, a heartbeat (1 s apart) before the cut.
        assert 1.5 - 1.0 <= time.monotonic() - gone < 5
        assert lost[-1].kind == "exit" and lost[-1].returncode is None
        assert lost[0].text.startswith("[tpuctl] host 1 (tpuctl@127.0.0.1:") and " lost: " in lost[0].text
        assert executor.next_event(0.5) is None  # host 0 is not lost: still running, still followed
        executor.stop(grace_s=1.0)
        assert [(e.worker, e.returncode) for e in collect(executor, 1) if e.kind == "exit"] == [(0, -15)]
    finally:
        executor.close()


def test_stop_leftovers_kills_every_group_of_the_run_from_its_pid_files(
    tmp_path: Path, servers: LoopbackSsh, key: KeyPair
) -> None:
    first = executor_for(servers, key)
    try:
        first.ship(build_bundle(_bundle_of(tmp_path, "sleepy.py", SLEEPY)))
        first.start(spec(("sleepy.py",), {}, run_id="run-taken-over"))
        assert {first.next_event(10) is not None for _ in range(2)} == {True}
        # Another launcher takes the run over: it knows only the run id.
        second = executor_for(servers, key)
        try:
            assert second.stop_leftovers("run-taken-over") == 2  # one group on each host
            assert second.stop_leftovers("run-taken-over") == 0  # their exit files are there now
            assert second.stop_leftovers("run-unknown") == 0
        finally:
            second.close()
        exits = [e for e in collect(first, 2) if e.kind == "exit"]
        assert sorted((e.worker, e.returncode) for e in exits) == [(0, -9), (1, -9)]
    finally:
        first.close()


def test_run_command_streams_lines_and_returns_each_hosts_status_and_tail(
    servers: LoopbackSsh, key: KeyPair
) -> None:
    (servers.hosts[0].home / "marker").write_text("")
    executor = executor_for(servers, key)
    lines: list[tuple[int, str]] = []
    try:
        results = executor.run_command(
            "for i in $(seq 1 30); do echo line-$i; done; echo oops >&2; [ -e marker ] || exit 4",
            on_line=lambda worker, text: lines.append((worker, text)),
            timeout_s=10,
        )
        killed = executor.run_command("echo bye; kill -TERM $$", on_line=lambda w, t: None, timeout_s=10)
        slow = executor.run_command("echo slow; sleep 30", on_line=lambda w, t: None, timeout_s=0.5)
    finally:
        executor.close()
    expected = [f"line-{i}" for i in range(1, 31)] + ["oops"]
    for worker, status in ((0, 0), (1, 4)):
        assert [t for w, t in lines if w == worker] == expected
        assert results[worker].worker == worker and results[worker].exit_status == status
        assert results[worker].tail == tuple(expected[-20:])
        assert killed[worker].exit_status == -15 and killed[worker].tail == ("bye",)
        assert slow[worker].exit_status is None
        assert slow[worker].tail == ("slow", "[tpuctl] timed out after 0 s")


def test_run_command_on_chosen_workers_runs_only_there(servers: LoopbackSsh, key: KeyPair) -> None:
    executor = executor_for(servers, key)
    seen: list[int] = []
    try:
        results = executor.run_command(
            "touch ran-here; echo hi", on_line=lambda w, t: seen.append(w), timeout_s=10, workers=[1]
        )
    finally:
        executor.close()
    assert list(results) == [1] and results[1].exit_status == 0 and seen == [1]
    assert [(h.home / "ran-here").exists() for h in servers.hosts] == [False, True]


def test_a_script_over_the_command_line_limit_runs_from_stdin(servers: LoopbackSsh, key: KeyPair) -> None:
    from tpuctl.hosts.setup import RUN_SCRIPT_FROM_STDIN

    # 200 KiB of comment: as a command it would be one argument of sh -c over Linux's 128 KiB cap.
    padding = "".join(f"# {i:06d} {'x' * 90}\n" for i in range(2000))
    script = f'{padding}read -r first || first=eof; echo "stdin: $first"\necho after; exit 7\n'
    lines: list[tuple[int, str]] = []
    executor = executor_for(servers, key)
    try:
        results = executor.run_command(
            RUN_SCRIPT_FROM_STDIN,
            stdin=script.encode(),
            on_line=lambda worker, text: lines.append((worker, text)),
            timeout_s=10,
        )
    finally:
        executor.close()
    assert len(script) > 128 * 1024
    # A step that reads stdin finds it at its end, not the rest of the script, which still runs.
    for worker in (0, 1):
        assert [t for w, t in lines if w == worker] == ["stdin: eof", "after"]
        assert results[worker].exit_status == 7


ENV_PROBE = """\
import glob, json, os, sys
# Every process's argv on this machine (the hosts' too), as `ps` shows it: which hold a value of the env.
values = [os.environ["API_SECRET"].encode(), os.environ["PLAIN_VAR"].encode()]
argvs = []
for path in glob.glob("/proc/[0-9]*/cmdline"):
    try:
        with open(path, "rb") as fh:
            argvs.append(fh.read())
    except OSError:
        pass
print(json.dumps({"zone": os.environ.get("HOST_ZONE"), "worker": os.environ["TPUCTL_WORKER_ID"],
                  "user": os.environ.get("USER_VAR"), "path": os.environ["PYTHONPATH"].split(":"),
                  "cwd": os.getcwd(), "sid": os.getsid(0) == os.getpid(),
                  "secret": os.environ["API_SECRET"], "plain": os.environ["PLAIN_VAR"],
                  "in_argv": sum(v in a for v in values for a in argvs)}), flush=True)
"""


def test_plan_shows_exactly_what_start_runs_with_host_env_and_pythonpath(
    tmp_path: Path, servers: LoopbackSsh, key: KeyPair
) -> None:
    """Env values (secrets too, shown as ``<secret>`` in the plan) reach the program over the SSH
    session's stdin: no process's argv holds one while the program runs."""
    executor: SshExecutor = executor_for(
        servers, key, host_env=lambda worker: {"HOST_ZONE": f"zone-{worker}", "USER_VAR": "host wins"}
    )
    bundle = build_bundle(_bundle_of(tmp_path, "probe.py", ENV_PROBE))
    launch = dataclasses.replace(
        spec(("probe.py",), {"USER_VAR": "user", "PLAIN_VAR": "pl41n-v4lue"}),
        secret_env={"API_SECRET": "s3cr3t-v4lue"},
    )
    try:
        before = executor.plan(launch, digest=bundle.digest)
        executor.ship(bundle)
        assert executor.plan(launch) == before
        executor.start(launch)
        events = collect(executor, 2)
    finally:
        executor.close()
    bundle_dir = f".tpuctl/bundles/{bundle.digest}"
    for worker, plan in enumerate(before):
        assert plan.argv == (sys.executable, "-u", "probe.py") and plan.cwd == bundle_dir
        assert plan.env["HOST_ZONE"] == f"zone-{worker}" and plan.env["TPUCTL_WORKER_ID"] == str(worker)
        assert plan.env["PYTHONPATH"] == f"<{bundle_dir}>:<{bundle_dir}>/{SITECUSTOMIZE_DIR}"
        assert plan.shell_command in servers.hosts[worker].commands  # what ran is what was planned
        assert plan.env["API_SECRET"] == REDACTED and "s3cr3t-v4lue" not in repr((plan, launch))
        assert plan.shell_command is not None and "pl41n-v4lue" not in plan.shell_command
        report = json.loads(next(e.text for e in events if e.worker == worker and e.kind == "line"))
        home = os.path.realpath(servers.hosts[worker].home)
        absolute = f"{home}/{bundle_dir}"
        assert report == {
            "zone": f"zone-{worker}",
            "worker": str(worker),
            "user": "host wins",
            "path": [absolute, f"{absolute}/{SITECUSTOMIZE_DIR}"],
            "cwd": absolute,
            "sid": True,
            "secret": "s3cr3t-v4lue",
            "plain": "pl41n-v4lue",
            "in_argv": 0,
        }


def test_a_program_whose_supervisor_died_without_an_exit_status_is_reported_lost(
    tmp_path: Path, servers: LoopbackSsh, key: KeyPair
) -> None:
    executor = executor_for(servers, key)
    try:
        executor.ship(build_bundle(_bundle_of(tmp_path, "sleepy.py", SLEEPY)))
        executor.start(spec(("sleepy.py",), {}, workers=2))
        assert {executor.next_event(10) is not None for _ in range(2)} == {True}
        run = servers.hosts[1].home / ".tpuctl" / "runs" / "run-ssh-0001" / "0"
        os.kill(int((run / "supervisor").read_text()), signal.SIGKILL)  # no exit file will come
        os.killpg(int((run / "pid").read_text()), signal.SIGKILL)
        lost = [e for e in collect(executor, 1, timeout_s=10) if e.worker == 1]
        assert [e.kind for e in lost] == ["line", "exit"] and lost[1].returncode is None
        assert lost[0].text.startswith("[tpuctl] host 1: cannot follow its program: the supervisor (pid ")
        assert lost[0].text.endswith(") ended without an exit status")
    finally:
        executor.close()
