"""An uncaught exception on a host ends that host's program at once, saying which host and why.

Without this, one host raising leaves JAX's shutdown barrier waiting for the others (minutes), and the
host that aborts last is the one blamed. :func:`install` (called by the ``_sitecustomize`` start-up hook on
every backend) replaces ``sys.excepthook`` and ``threading.excepthook`` with :func:`report`, which:

1. prints the traceback to stderr, as Python would;
2. prints the event ``TPUCTL_EVENT {"event": "exception", "type": "ValueError", "message": "bad lr",
   "worker": <TPUCTL_WORKER_ID>}`` on stdout (:func:`tpuctl.runtime.preemption.emit`): the type's name
   and the last line of the exception's own message (:func:`own_last_line`), which the supervisor
   quotes as ``ValueError: bad lr``;
3. ends the process with ``os._exit(1)``: no atexit handlers, so no ``jax.distributed`` shutdown barrier.

An exception in any thread ends the process too: a training program whose checkpoint or input thread
died cannot finish correctly, and waiting would only hang the slice. ``KeyboardInterrupt`` and
``SystemExit`` keep Python's own behaviour.

A Python child the program starts inherits PYTHONPATH and so the hook: its own uncaught exception is
reported the same way (the event names the worker; its exit status goes to its parent, as usual). The
supervisor takes the event as the reason of a host's failure when the host's program exits 1, not as a
failure on its own. (multiprocessing's workers catch their target's exceptions themselves.)

Importing this module is cheap (stdlib only); the event code is imported when an exception happens.
"""

from __future__ import annotations

import os
import sys
import threading

# Not ``from typing import TYPE_CHECKING``: importing typing costs ~6 ms per start (mypy honours this).
TYPE_CHECKING = False

if TYPE_CHECKING:
    from types import TracebackType
    from typing import Any, NoReturn

# ``traceback`` (with linecache and tokenize) and ``contextlib`` are imported where an exception is
# reported, not here: every program on every host imports this module at start-up (sitecustomize), and
# they cost more than the rest of its start-up.

#: The exit status of a host whose program died of an uncaught exception (Python's own).
EXCEPTION_EXIT_CODE = 1
_WORKER_ENV = "TPUCTL_WORKER_ID"  # hostenv.WORKER_ID; not imported, to keep start-up to the stdlib

_installed = False


def own_last_line(exc: BaseException | None) -> str:
    """The last line of the exception's own message (``bad lr`` of ``ValueError("bad lr")``, ``'x'`` of
    ``KeyError('x')``), "" when it has none. Not the traceback's last line: since Python 3.11 that is
    the last of the notes libraries attach, e.g. JAX's "For simplicity, JAX has removed its internal
    frames..." on every exception raised through a jitted function."""
    try:
        text = str(exc) if exc is not None else ""
    except Exception:  # a broken __str__ must not hide that the exception happened
        return ""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def worker() -> int | str | None:
    """This host's worker id from the environment (an int when it is one)."""
    raw = os.environ.get(_WORKER_ENV, "")
    if not raw:
        return None
    return int(raw) if raw.isdigit() else raw


def report(
    exc_type: type[BaseException],
    exc: BaseException | None,
    tb: TracebackType | None,
    *,
    thread: str | None = None,
) -> NoReturn:
    """Print the traceback and the ``exception`` event, then ``os._exit(1)`` (never returns)."""
    try:
        import contextlib
        import traceback

        if thread is not None:
            print(f"Exception in thread {thread}:", file=sys.stderr)
        traceback.print_exception(exc_type, exc, tb, file=sys.stderr)
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        from tpuctl.runtime.preemption import emit

        fields: dict[str, Any] = {"type": exc_type.__name__, "message": own_last_line(exc)}
        fields["worker"] = worker()
        if thread is not None:
            fields["thread"] = thread
        emit("exception", **fields)
    except BaseException:
        pass
    finally:
        os._exit(EXCEPTION_EXIT_CODE)


def _excepthook(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    if issubclass(exc_type, KeyboardInterrupt):
        sys.__excepthook__(exc_type, exc, tb)
        return
    report(exc_type, exc, tb)


def _thread_excepthook(args: threading.ExceptHookArgs) -> None:
    if issubclass(args.exc_type, SystemExit | KeyboardInterrupt):
        threading.__excepthook__(args)
        return
    name = args.thread.name if args.thread is not None else None
    report(args.exc_type, args.exc_value, args.exc_traceback, thread=name or "?")


def install() -> None:
    """Install both hooks in this process (idempotent)."""
    global _installed
    if _installed:
        return
    sys.excepthook = _excepthook
    threading.excepthook = _thread_excepthook
    _installed = True
