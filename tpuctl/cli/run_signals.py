"""How a foreground `tpuctl run` ends on a signal: SIGTERM and SIGHUP stop the hosts as Ctrl-C does, and
the message names the run and the command that carries it on."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def stop_hosts_on_termination() -> Iterator[None]:
    """SIGTERM and SIGHUP (a closed terminal) end the run like Ctrl-C does: the launcher stops every
    host before tpuctl exits. Without this the hosts, each in a session of its own, would outlive us."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextmanager
def resumable(run_id: str) -> Iterator[None]:
    """Ctrl-C (or SIGTERM) names the run and how to carry it on: it ends cancelled, resumable."""
    from tpuctl.errors import InterruptedByUser

    try:
        yield
    except (InterruptedByUser, KeyboardInterrupt) as exc:
        what = exc.message if isinstance(exc, InterruptedByUser) else "interrupted"
        raise InterruptedByUser(
            f"run {run_id} {what}",
            fix=f"carry it on from its last checkpoint with `tpuctl runs resume {run_id}`; "
            f"`tpuctl runs describe {run_id}` shows where it stopped",
        ) from exc
