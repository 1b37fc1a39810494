"""Preemption notices on a host, turned into one checkpoint at the same step on every host.

A spot/preemptible TPU VM learns of its preemption two ways: SIGTERM (the guest's soft-off), and the
metadata server's ``instance/preempted`` turning ``TRUE``; a host about to be taken for maintenance sees
``instance/maintenance-event`` turn ``TERMINATE_ON_HOST_MAINTENANCE``. Any may come first, on any one
host. A maintenance notice is not a preemption (Google may restart the VM where it was:
docs/preemption.md#host-maintenance), so it is said as its own event, ``maintenance``; the VM stops all the
same, so the program stops at a step and checkpoints as it does for a preemption. A
``MIGRATE_ON_HOST_MAINTENANCE`` value (a TPU VM cannot live-migrate, so it should never come) is said and
not acted on. :class:`PreemptionWatch` listens to all three (the metadata keys long-polled with
``wait_for_change``, the server found as google-auth finds it: ``GCE_METADATA_HOST``, else
``metadata.google.internal``; the same code on Google and on the simulator) and answers one question at
every step boundary, the same way on every host: "stop here?" (``should_stop(step)``).

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

tpuctl's follower on every host (``tpuctl/hosts/follow.py``) watches the same metadata keys with
:func:`wait_for_notice` for every program, and writes its own ``notice`` or ``maintenance`` line
(``"reporter": "follower"``): a program that does not use this module, or whose SIGTERM JAX's notifier
caught, still has its preemption (or its host's maintenance) on the record.

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
import socket
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)

#: Exit status meaning "preempted; a checkpoint was saved" (EX_TEMPFAIL: try again later).
PREEMPTED_EXIT_CODE = 75
#: The prefix of every line the runtime prints for the supervisor.
EVENT_PREFIX = "TPUCTL_EVENT "
#: Seconds between the watcher's ticks: how soon a SIGTERM is announced, and the first retry delay of
#: a failed metadata request (the metadata keys themselves are long-polled, not ticked).
POLL_ENV = "TPUCTL_PREEMPTION_POLL_S"
DEFAULT_POLL_S = 0.5
#: How long the metadata server may hold one long poll (its ``timeout_sec``).
DEFAULT_WAIT_S = 60
PREEMPTED_PATH = "instance/preempted"
MAINTENANCE_PATH = "instance/maintenance-event"
_METADATA_ROOT = "/computeMetadata/v1/"
_MAX_RETRY_S = 5.0


#: What ``instance/maintenance-event`` says when no maintenance is coming.
NO_MAINTENANCE = "NONE"


def _preempted(value: str) -> bool:
    return value.strip().upper() == "TRUE"


def _maintenance(value: str) -> bool:
    # NONE, MIGRATE_ON_HOST_MAINTENANCE or TERMINATE_ON_HOST_MAINTENANCE (as TensorFlow's GCE failure
    # handler reads it; docs/google-facts.md#host-maintenance): anything but NONE is news worth saying.
    return value.strip().upper() not in ("", NO_MAINTENANCE)


def ends_the_vm(maintenance_value: str) -> bool:
    """Whether a maintenance-event value stops the VM: TERMINATE does; a TPU VM cannot live-migrate, so
    a MIGRATE value (which should never come) leaves it running."""
    return maintenance_value.strip().upper().startswith("TERMINATE")


@dataclass(frozen=True)
class WatchedKey:
    """A metadata key watched for news: its path, whether a value is news, and the event that says it
    (``notice``: the VM is preempted; ``maintenance``: its host is about to be maintained)."""

    path: str
    is_news: Callable[[str], bool]
    event: str
    source: str


#: The metadata keys watched, on every host, by the follower and the runtime alike.
WATCHED_KEYS: tuple[WatchedKey, ...] = (
    WatchedKey(PREEMPTED_PATH, _preempted, "notice", "metadata"),
    WatchedKey(MAINTENANCE_PATH, _maintenance, "maintenance", "metadata"),
)


def event_line(event: str, **fields: Any) -> str:
    """One event line for the supervisor, without its newline."""
    return EVENT_PREFIX + json.dumps({"event": event, **fields}, separators=(",", ":"))


def emit(event: str, **fields: Any) -> None:
    """Print one event line for the supervisor (flushed: it reads host output line by line)."""
    print(event_line(event, **fields), flush=True)


def parse_event(line: str) -> dict[str, Any] | None:
    """The event of a ``TPUCTL_EVENT`` line, or None for any other line (or a mangled one)."""
    if not line.startswith(EVENT_PREFIX):
        return None
    try:
        data = json.loads(line[len(EVENT_PREFIX) :])
    except ValueError:
        return None
    return data if isinstance(data, dict) and isinstance(data.get("event"), str) else None


@dataclass(frozen=True)
class MetadataValue:
    """One answer of the metadata server: the value's text and its ETag (None if the server sent none)."""

    text: str
    etag: str | None


class MetadataClient:
    """GETs under ``/computeMetadata/v1/`` of one metadata server, on one kept-alive connection.

    ``host`` is "host[:port]" as in ``GCE_METADATA_HOST`` (default: :func:`hostenv.metadata_host`, i.e.
    that variable, else ``GCE_METADATA_IP``, else ``metadata.google.internal``). Not thread-safe: one
    client per thread; :meth:`abort` is the one method another thread may call.
    """

    def __init__(self, host: str | None = None, *, timeout_s: float = 2.0) -> None:
        from tpuctl.runtime import hostenv

        raw = host or hostenv.metadata_host()
        parsed = urllib.parse.urlsplit(raw if "://" in raw else "http://" + raw)
        if parsed.scheme != "http" or not parsed.hostname or parsed.path.strip("/"):
            raise ValueError(f"metadata host must be host[:port] (as GCE_METADATA_HOST), got {raw!r}")
        self.host = parsed.netloc
        self._hostname = parsed.hostname
        self._port = parsed.port or 80
        self._timeout_s = timeout_s
        self._conn: http.client.HTTPConnection | None = None

    def get(
        self, path: str, *, wait_for_change: bool = False, last_etag: str | None = None, timeout_sec: int = 60
    ) -> MetadataValue:
        """The value at ``path`` (relative to ``/computeMetadata/v1/``), sent with ``Metadata-Flavor``.

        With ``wait_for_change`` the server holds the request until the value's ETag differs from
        ``last_etag`` (at once if it already does) or ``timeout_sec`` passes, then answers the current
        value; this is Google's long poll:
        https://cloud.google.com/compute/docs/metadata/querying-metadata#waitforchange
        Raises OSError/HTTPException when the server cannot be asked or answers other than 200.
        """
        query = {}
        if wait_for_change:
            query = {"wait_for_change": "true", "timeout_sec": str(timeout_sec)}
            if last_etag:
                query["last_etag"] = last_etag
        url = _METADATA_ROOT + path.lstrip("/")
        if query:
            url += "?" + urllib.parse.urlencode(query)
        # A long poll may legitimately take timeout_sec; only silence beyond that is a dead server.
        timeout = self._timeout_s + (timeout_sec if wait_for_change else 0)
        conn = self._connection(timeout)
        try:
            conn.request("GET", url, headers={"Metadata-Flavor": "Google"})
            response = conn.getresponse()
            body = response.read().decode("utf-8", "replace")
        except (OSError, http.client.HTTPException):
            self.close()  # a fresh connection next time
            raise
        if response.status != 200:
            raise http.client.HTTPException(f"metadata server answered {response.status} for {path}")
        return MetadataValue(body, response.getheader("ETag"))

    def preempted(self) -> bool:
        """True once ``instance/preempted`` says TRUE (one plain GET)."""
        return self.get(PREEMPTED_PATH).text.strip().upper() == "TRUE"

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        if self._conn is None:
            self._conn = http.client.HTTPConnection(self._hostname, self._port, timeout=timeout)
        self._conn.timeout = timeout
        if self._conn.sock is not None:
            self._conn.sock.settimeout(timeout)
        return self._conn

    def abort(self) -> None:
        """Unblock a request in flight on another thread (it then raises OSError)."""
        conn = self._conn
        sock = conn.sock if conn is not None else None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class PreemptionWatch:
    """SIGTERM, the metadata server's preemption flag and a maintenance notice that ends the VM ->
    ``should_stop(step)`` at step boundaries.

    ``install()`` before ``jax.distributed.initialize()`` (a SIGTERM that arrives during start-up is
    kept); ``attach()`` right after it (switches to JAX's sync point and hands it a notice that came
    early); ``should_stop(step)`` after every step, on every host; ``close()`` at the end.
    """

    def __init__(
        self,
        metadata_host: str | None,
        *,
        poll_s: float = DEFAULT_POLL_S,
        wait_s: int = DEFAULT_WAIT_S,
        worker: int = 0,
        clock: Callable[[], float] = time.time,
        announce: Callable[..., None] = emit,
    ) -> None:
        """``metadata_host``: "host[:port]" of the metadata server, or None to watch SIGTERM only."""
        self._metadata_host = metadata_host
        if metadata_host is not None:
            MetadataClient(metadata_host)  # a malformed host fails here, not in a thread
        self._poll_s = max(0.05, poll_s)
        self._wait_s = max(1, wait_s)
        self._worker = worker
        self._clock = clock
        self._announce = announce
        self._noticed = threading.Event()
        self._notice_at: float | None = None
        self._notice_source: str | None = None
        self._announced = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._clients: list[MetadataClient] = []
        self._previous_handler: Any = None
        self._handler_installed = False
        self._mode = "local"  # local | jax | allgather
        self.poll_errors = 0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> PreemptionWatch:
        """From the worker environment, on every backend: the metadata server is ``GCE_METADATA_HOST``
        (else ``GCE_METADATA_IP``, else ``metadata.google.internal``), watched when one of those
        variables is set or tpuctl launched the program (``TPUCTL_RUN_ID``); a plain run on a laptop
        watches SIGTERM only (polling metadata.google.internal there would only fail)."""
        from tpuctl.runtime import hostenv

        e = os.environ if env is None else env
        watched = bool(e.get(hostenv.METADATA_HOST) or e.get(hostenv.METADATA_IP) or e.get(hostenv.RUN_ID))
        try:
            poll_s = float(e.get(POLL_ENV, "") or DEFAULT_POLL_S)
        except ValueError:
            poll_s = DEFAULT_POLL_S
        worker = int(e.get(hostenv.WORKER_ID, "0") or 0)
        return cls(hostenv.metadata_host(e) if watched else None, poll_s=poll_s, worker=worker)

    @property
    def metadata_host(self) -> str | None:
        return self._metadata_host

    # --- state ------------------------------------------------------------------------------------

    @property
    def mode(self) -> str:
        return self._mode

    @property
    def noticed(self) -> bool:
        return self._noticed.is_set()

    @property
    def notice_source(self) -> str | None:
        """What stopped the program: ``sigterm``, ``metadata`` (preempted) or ``maintenance``."""
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
        """Say the preemption notice once (a maintenance notice was said as it came, as its own event)."""
        with self._lock:
            if self._announced or not self._noticed.is_set() or self._notice_source == "maintenance":
                return
            self._announced = True
            at, source = self._notice_at, self._notice_source
        with contextlib.suppress(Exception):  # a closed stdout must not kill the watcher
            self._announce("notice", worker=self._worker, source=source, t=at)

    # --- lifecycle --------------------------------------------------------------------------------

    def install(self) -> PreemptionWatch:
        """Catch SIGTERM (main thread only; Python's rule) and start watching the metadata server."""
        if threading.current_thread() is threading.main_thread():
            self._previous_handler = signal.signal(signal.SIGTERM, self._on_sigterm)
            self._handler_installed = True
        if self._threads:
            return self
        self._spawn("tpuctl-preemption", self._loop)
        if self._metadata_host is not None:
            for key in WATCHED_KEYS:
                client = MetadataClient(self._metadata_host)
                self._clients.append(client)
                self._spawn(f"tpuctl-watch-{key.path}", self._watch, client, key)
        return self

    def _spawn(self, name: str, target: Callable[..., None], *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

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
        """Stop watching (a long poll in flight is cut, not waited for) and put SIGTERM back."""
        self._stop.set()
        for client in self._clients:
            client.abort()
        for thread in self._threads:
            thread.join(timeout=5)
        self._threads = []
        for client in self._clients:
            client.close()
        self._clients = []
        if (
            self._handler_installed
            and self._mode != "jax"
            and (threading.current_thread() is threading.main_thread())
        ):
            # Put back only our own: ``exit_preempted`` ignores SIGTERM on the way out, and that stays.
            if signal.getsignal(signal.SIGTERM) == self._on_sigterm:
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
        # A SIGTERM caught by our handler is said here, off the handler.
        while not self._stop.wait(self._poll_s):
            self._announce_once()

    def _watch(self, client: MetadataClient, key: WatchedKey) -> None:
        """Long-poll one key until it ends the VM (or the watch closes, or another notice came). Each
        new maintenance value is said as it comes; only one that ends the VM stops the program."""
        last: str | None = None
        while True:
            seen = last

            def news(value: str, seen: str | None = seen) -> bool:
                return key.is_news(value) and value.strip() != seen

            value = wait_for_notice(
                client,
                key.path,
                news,
                done=lambda: self._stop.is_set() or self._noticed.is_set(),
                pause=self._stop.wait,
                poll_s=self._poll_s,
                wait_s=self._wait_s,
                on_error=self._poll_failed,
            )
            if value is None:
                return
            last = value.strip()
            if key.event == "maintenance":
                with contextlib.suppress(Exception):  # a closed stdout must not kill the watcher
                    self._announce("maintenance", worker=self._worker, value=last, t=self._clock())
                if not ends_the_vm(last):
                    continue
                self.notify("maintenance")
                return
            self.notify(key.source)
            self._announce_once()
            return

    def _poll_failed(self, path: str, exc: BaseException) -> None:
        with self._lock:
            self.poll_errors += 1
            count = self.poll_errors
        if count in (1, 10, 100):
            log.warning("metadata server request for %s failed (%s); will keep trying", path, exc)

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


def wait_for_notice(
    client: MetadataClient,
    path: str,
    is_notice: Callable[[str], bool],
    *,
    done: Callable[[], bool],
    pause: Callable[[float], object],
    poll_s: float = DEFAULT_POLL_S,
    wait_s: int = DEFAULT_WAIT_S,
    on_error: Callable[[str, BaseException], None] | None = None,
) -> str | None:
    """Long-poll ``path`` until its value is a notice (that value) or ``done()`` (None).

    The first GET is plain (the value now and its ETag); each next one waits for a change from that
    ETag, so a change between two requests is never missed. A server that sends no ETag cannot be
    long-polled safely: it is polled every ``poll_s`` instead. A failed request is not a notice: it is
    told to ``on_error`` and asked again, backing off to ``_MAX_RETRY_S``. ``pause(s)`` waits (an
    Event's ``wait``, so that closing cuts the wait short).
    """
    etag: str | None = None
    failures = 0
    while not done():
        try:
            value = client.get(path, wait_for_change=etag is not None, last_etag=etag, timeout_sec=wait_s)
        except (OSError, http.client.HTTPException) as exc:
            if done():
                return None
            failures += 1
            if on_error is not None:
                on_error(path, exc)
            pause(min(poll_s * 2 ** min(failures - 1, 8), _MAX_RETRY_S))
            etag = None
            continue
        failures = 0
        if is_notice(value.text):
            return value.text
        etag = value.etag
        if etag is None:
            pause(poll_s)
    return None


def exit_preempted(
    step: int, *, saved: bool, save_s: float | None = None, say: bool = True, reason: str | None = None
) -> int:
    """The exit status after stopping for a preemption (or a host maintenance) at ``step``; with ``say``
    (one host, usually process 0), print the event that tells the supervisor where the checkpoint is.
    ``reason``: what stopped it (``PreemptionWatch.notice_source``: ``maintenance`` for a host's).

    From here on SIGTERM is ignored (main thread only, Python's rule): the program is on its way out,
    and the VM's shutdown keeps sending SIGTERM after the notice it acted on. While Python finalizes it
    puts back the default disposition of every signal it had a handler for, so a late SIGTERM would kill
    the program in its last moments and turn a clean stop into "killed by SIGTERM"; an ignored signal
    stays ignored. The shutdown's SIGKILL still ends a program that does not leave."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if say:
        emit(
            "preempted",
            step=step,
            checkpoint="saved" if saved else "none",
            save_s=None if save_s is None else round(save_s, 4),
            reason=reason,
        )
        sys.stdout.flush()
    return PREEMPTED_EXIT_CODE


__all__ = [
    "EVENT_PREFIX",
    "MAINTENANCE_PATH",
    "NO_MAINTENANCE",
    "PREEMPTED_EXIT_CODE",
    "PREEMPTED_PATH",
    "MetadataClient",
    "MetadataValue",
    "PreemptionWatch",
    "WatchedKey",
    "emit",
    "ends_the_vm",
    "event_line",
    "exit_preempted",
    "parse_event",
    "wait_for_notice",
]
