"""The backstop's host side: a deadman on host 0 of a run's slice that deletes the slice itself once the
run is over (or past its deadline) and no supervisor has checked in for a grace period.

Why: deleting a finished run's slice, ``--budget`` and ``--max-hours`` are all the supervisor's work, and a
supervisor on a laptop that sleeps or goes offline does none of it while the slice bills. The deadman needs
no tpuctl process anywhere: it runs on the slice itself and calls the cloud API with the VM's own
service-account token from the metadata server (docs/architecture.md, "The backstop").

Runs with the image's stock ``python3`` (>= 3.10), standard library only, as a script tpuctl writes next
to its state (it is not shipped in the bundle: it must outlive every attempt's bundle). The run's
directory on the host is ``<remote_root>/runs/<run_id>``, each attempt's ``<attempt>/{pid,supervisor,exit}``
as ``follow.py`` lays it out; the deadman's own, ``DIR``, holds::

    deadman.py    this script
    config.json   what to watch and what to delete (rewritten at every arm)
    checkin       its modification time is the supervisor's last check-in (the host's own clock)
    deadman.pid   the running deadman's pid
    log           what it saw and did, one line each
    fired.json    once it deleted: why, and when

``deadman.py arm DIR CONFIG_JSON`` writes the config, counts as a check-in, and starts the deadman
detached (a session of its own, stdio on /dev/null: the SSH session that armed it ends at once) unless
one already watches DIR; it prints ``deadman PID``. The config (JSON) has ``grace_s``, ``deadline_at``
(epoch seconds or null), ``runs_dir``, ``delete`` (the requests that delete the slice, in order: each
``{"method", "url"}``) and optionally ``poll_s`` and ``metadata_host``.

The rule: the deadman deletes when no check-in came for ``grace_s`` and either no program of the run is
running (none started yet, or the newest attempt ended or lost its supervisor) or the deadline passed.
Each delete carries the reason in ``X-Goog-Request-Reason`` (Google's system parameter for audit logs).
A refused delete is logged with the permission it needs and tried again with a backoff; a deletion the
cloud accepted is tried again only if the slice is still there well after it (the VM goes with it).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NoReturn

CONFIG = "config.json"
CHECKIN = "checkin"
PID = "deadman.pid"
LOG = "log"
FIRED = "fired.json"
SCRIPT = "deadman.py"
#: The header Google's APIs take a request's reason in, for the audit log (system parameters).
REASON_HEADER = "X-Goog-Request-Reason"
_TOKEN_PATH = "/computeMetadata/v1/instance/service-accounts/default/token"
_HTTP_TIMEOUT_S = 30.0
_BACKOFF_FIRST_S = 5.0
_BACKOFF_MAX_S = 300.0
#: After the cloud accepted the deletion, how long before the deadman asks again (the VM is going).
_AFTER_ACCEPTED_S = 120.0
#: What a refused deletion needs, by API (docs/google-facts.md#backstop).
_PERMISSION_HINT = {
    "tpu.googleapis.com": "tpu.nodes.delete (roles/tpu.admin)",
    "compute": "compute.instances.delete / compute.instanceGroupManagers.delete "
    "(roles/compute.instanceAdmin.v1)",
}


@dataclass(frozen=True)
class Config:
    """What one deadman watches and deletes (``config.json``, rewritten at every arm)."""

    grace_s: float
    deadline_at: float | None
    runs_dir: str
    delete: tuple[tuple[str, str], ...]  # (method, url), in order
    metadata_host: str
    poll_s: float

    @classmethod
    def of(cls, data: Mapping[str, object]) -> Config:
        """From the JSON; raises KeyError, TypeError or ValueError for a malformed one."""
        grace = float(str(data["grace_s"]))
        deadline = data.get("deadline_at")
        raw = data.get("delete")
        delete = tuple((str(d["method"]), str(d["url"])) for d in raw) if isinstance(raw, list) else ()
        poll = data.get("poll_s")
        return cls(
            grace_s=grace,
            deadline_at=None if deadline is None else float(str(deadline)),
            runs_dir=str(data["runs_dir"]),
            delete=delete,
            metadata_host=str(data.get("metadata_host") or _metadata_host(os.environ)),
            poll_s=float(str(poll)) if poll is not None else min(5.0, max(0.2, grace / 10)),
        )


@dataclass(frozen=True)
class Program:
    """Whether a program of the run runs on this host now, and what to say about it."""

    running: bool
    what: str


def program_state(runs_dir: str) -> Program:
    """The newest attempt's program (``follow.py``'s layout): running while its supervisor lives and it
    has no exit status; otherwise ended, lost, or never started."""
    try:
        attempts = [int(name) for name in os.listdir(runs_dir) if name.isdigit()]
    except OSError:
        attempts = []
    if not attempts:
        return Program(False, "no program of the run was started")
    newest = max(attempts)
    directory = os.path.join(runs_dir, str(newest))
    code = _read_int(os.path.join(directory, "exit"))
    if code is not None:
        return Program(False, f"the program ended (attempt {newest}, exit {code})")
    supervisor = _read_int(os.path.join(directory, "supervisor"))
    if supervisor is None:
        return Program(False, f"the program of attempt {newest} never started")
    if not _alive(supervisor):
        return Program(False, f"the program of attempt {newest} was lost (its supervisor is gone)")
    return Program(True, f"the program of attempt {newest} runs")


def verdict(
    now: float, last_checkin: float, program: Program, deadline_at: float | None, grace_s: float
) -> str | None:
    """Why the slice must go now, or None while it may stay."""
    silent = now - last_checkin
    if silent < grace_s:
        return None
    past_deadline = deadline_at is not None and now >= deadline_at
    if program.running and not past_deadline:
        return None
    why = program.what if not past_deadline else f"the run's deadline {_iso(deadline_at or now)} passed"
    return f"{why}, and no supervisor checked in for {silent:.0f} s (grace {grace_s:g} s)"


# --- deleting ------------------------------------------------------------------------------------------


def access_token(metadata_host: str) -> str:
    """The VM's service-account token, from its metadata server."""
    request = urllib.request.Request(
        f"http://{metadata_host}{_TOKEN_PATH}", headers={"Metadata-Flavor": "Google"}
    )
    with urllib.request.urlopen(request, timeout=_HTTP_TIMEOUT_S) as response:
        return str(json.loads(response.read().decode())["access_token"])


def delete_slice(config: Config, reason: str, log: Callable[[str], None]) -> bool:
    """Send every delete of ``config`` in order with the VM's token; True once each was accepted (or
    found the resource gone). A refusal is logged and ends the round."""
    try:
        token = access_token(config.metadata_host)
    except (OSError, ValueError, KeyError) as exc:
        log(f"no token from the metadata server: {exc}")
        return False
    for method, url in config.delete:
        headers = {"Authorization": f"Bearer {token}", REASON_HEADER: _header_text(reason)}
        status, text = _send(method, url, headers)
        if status == 404 or 200 <= status < 300:
            log(f"{method} {url}: {'already gone' if status == 404 else 'accepted'} (HTTP {status})")
            continue
        hint = ""
        if status == 403:
            needed = _PERMISSION_HINT["compute" if "/compute/" in url else "tpu.googleapis.com"]
            hint = f"; the hosts' service account needs {needed}"
        log(f"{method} {url}: refused (HTTP {status}){hint}: {text[:300]}")
        return False
    return True


def _send(method: str, url: str, headers: dict[str, str]) -> tuple[int, str]:
    request = urllib.request.Request(url, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=_HTTP_TIMEOUT_S) as response:
            return int(response.status), response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode("utf-8", "replace")
    except OSError as exc:  # no route, refused, timed out: an answer of no status
        return 0, f"{type(exc).__name__}: {exc}"


def _header_text(text: str) -> str:
    """A header value: printable ASCII on one line."""
    return "".join(c if 32 <= ord(c) < 127 else "?" for c in text)[:512]


# --- watching ------------------------------------------------------------------------------------------


class _Log:
    """Appends timestamped lines to the deadman's log."""

    def __init__(self, path: str) -> None:
        self._path = path

    def __call__(self, text: str) -> None:
        with open(self._path, "a", encoding="utf-8") as fh:
            fh.write(f"{_iso(time.time())} {text}\n")


def watch(directory: str, *, once: bool = False) -> None:
    """The deadman's loop (see the module docstring); ``once``: one look (tests)."""
    log = _Log(os.path.join(directory, LOG))
    next_try, backoff = 0.0, _BACKOFF_FIRST_S
    while True:
        config = _config(directory)
        if config is None:
            return  # the run's directory is gone (the disk was wiped): nothing left to guard
        now = time.time()
        reason = verdict(
            now,
            _mtime(os.path.join(directory, CHECKIN)) or now,
            program_state(config.runs_dir),
            config.deadline_at,
            config.grace_s,
        )
        if reason is None:
            next_try, backoff = 0.0, _BACKOFF_FIRST_S
        elif now >= next_try:
            fired = os.path.join(directory, FIRED)
            if not os.path.exists(fired):
                _write_atomic(fired, json.dumps({"at": now, "reason": reason}) + "\n")
            log(f"deleting the slice: {reason}")
            if delete_slice(config, reason, log):
                next_try = now + max(_AFTER_ACCEPTED_S, config.grace_s)
            else:
                next_try, backoff = now + backoff, min(backoff * 2, _BACKOFF_MAX_S)
        if once:
            return
        time.sleep(config.poll_s)


def arm(directory: str, config_text: str) -> int:
    """Write the config, check in, and start the deadman unless one watches ``directory``."""
    directory = os.path.abspath(directory)
    os.makedirs(directory, exist_ok=True)
    config = json.loads(config_text)
    config["runs_dir"] = os.path.abspath(str(config["runs_dir"]))
    config.setdefault("metadata_host", _metadata_host(os.environ))
    Config.of(config)  # a malformed config is refused here, not found by a detached process later
    _write_atomic(os.path.join(directory, CONFIG), json.dumps(config, sort_keys=True) + "\n")
    checkin(directory)
    running = _running_pid(directory)
    if running is not None:
        print(f"deadman {running}", flush=True)
        return 0
    read_fd, write_fd = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(read_fd)
        os.setsid()  # out of the SSH session: its hangup reaches nothing here
        if os.fork() != 0:
            os._exit(0)  # the session leader goes; its child can never take a terminal back
        _detached(directory, write_fd)
    os.close(write_fd)
    os.waitpid(child, 0)
    with os.fdopen(read_fd, "rb") as pipe:
        started = pipe.read().decode("ascii", "replace").strip()
    if not started.isdigit():
        print(f"deadman: did not start: {started}", file=sys.stderr)
        return 1
    print(f"deadman {started}", flush=True)
    return 0


def _detached(directory: str, report_fd: int) -> NoReturn:
    code = 1
    try:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        os.chdir("/")
        _write_atomic(os.path.join(directory, PID), f"{os.getpid()}\n")
        os.write(report_fd, str(os.getpid()).encode("ascii"))
        os.close(report_fd)
        _Log(os.path.join(directory, LOG))(f"deadman {os.getpid()} watching")
        watch(directory)
        code = 0
    finally:
        os._exit(code)


def checkin(directory: str) -> None:
    """A check-in: the file's modification time becomes now (on the host's clock)."""
    path = os.path.join(directory, CHECKIN)
    with open(path, "a", encoding="ascii"):
        pass
    os.utime(path)


# --- small helpers -------------------------------------------------------------------------------------


def _config(directory: str) -> Config | None:
    try:
        with open(os.path.join(directory, CONFIG), encoding="utf-8") as fh:
            return Config.of(json.load(fh))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _running_pid(directory: str) -> int | None:
    """The pid of a live deadman of ``directory`` (its command line names this script), else None."""
    pid = _read_int(os.path.join(directory, PID))
    if pid is None or not _alive(pid):
        return None
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            words = fh.read().split(b"\0")
    except OSError:
        return pid  # no /proc: kill(0) said it lives
    return pid if any(w.endswith(SCRIPT.encode()) for w in words) else None


def _metadata_host(environ: Mapping[str, str]) -> str:
    """The metadata server's "host[:port]" as google-auth finds it."""
    return environ.get("GCE_METADATA_HOST") or environ.get("GCE_METADATA_IP") or "metadata.google.internal"


def _write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)


def _read_int(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return None


def _mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            return fh.read().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def main(args: list[str]) -> int:
    """``arm DIR CONFIG_JSON`` (see the module docstring)."""
    if len(args) == 3 and args[0] == "arm":
        try:
            return arm(args[1], args[2])
        except (ValueError, KeyError, TypeError) as exc:
            print(f"deadman: bad config: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 2
    print("usage: deadman.py arm DIR CONFIG_JSON", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
