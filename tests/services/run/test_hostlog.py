"""A host's log: the output as printed plus the time of each line, a marker per attempt, read back whole
lines only (a line being written waits), followed across hosts in arrival order; Gloo noise recognised."""

from __future__ import annotations

from pathlib import Path

from tpuctl.services.run.hostlog import HostLog, LogLine, LogReader, read_logs


def _log(path: Path, lines: list[tuple[float, str]], attempt: int | None = None) -> None:
    """Append ``lines`` (arrival time, text) to a host log, after an attempt's marker at t=1.5."""
    times = ([1.5, 1.5] if attempt is not None else []) + [t for t, _ in lines]
    log = HostLog(path, clock=lambda: times.pop(0))
    if attempt is not None:
        log.mark_attempt(attempt, "tpu-v5e-8-abc-r1", "us-central1-a")
    for _, text in lines:
        log.write(text)
    log.close()


def test_lines_keep_their_text_and_times_and_each_attempt_is_marked(tmp_path: Path) -> None:
    path = tmp_path / "worker-0.log"
    _log(path, [(10.0, "hello"), (11.25, "step 1 loss 2.0")], attempt=1)
    _log(path, [(20.0, "again")], attempt=2)

    text = path.read_text().splitlines()
    assert (
        text[0] == "=== tpuctl: attempt 1 on tpu-v5e-8-abc-r1 (us-central1-a), 1970-01-01T00:00:01.500Z ==="
    )
    assert text[1:3] == ["hello", "step 1 loss 2.0"]
    assert text[3].startswith("=== tpuctl: attempt 2 on tpu-v5e-8-abc-r1") and text[4] == "again"
    read = list(read_logs([(0, path)]))
    assert [(line.text, line.at) for line in read][1:3] == [("hello", 10.0), ("step 1 loss 2.0", 11.25)]


def test_a_partial_line_waits_and_a_log_without_times_reads_without_them(tmp_path: Path) -> None:
    path = tmp_path / "worker-1.log"
    path.write_text("whole\npart")
    reader = LogReader(1, path)
    assert reader.read() == [LogLine(1, "whole", None)]
    with path.open("a") as fh:
        fh.write("ial\n")
    assert reader.read() == [LogLine(1, "partial", None)]
    assert reader.read() == []


def test_follow_interleaves_hosts_by_arrival_until_the_run_ends(tmp_path: Path) -> None:
    a, b = tmp_path / "worker-0.log", tmp_path / "worker-1.log"
    _log(a, [(1.0, "a1")])
    _log(b, [(2.0, "b1")])
    polls = iter([True, False])
    seen: list[str] = []

    def sleep(_: float) -> None:  # the hosts write while tpuctl waits
        _log(a, [(4.0, "a2")]) if not seen[2:] else None
        _log(b, [(3.0, "b2")]) if not seen[2:] else None

    for line in read_logs([(0, a), (1, b)], follow=lambda: next(polls), sleep=sleep):
        seen.append(line.text)
    assert seen == ["a1", "b1", "b2", "a2"]
