"""Preemption notices on a host, turned into one checkpoint at the same step on every host.

A spot/preemptible TPU VM learns of its preemption two ways: SIGTERM (the guest's soft-off), and the
metadata server's ``instance/preempted`` turning ``TRUE``. Either may come first, on any one host.
:class:`PreemptionWatch` listens to both and answers one question at every step boundary, the same
way on every host: "stop here?" (``should_stop(step)``).

- Multi-process jobs (``jax.distributed`` initialized, its preemption service on, which is JAX's
  default): JAX's own sync point, ``multihost_utils.reached_preemption_sync_point(step)``. Its C++
  notifier catches SIGTERM, tells the coordination service, and every process agrees on the first step
  after the largest step any of them had reached; all of them answer True at that same step. A notice
  seen on the metadata server is fed to it as a SIGTERM to ourselves. Verified on CPU with gloo (the
  simulator): tests/runtime/test_preemption.py.
- Distributed without JAX's preemption service: the local flag is all-gathered at each step (any host
  noticed -> all stop), a collective per step, so only as the fallback.
- A single process (with or without ``jax.distributed``): the local flag, with SIGTERM caught by our
  own handler (taken back from JAX's notifier, whose sync point a lone process does not need).

The program then saves a checkpoint at that step, waits until it is durable, prints
``TPUCTL_EVENT {"event": "preempted", "step": S, ...}`` and exits with :data:`PREEMPTED_EXIT_CODE`,
which tells tpuctl's supervisor "preempted, checkpoint saved at step S".

Events for the supervisor are single lines ``TPUCTL_EVENT <json>`` on stdout (see :func:`emit`).
Nothing here runs at import; no JAX import at module level (the CLI side imports the constants).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import signal
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)

#: Exit status meaning "preempted; a checkpoint was saved" (EX_TEMPFAIL: try again later).
PREEMPTED_EXIT_CODE = 75
#: The prefix of every line the runtime prints for the supervisor.
EVENT_PREFIX = "TPUCTL_EVENT "
#: Seconds between two polls of the metadata server (each is one small GET on a kept-alive connection).
POLL_ENV = "TPUCTL_PREEMPTION_POLL_S"
DEFAULT_POLL_S = 0.5
_PREEMPTED_PATH = "/computeMetadata/v1/instance/preempted"


def emit(event: str, **fields: Any) -> None:
    """Print one event line for the supervisor (flushed: it reads host output line by line)."""
    print(EVENT_PREFIX + json.dumps({"event": event, **fields}, separators=(",", ":")), flush=True)


def parse_event(line: str) -> dict[str, Any] | None:
    """The event of a ``TPUCTL_EVENT`` line, or None for any other line (or a mangled one)."""
    if not line.startswith(EVENT_PREFIX):
        return None
    try:
        data = json.loads(line[len(EVENT_PREFIX) :])
    except ValueError:
        return None
    return data if isinstance(data, dict) and isinstance(data.get("event"), str) else None


class MetadataClient:
    """Reads ``instance/preempted`` from a metadata server (GCE's, or the simulator's per-host one)."""

    def __init__(self, base_url: str, *, timeout_s: float = 2.0) -> None:
        parsed = urllib.parse.urlsplit(base_url.rstrip("/"))
        if parsed.scheme != "http" or not parsed.hostname:
            raise ValueError(f"metadata URL must be http://host[:port][/path], got {base_url!r}")
        self._host = parsed.hostname
        self._port = parsed.port or 80
        self._path = parsed.path + _PREEMPTED_PATH
        self._timeout_s = timeout_s
        self._conn: http.client.HTTPConnection | None = None

    def preempted(self) -> bool:
        """True once the server says TRUE; raises OSError/HTTPException when it cannot be asked."""
        if self._conn is None:
            self._conn = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout_s)
        try:
            self._conn.request("GET", self._path, headers={"Metadata-Flavor": "Google"})
            response = self._conn.getresponse()
            body = response.read().decode("utf-8", "replace").strip()
        except (OSError, http.client.HTTPException):
            self.close()  # a fresh connection next time
            raise
        if response.status != 200:
            raise http.client.HTTPException(f"metadata server answered {response.status}")
        return body.upper() == "TRUE"

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class PreemptionWatch:
    """SIGTERM and the metadata server's preemption flag -> ``should_stop(step)`` at step boundaries.

    ``install()`` before ``jax.distributed.initialize()`` (a SIGTERM that arrives during start-up is
    kept); ``attach()`` right after it (switches to JAX's sync point and hands it a notice that came
    early); ``should_stop(step)`` after every step, on every host; ``close()`` at the end.
    """

    def __init__(
        self,
        metadata_url: str | None,
        *,
        poll_s: float = DEFAULT_POLL_S,
        worker: int = 0,
        clock: Callable[[], float] = time.time,
        announce: Callable[..., None] = emit,
    ) -> None:
        self._client = MetadataClient(metadata_url) if metadata_url else None
        self._poll_s = max(0.05, poll_s)
        self._worker = worker
        self._clock = clock
        self._announce = announce
        self._noticed = threading.Event()
        self._notice_at: float | None = None
        self._notice_source: str | None = None
        self._announced = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._previous_handler: Any = None
        self._handler_installed = False
        self._mode = "local"  # local | jax | allgather
        self.poll_errors = 0

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> PreemptionWatch:
        """From the worker environment: the metadata URL tpuctl gave the host (none outside tpuctl:
        polling metadata.google.internal from a laptop would only time out)."""
        e = dict(os.environ if env is None else env)
        url = e.get("TPUCTL_METADATA_URL") or None
        try:
            poll_s = float(e.get(POLL_ENV, "") or DEFAULT_POLL_S)
        except ValueError:
            poll_s = DEFAULT_POLL_S
        worker = int(e.get("TPUCTL_WORKER_ID", "0") or 0)
        return cls(url, poll_s=poll_s, worker=worker)

    # --- state ------------------------------------------------------------------------------------

    @property
    def mode(self) -> str:
        return self._mode

    @property
    def noticed(self) -> bool:
        return self._noticed.is_set()

    @property
    def notice_source(self) -> str | None:
        return self._notice_source

    def _record(self, source: str) -> bool:
        """Remember the first notice; True if this was it."""
        with self._lock:
            if self._noticed.is_set():
                return False
            self._notice_at = self._clock()
            self._notice_source = source
            self._noticed.set()
            return True

    def _announce_once(self) -> None:
        with self._lock:
            if self._announced or not self._noticed.is_set():
                return
            self._announced = True
            at, source = self._notice_at, self._notice_source
        with contextlib.suppress(Exception):  # a closed stdout must not kill the watcher
            self._announce("notice", worker=self._worker, source=source, t=at)

    # --- lifecycle --------------------------------------------------------------------------------

    def install(self) -> PreemptionWatch:
        """Catch SIGTERM (main thread only; Python's rule) and start polling the metadata server."""
        if threading.current_thread() is threading.main_thread():
            self._previous_handler = signal.signal(signal.SIGTERM, self._on_sigterm)
            self._handler_installed = True
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="tpuctl-preemption", daemon=True)
            self._thread.start()
        return self

    def attach(self) -> str:
        """Choose how hosts agree, once ``jax.distributed`` is up (or known not to be). Returns the mode.

        JAX's preemption sync manager installs its own SIGTERM handler when the distributed client
        starts, replacing ours: from then on SIGTERM goes to JAX, and so must our other notices.
        """
        from jax._src import distributed

        state = distributed.global_state
        if state.client is None or getattr(state, "num_processes", 1) == 1:
            # One process has no one to agree with. Its own flag is the answer, and it must be ours:
            # JAX's sync point for a lone process was seen in CI (2 cores, loaded) to keep answering
            # False after its notifier had logged the SIGTERM, until the host was killed: a budget stop
            # with no checkpoint. So take SIGTERM back from JAX's handler.
            self._mode = "local"
            if state.client is not None and threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, self._on_sigterm)
        elif getattr(state, "preemption_sync_manager", None) is not None:
            self._mode = "jax"
            if self._noticed.is_set():
                # The notice came before JAX listened: tell it now, as the signal it waits for.
                os.kill(os.getpid(), signal.SIGTERM)
        else:
            # No sync manager: our handler is still the one in force (re-install it to be sure).
            self._mode = "allgather"
            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, self._on_sigterm)
        return self._mode

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self._client is not None:
            self._client.close()
        if (
            self._handler_installed
            and self._mode != "jax"
            and (threading.current_thread() is threading.main_thread())
        ):
            signal.signal(signal.SIGTERM, self._previous_handler or signal.SIG_DFL)
            self._handler_installed = False

    # --- the notices ------------------------------------------------------------------------------

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        # Only flip state here: printing from a signal handler can re-enter a buffered write.
        self._record("sigterm")

    def notify(self, source: str) -> None:
        """A notice from elsewhere (the metadata server, or a test): stop at the next agreed step."""
        if not self._record(source):
            return
        if self._mode == "jax":
            os.kill(os.getpid(), signal.SIGTERM)  # JAX's notifier listens for exactly this

    def _loop(self) -> None:
        while not self._stop.wait(self._poll_s):
            self._announce_once()  # a SIGTERM caught by our handler is said here, off the handler
            if self._client is None or self._noticed.is_set():
                continue
            try:
                if self._client.preempted():
                    self.notify("metadata")
                    self._announce_once()
            except (OSError, http.client.HTTPException) as exc:
                # One failed poll is not a preemption; the next one asks again.
                self.poll_errors += 1
                if self.poll_errors in (1, 10, 100):
                    log.warning("metadata server poll failed (%s); will keep trying", exc)

    # --- the decision -----------------------------------------------------------------------------

    def should_stop(self, step: int) -> bool:
        """Call after every step on every host, with the number of completed steps. True on every host
        at the same step once any host got a notice: save a checkpoint there and exit."""
        if self._mode == "jax":
            from jax.experimental import multihost_utils

            stop = bool(multihost_utils.reached_preemption_sync_point(step))
            if stop:
                self._record("sigterm")  # JAX saw a SIGTERM we could not (its handler replaced ours)
                self._announce_once()
            return stop
        if self._mode == "allgather":
            import numpy as np
            from jax.experimental import multihost_utils

            flags = multihost_utils.process_allgather(np.asarray(self._noticed.is_set(), dtype=np.int32))
            return bool(np.any(flags))
        return self._noticed.is_set()


def exit_preempted(step: int, *, saved: bool, save_s: float | None = None, say: bool = True) -> int:
    """The exit status after stopping for a preemption at ``step``; with ``say`` (one host, usually
    process 0), print the event that tells the supervisor where the checkpoint is."""
    if say:
        emit(
            "preempted",
            step=step,
            checkpoint="saved" if saved else "none",
            save_s=None if save_s is None else round(save_s, 4),
        )
        sys.stdout.flush()
    return PREEMPTED_EXIT_CODE


__all__ = [
    "EVENT_PREFIX",
    "PREEMPTED_EXIT_CODE",
    "MetadataClient",
    "PreemptionWatch",
    "emit",
    "exit_preempted",
    "parse_event",
]
