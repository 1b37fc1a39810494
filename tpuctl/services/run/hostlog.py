"""A run's host logs: how they are written (a marker line per attempt, the time of every line) and read
back (``runs logs``: all hosts or one, with times, following a live run).

``<run dir>/worker-N.log`` holds the host's output exactly as printed, one line per line, so grep and
tail work on it; ``worker-N.times`` beside it holds the arrival time (epoch seconds) of each of those
lines, one per line, for ``runs logs --timestamps``. A log without its times file (an older run) reads
with no times.

A supervised run's lines also go to the ledger (``LedgerLog``: batched, fenced by the supervisor's lease,
each worker's numbered on from where the previous owner stopped), which is what ``runs logs`` reads on
any machine (``read_ledger_logs``); the files stay, for grep and tail on the supervisor's machine.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

from tpuctl import timefmt
from tpuctl.store.paths import private_file

if TYPE_CHECKING:
    from tpuctl.store.ledger import Ledger
    from tpuctl.store.records import LeaseClaim

#: The first words of the line that starts each attempt in a host's log.
MARKER = "=== tpuctl: attempt "


def times_path(log: Path) -> Path:
    return log.with_suffix(".times")


def iso(ts: float) -> str:
    """A host line's or segment's instant, to the millisecond."""
    return timefmt.iso(ts, milliseconds=True)


class HostLog:
    """One host's log of a run, open for appending: each line with its arrival time."""

    def __init__(
        self,
        path: Path,
        *,
        clock: Callable[[], float] = time.time,
        sink: Callable[[float, str], None] | None = None,
    ) -> None:
        self._clock = clock
        self._sink = sink  # where each line goes too, with its time (the ledger, ``LedgerLog``)
        self._text: IO[str] = private_file(path).open("a", encoding="utf-8", buffering=1)
        self._times: IO[str] = private_file(times_path(path)).open("a", encoding="utf-8", buffering=1)

    def write(self, text: str) -> None:
        """One whole line (``text`` has no newline), so lines of different hosts never mix."""
        at = self._clock()
        self._text.write(text + "\n")
        self._times.write(f"{at:.3f}\n")
        if self._sink is not None:
            self._sink(at, text)

    def mark_attempt(self, number: int, pod: str, zone: str) -> None:
        self.write(f"{MARKER}{number} on {pod} ({zone}), {iso(self._clock())} ===")

    def close(self) -> None:
        self._text.close()
        self._times.close()


class LedgerLog:
    """A run's host lines on their way to the ledger: batched (a write per ``flush_every_s`` or
    ``max_batch`` lines, not per line), fenced by ``claim`` (a supervisor that lost the run writes none),
    each worker's numbered on from the ledger's next seq, so a new owner appends where the old one
    stopped. Safe to call from the executor's threads."""

    def __init__(
        self,
        ledger: Ledger,
        claim: LeaseClaim,
        workers: range,
        *,
        flush_every_s: float = 1.0,
        max_batch: int = 500,
    ) -> None:
        import threading

        self._ledger = ledger
        self._claim = claim
        self._next = {w: ledger.next_log_seq(claim.run_id, w) for w in workers}
        self._pending: dict[int, list[tuple[float, str]]] = {}
        self._count = 0
        self._every_s = flush_every_s
        self._max = max_batch
        self._flushed_at = time.monotonic()
        self._lock = threading.Lock()

    def add(self, worker: int, at: float, text: str) -> None:
        with self._lock:
            self._pending.setdefault(worker, []).append((at, text))
            self._count += 1
            due = self._count >= self._max or time.monotonic() - self._flushed_at >= self._every_s
        if due:
            self.flush()

    def tick(self) -> None:
        """Flush what waited ``flush_every_s`` (called while the hosts are quiet)."""
        if self._count and time.monotonic() - self._flushed_at >= self._every_s:
            self.flush()

    def flush(self) -> None:
        """Write every pending line (``LeaseLostError`` when the lease is gone: nothing is written)."""
        with self._lock:
            pending, self._pending, self._count = self._pending, {}, 0
            self._flushed_at = time.monotonic()
            for worker, lines in sorted(pending.items()):
                first = self._next.setdefault(worker, self._ledger.next_log_seq(self._claim.run_id, worker))
                self._ledger.append_log_lines(self._claim, worker, first, lines)
                self._next[worker] = first + len(lines)


def host_lines(ledger: Ledger, run_id: str, worker: int, log: Path) -> Iterator[str]:
    """Host ``worker``'s lines, as the ledger has them (written on whatever machine supervised the run),
    else as this machine's log file ``log`` has them (a run that kept none in the ledger)."""
    stored = ledger.log_lines(run_id, worker=worker)
    if stored:
        yield from (line.text for line in stored)
        return
    if log.exists():
        with log.open(encoding="utf-8", errors="replace") as fh:
            yield from (line.rstrip("\n") for line in fh)


def read_ledger_logs(
    ledger: Ledger,
    run_id: str,
    workers: list[int],
    *,
    follow: Callable[[], bool] | None = None,
    poll_s: float = 0.5,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[LogLine]:
    """``read_logs`` over the ledger's lines: each worker's, host after host; with ``follow``, then the
    new ones from every host in arrival order until the run is over. Every line once, whichever
    supervisor (machine) wrote it."""
    last = dict.fromkeys(workers, -1)

    def fresh() -> list[LogLine]:
        found = []
        for worker in workers:
            lines = ledger.log_lines(run_id, worker=worker, after_seq=last[worker])
            if lines:
                last[worker] = lines[-1].seq
            found += [LogLine(worker, line.text, line.at) for line in lines]
        return found

    yield from fresh()
    if follow is None:
        return
    while True:
        going = follow()
        new = sorted(fresh(), key=lambda line: line.at if line.at is not None else 0.0)
        yield from new
        if not going:
            return
        sleep(poll_s)


@dataclass(frozen=True)
class LogLine:
    worker: int
    text: str
    at: float | None


class LogReader:
    """Reads one host's log from where it last stopped, whole lines only (a line still being written is
    left for the next read)."""

    def __init__(self, worker: int, path: Path) -> None:
        self.worker = worker
        self._path = path
        self._offset = 0
        self._times_offset = 0

    def read(self) -> list[LogLine]:
        if not self._path.exists():
            return []
        with self._path.open("rb") as fh:
            fh.seek(self._offset)
            data = fh.read()
        end = data.rfind(b"\n") + 1
        if end == 0:
            return []
        self._offset += end
        texts = data[:end].decode("utf-8", errors="replace").split("\n")[:-1]
        times = self._times(len(texts))
        return [LogLine(self.worker, text, at) for text, at in zip(texts, times, strict=True)]

    def _times(self, count: int) -> list[float | None]:
        path = times_path(self._path)
        found: list[float | None] = []
        if path.exists():
            with path.open("rb") as fh:
                fh.seek(self._times_offset)
                for raw in fh:
                    if len(found) == count or not raw.endswith(b"\n"):
                        break
                    self._times_offset += len(raw)
                    try:
                        found.append(float(raw))
                    except ValueError:
                        found.append(None)
        return found + [None] * (count - len(found))


def read_logs(
    paths: list[tuple[int, Path]],
    *,
    follow: Callable[[], bool] | None = None,
    poll_s: float = 0.5,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[LogLine]:
    """The lines of each host's log, host after host; with ``follow`` (a live run), then the lines as
    they arrive, from every host in arrival order, until ``follow()`` says the run is over (a last read
    then takes what it wrote on its way out)."""
    readers = [LogReader(w, p) for w, p in paths]
    for reader in readers:
        yield from reader.read()
    if follow is None:
        return
    while True:
        going = follow()
        fresh = [line for reader in readers for line in reader.read()]
        fresh.sort(key=lambda line: line.at if line.at is not None else 0.0)
        yield from fresh
        if not going:
            return
        sleep(poll_s)
