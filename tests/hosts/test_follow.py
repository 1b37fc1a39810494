"""The follower's notice: whatever the program does with SIGTERM, the host's metadata notice becomes one
event line in the program's output, at a line start, and never after the program's exit status.

The launcher runs in a process of its own (it forks its supervisor); the metadata server is the
loopback test server (Google's long-poll rules)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tpuctl.hosts import follow
from tpuctl.runtime.preemption import parse_event
from tpuctl.testing.clock import wait_for
from tpuctl.testing.metadata_server import MetadataServer, slice_values

REPO = Path(__file__).resolve().parents[2]

#: A program half way through a line when the notice comes, that goes on regardless (as one whose
#: SIGTERM JAX's preemption notifier caught does).
HALF_A_LINE = "import sys, time\nsys.stdout.write('half a line')\nsys.stdout.flush()\ntime.sleep(120)\n"


LAUNCHER = "import sys; from tpuctl.hosts.follow import main; sys.exit(main(sys.argv[1:]))"


@pytest.fixture
def metadata() -> Iterator[MetadataServer]:
    server = MetadataServer(slice_values(2, ["127.0.0.1"]))
    try:
        yield server
    finally:
        server.close()


def _launch(run_dir: Path, metadata: MetadataServer, program: str) -> int:
    """``follow.py launch`` as tpuctl's SSH executor runs it; the program's pid."""
    env = ("--env", f"GCE_METADATA_HOST={metadata.host}", "--env", "TPUCTL_WORKER_ID=2")
    argv = [sys.executable, "-c", LAUNCHER, "launch", str(run_dir), "--cwd", str(run_dir.parent), *env]
    launched = subprocess.run(
        [*argv, "--", sys.executable, "-c", program],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return int(launched.stdout.split()[1])


def _line_after(out: Path, start: str) -> str:
    """The output once a whole line follows ``start``; "" before."""
    text = out.read_text()
    return text if text != start and text.endswith("\n") else ""


def _events(text: str) -> list[dict[str, object]]:
    return [e for e in (parse_event(line) for line in text.splitlines()) if e is not None]


def test_the_metadata_notice_is_one_event_line_in_the_programs_output(
    tmp_path: Path, metadata: MetadataServer
) -> None:
    run_dir = tmp_path / "runs" / "r" / "1"
    pid = _launch(run_dir, metadata, HALF_A_LINE)
    out = run_dir / follow.OUT
    try:
        wait_for(lambda: out.read_text() == "half a line", 30, what="the program's first output")
        # Both keys are long-polled from the start: the change wakes them at once.
        wait_for(
            lambda: (
                sum(
                    "/instance/" in path and "wait_for_change" in query
                    for path, query, _ in metadata.requests
                )
                >= 2
            ),
            30,
            what="the follower's long polls",
        )
        metadata.set("instance/preempted", "TRUE")
        text = wait_for(lambda: _line_after(out, "half a line"), 30, what="the notice line")
    finally:
        os.killpg(pid, signal.SIGKILL)  # the program went on after the notice; the grace's end kills it
    wait_for(lambda: (run_dir / follow.EXIT).exists(), 30, what="the exit status")
    assert (run_dir / follow.EXIT).read_text() == f"{-signal.SIGKILL}\n"
    first = text.split("\n")[0]
    assert first == "half a line"  # the event starts a line of its own
    (event,) = _events(text)
    assert event["event"] == "notice" and event["source"] == "metadata" and event["worker"] == 2
    assert event["reporter"] == "follower" and isinstance(event["t"], float)
    assert out.read_text() == text  # one line, whatever else happens


def _flagged_then_ended(tmp_path: Path, metadata: MetadataServer, sig: signal.Signals) -> str:
    """A program under the follower, once its long polls wait: the preemption flag set without answering
    them (the program's end comes first, every time), then ``sig`` to the program. Its output once the
    exit status (which must be ``-sig``) is written."""
    run_dir = tmp_path / "runs" / "r" / "1"
    pid = _launch(run_dir, metadata, "import time\ntime.sleep(120)\n")
    wait_for(
        lambda: sum("wait_for_change" in query for _, query, _ in metadata.requests) >= 2,
        30,
        what="the follower's long polls",
    )
    metadata.set("instance/preempted", "TRUE", wake=False)
    os.killpg(pid, sig)
    wait_for(lambda: (run_dir / follow.EXIT).exists(), 30, what="the exit status")
    assert (run_dir / follow.EXIT).read_text() == f"{-sig}\n"
    return (run_dir / follow.OUT).read_text()


def test_a_notice_that_comes_with_the_sigterm_that_ends_the_program_is_still_one_line(
    tmp_path: Path, metadata: MetadataServer
) -> None:
    """A program with SIGTERM's default action dies the moment the notice comes (the flag turns TRUE with
    the soft-off's SIGTERM): the long poll's answer loses that race to the program's end, yet the notice
    is on the record, before the exit status (else tpuctl takes it for a preemption without notice)."""
    out = _flagged_then_ended(tmp_path, metadata, signal.SIGTERM)
    (event,) = _events(out)
    assert event["event"] == "notice" and event["worker"] == 2 and event["reporter"] == "follower"


def test_a_flag_that_comes_with_a_sigkill_is_no_notice(tmp_path: Path, metadata: MetadataServer) -> None:
    """A hard-off sets the flag as it kills every process, one by one: a supervisor that outlives its
    program by a moment must not turn that into a notice the program was given."""
    out = _flagged_then_ended(tmp_path, metadata, signal.SIGKILL)
    assert _events(out) == []


def test_a_closed_reporter_writes_nothing_so_no_line_follows_the_exit_status(
    tmp_path: Path, metadata: MetadataServer
) -> None:
    out = tmp_path / "out"
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        reporter = follow.NoticeReporter(fd, {"GCE_METADATA_HOST": metadata.host})
        reporter.close()  # the program ended
        assert reporter.report("notice", source="metadata") is False
        assert out.read_bytes() == b""
        opened = follow.NoticeReporter(fd, {"GCE_METADATA_HOST": metadata.host})
        terminate = "TERMINATE_ON_HOST_MAINTENANCE"
        assert opened.report("maintenance", value=terminate) is True
        assert opened.report("maintenance", value=terminate) is False  # each value once
        assert opened.report("notice", source="metadata") is True  # a maintenance is no preemption
        assert opened.report("notice", source="metadata") is False  # the first only
    finally:
        os.close(fd)
    maintenance, notice = _events(out.read_text())
    assert maintenance["event"] == "maintenance" and maintenance["value"] == terminate
    assert maintenance["worker"] is None and "source" not in maintenance
    assert notice["event"] == "notice" and notice["source"] == "metadata"


def test_each_maintenance_value_is_its_own_line_and_a_later_preemption_still_one(
    tmp_path: Path, metadata: MetadataServer
) -> None:
    run_dir = tmp_path / "runs" / "r" / "1"
    pid = _launch(run_dir, metadata, "import time\ntime.sleep(120)\n")
    out = run_dir / follow.OUT

    def said() -> list[dict[str, object]]:
        return _events(out.read_text()) if out.exists() else []

    try:
        wait_for(
            lambda: sum("wait_for_change" in query for _, query, _ in metadata.requests) >= 2,
            30,
            what="the follower's long polls",
        )
        # Not an end for a TPU VM, which cannot live-migrate, but news all the same.
        metadata.set("instance/maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE")
        wait_for(lambda: len(said()) == 1, 30, what="the first maintenance line")
        metadata.set("instance/maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE")
        wait_for(lambda: len(said()) == 2, 30, what="the second maintenance line")
        metadata.set("instance/preempted", "TRUE")  # a maintenance is no preemption: still watched
        wait_for(lambda: len(said()) == 3, 30, what="the notice line")
    finally:
        os.killpg(pid, signal.SIGKILL)
    wait_for(lambda: (run_dir / follow.EXIT).exists(), 30, what="the exit status")
    events = said()
    assert [(e["event"], e.get("value")) for e in events] == [
        ("maintenance", "MIGRATE_ON_HOST_MAINTENANCE"),
        ("maintenance", "TERMINATE_ON_HOST_MAINTENANCE"),
        ("notice", None),
    ]
    assert all(e["worker"] == 2 and e["reporter"] == "follower" for e in events)
