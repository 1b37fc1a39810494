"""The host side of a detached program: launch it, then follow its output file from any SSH session.

Runs on the host with the image's stock ``python3`` (>= 3.10), standard library only, and imports nothing
of tpuctl but stdlib-only modules the bundle always carries (its sibling ``worker_identity``, and the
runtime's ``preemption`` and ``hostenv`` for the notice): the SSH executor runs it as a script out of the
shipped bundle (``python3 -I <bundle>/tpuctl/hosts/follow.py ...``; ``-I`` so neither PYTHONPATH nor the
user's files in the bundle can shadow the standard library it uses).

A run directory (``<remote_root>/runs/<run_id>/<attempt>``) holds::

    out          the program's stdout and stderr, appended, never truncated
    supervisor   the pid of the supervisor that waits for the program
    pid          the program's pid, which is also its process group id (written once it leads a session)
    exit         its exit status, written atomically once it ended: N, or -SIG when a signal killed it

``launch DIR --cwd D [--env K=V]... [--env-stdin] [--tpu-worker-env] [--tail] -- ARGV...`` starts ARGV in
a session of its own (stdin /dev/null, stdout+stderr to ``out``) under a supervisor that is itself a
session leader, so nothing of it belongs to the SSH session that launched it (sshd's hangup of that
session reaches neither).
It prints ``pid N`` once the pid file exists and exits 0; it refuses (exit 2) a directory that already has
a pid file. With ``--tail`` it prints ``pid N`` on stderr instead and goes on as ``tail DIR 0`` in the same
process and session (one SSH session and one Python start per host instead of two: on a large slice the
start-up burst is made of these). The program's environment is this process's (the host's login
environment) plus the ``--env`` pairs and, with ``--env-stdin``, the ``NAME=VALUE`` records read from
stdin up to EOF, each ended by a NUL (how tpuctl passes the user's values, secrets among them: a process's
argv is world-readable on the host for as long as it runs, its stdin is not, and nothing is written to
disk); a relative ARGV[0] with a slash is resolved against the launching directory, before the chdir to
``--cwd``. ``--tpu-worker-env`` (Compute Engine slices) adds this host's
``TPU_WORKER_ID`` and ``TPU_WORKER_HOSTNAMES``, read from its metadata server (see ``worker_identity``),
and refuses (exit 2, starting nothing) when they cannot be read.

While the program runs, its supervisor also watches this host's metadata server for the notice that the
VM is preempted (``instance/preempted`` TRUE) and for its host's maintenance (``instance/maintenance-event``
other than NONE), for every program, whether or not it uses tpuctl's runtime: a program that catches
SIGTERM (JAX's preemption notifier does, for every ``jax.distributed.initialize()``) or ignores it must not
make the notice vanish. The preemption notice becomes one line in ``out``, ``TPUCTL_EVENT {"event":
"notice", "source": "metadata", "t": <host time>, "worker": <TPUCTL_WORKER_ID>, "reporter": "follower"}``;
each new maintenance value one line ``{"event": "maintenance", "value": "TERMINATE_ON_HOST_MAINTENANCE",
...}`` (a maintenance is not a preemption: Google may restart the VM where it was, and tpuctl's supervisor
acts on each differently). Each is on a line of its own (written with a newline before and after it, so
that neither it nor a line the program is half way through is ever cut) and never after the exit status is
written. Once the program ended, unless by SIGKILL, each key is read once more before that status: the
notice comes with the soft-off's SIGTERM, which ends a program that keeps SIGTERM's default action before
the long poll's answer to the same change arrives.

``tail DIR OFFSET`` writes the bytes of ``out`` from OFFSET on to stdout as they come, and control lines
to stderr: ``alive`` about every second (so a silent program still shows the connection is up, and a
tail whose connection is gone hits a broken pipe and ends), then ``exit N`` after the last byte once the
program ended, or ``lost <why>`` when the supervisor is gone without writing an exit status. Exit 0
after a control line; 2 when DIR is not a launched run directory.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

# Not ``from typing import TYPE_CHECKING``: the follower starts on every host, and typing costs ~6 ms.
TYPE_CHECKING = False

if TYPE_CHECKING:
    from tpuctl.runtime.preemption import MetadataClient, WatchedKey

OUT = "out"
PID = "pid"
EXIT = "exit"
SUPERVISOR = "supervisor"
HEARTBEAT_S = 1.0
_POLL_S = 0.05
#: How long the last look at the metadata server, once the program ended, may hold up its exit status
#: (a VM's metadata server answers in milliseconds; one that does not is not waited for).
LAST_LOOK_TIMEOUT_S = 1.0


def _write_atomic(path: str, text: str) -> None:
    """``path`` holds ``text`` or does not exist; never a partial write (rename is atomic)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="ascii") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _read_int(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs: a zombie does not (an orphan waits for a reaper that may be slow to come)."""
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
        return True  # no /proc: kill(0) said it exists


def launch(
    directory: str,
    cwd: str,
    env_pairs: list[str],
    argv: list[str],
    *,
    then_tail: bool = False,
    tpu_worker_env: bool = False,
    env_stdin: bool = False,
) -> int:
    """Start ``argv`` detached (see the module docstring); returns the process exit code."""
    directory = os.path.abspath(directory)
    os.makedirs(directory, exist_ok=True)
    if os.path.exists(os.path.join(directory, PID)):
        print(f"follow: {directory} already holds a launched program", file=sys.stderr)
        return 2
    if "/" in argv[0]:
        argv = [os.path.abspath(argv[0]), *argv[1:]]
    env = dict(os.environ)
    for pair in env_pairs:
        name, _, value = pair.partition("=")
        env[name] = value
    if env_stdin:
        env.update(read_env_records(sys.stdin.buffer.read()))
    if tpu_worker_env:
        from tpuctl.hosts import worker_identity

        try:
            env.update(worker_identity.tpu_worker_env(env))
        except worker_identity.WorkerIdentityError as exc:
            print(f"follow: {exc}", file=sys.stderr)
            return 2
    read_fd, write_fd = os.pipe()
    if os.fork() == 0:  # the supervisor
        os.close(read_fd)
        code = 1
        try:
            code = _supervise(directory, os.path.abspath(cwd), env, argv, write_fd)
        finally:
            os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        reply = pipe.read().decode("ascii", "replace").strip()
    if not reply.isdigit():
        print(f"follow: the supervisor did not start the program: {reply}", file=sys.stderr)
        return 1
    if not then_tail:
        print(f"pid {reply}", flush=True)
        return 0
    print(f"pid {reply}", file=sys.stderr, flush=True)
    return tail(directory, 0)


def read_env_records(data: bytes) -> dict[str, str]:
    """``NAME=VALUE\\0`` records (``--env-stdin``) as a dict; a record without ``=`` is skipped."""
    env: dict[str, str] = {}
    for record in data.split(b"\0"):
        name, sep, value = record.decode("utf-8", "surrogateescape").partition("=")
        if sep and name:
            env[name] = value
    return env


def _supervise(directory: str, cwd: str, env: dict[str, str], argv: list[str], report_fd: int) -> int:
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)  # nothing of the SSH session stays open here
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    # A VM's shutdown (a preemption's, a stop's) sends SIGTERM to every process: the supervisor outlives
    # it to record how the program ended (what tpuctl's stop signals is the program's group, not this).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    out = os.open(os.path.join(directory, OUT), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    _write_atomic(os.path.join(directory, SUPERVISOR), f"{os.getpid()}\n")
    ready_r, ready_w = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(ready_r)
        os.setsid()  # its own session and group: pid == pgid, what a stop signals
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # ignored dispositions survive exec
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.write(ready_w, b"s")
        os.close(ready_w)
        try:
            os.chdir(cwd)
            os.execvpe(argv[0], argv, env)
        except OSError as exc:
            os.write(2, f"follow: cannot run {argv[0]!r}: {exc}\n".encode())
        os._exit(127)
    os.close(ready_w)
    os.read(ready_r, 1)  # the child leads its group before anyone is told its pid
    os.close(ready_r)
    _write_atomic(os.path.join(directory, PID), f"{child}\n")
    os.write(report_fd, str(child).encode("ascii"))
    os.close(report_fd)
    notices = NoticeReporter(out, env)
    notices.start()
    _, status = os.waitpid(child, 0)
    if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
        # Not after a SIGKILL: that is the hard-off (or the grace's end), which sets the flag as it
        # kills; a flag read then is no notice the program was given (the watch had any real one).
        notices.last_look()
    notices.close()  # before the exit status: tail reads to EOF once it exists, so nothing may follow
    _write_atomic(os.path.join(directory, EXIT), f"{os.waitstatus_to_exitcode(status)}\n")
    return 0


class NoticeReporter:
    """Watches the host's metadata server for the VM's end and its host's maintenance (see the module
    docstring) and writes each as an event line into the program's output file ``out_fd`` (appending, as
    the program does): the preemption notice once, each new maintenance value once."""

    def __init__(self, out_fd: int, env: dict[str, str]) -> None:
        self._out_fd = out_fd
        self._env = env
        self._lock = threading.Lock()
        self._said: set[tuple[str, str]] = set()  # (event, value) written
        self._closed = threading.Event()  # the program ended: nothing more is written
        self._noticed = threading.Event()  # the preemption notice was written: its watch is over
        self._host: str | None = None  # the metadata server's host[:port], once watched

    def start(self) -> None:
        """One daemon thread per watched key (each holds a long poll; the process exit ends them)."""
        try:
            from tpuctl.runtime import hostenv, preemption

            host = hostenv.metadata_host(self._env)
            clients = [(preemption.MetadataClient(host), key) for key in preemption.WATCHED_KEYS]
        except (ImportError, ValueError):
            return  # no runtime in the bundle, or a malformed GCE_METADATA_HOST: the program runs unwatched
        self._host = host
        for client, key in clients:
            threading.Thread(
                target=self._watch, args=(client, key), name=f"notice-{key.path}", daemon=True
            ).start()

    def _watch(self, client: MetadataClient, key: WatchedKey) -> None:
        from tpuctl.runtime import preemption

        def over() -> bool:
            return self._closed.is_set() or self._noticed.is_set()

        last = ""
        while True:
            seen = last

            def news(value: str, seen: str = seen) -> bool:
                return key.is_news(value) and value.strip() != seen

            # Failed requests are asked again in silence: the output file is the program's, and a host
            # whose metadata server is down says so in other ways.
            value = preemption.wait_for_notice(client, key.path, news, done=over, pause=self._closed.wait)
            if value is None:
                return
            last = value.strip()
            self._say(key, last)
            if key.event != "maintenance":
                return
            # Every new maintenance value is said (a MIGRATE, then a TERMINATE); the watch goes on until
            # the program ends or its VM is preempted.

    def _say(self, key: WatchedKey, value: str) -> None:
        """The line of news ``value`` of ``key``: a maintenance with its value, else the notice."""
        if key.event == "maintenance":
            self.report("maintenance", value=value)
        else:
            self.report(key.event, source=key.source)

    def last_look(self, timeout_s: float = LAST_LOOK_TIMEOUT_S) -> None:
        """Once the program ended: one plain GET of each watched key, and each news said as the watches
        say it. The preemption notice comes with the soft-off's SIGTERM, whose default action ends a
        program at once; the long poll's answer to the same change then loses the race to the program's
        end (the reporter closes before it lands), and tpuctl would take a noticed preemption for a hard
        one. The flag is TRUE by the time the SIGTERM has killed the program, so a fresh read sees it.
        A server that fails or is silent for ``timeout_s`` ends the look (nothing is said of it)."""
        if self._host is None or self._noticed.is_set() or self._closed.is_set():
            return
        import http.client

        from tpuctl.runtime import preemption

        client = preemption.MetadataClient(self._host, timeout_s=timeout_s)
        try:
            for key in preemption.WATCHED_KEYS:
                value = client.get(key.path).text.strip()
                if key.is_news(value):
                    self._say(key, value)
        except (OSError, http.client.HTTPException):
            pass  # as the watches do: a host whose metadata server is down says so in other ways
        finally:
            client.close()

    def report(self, event: str, *, source: str | None = None, value: str | None = None) -> bool:
        """Write one event line (each event and value once, none after ``close``); True if this call
        wrote it. ``notice`` carries its ``source``; ``maintenance`` the key's ``value``."""
        from tpuctl.runtime import hostenv, preemption

        with self._lock:
            said = (event, value or "")
            if self._closed.is_set() or said in self._said:
                return False
            self._said.add(said)
            if event == "notice":
                self._noticed.set()
            worker = self._env.get(hostenv.WORKER_ID, "")
            fields: dict[str, object] = {"source": source} if event == "notice" else {"value": value}
            line = preemption.event_line(
                event,
                worker=int(worker) if worker.isdigit() else None,
                **fields,
                t=time.time(),
                reporter="follower",
            )
            # A line of its own, always: the leading newline ends whatever line the program is half way
            # through (Python writes a line's text and its newline in two writes, and the program may
            # start one between any look at the file and this write), and O_APPEND lands this one write
            # whole. So neither this line nor the program's is ever cut. The blank line it may leave
            # (before it, or after it when the program's own newline follows) stays off the console
            # (tpuctl.services.run.signals.EventTap).
            os.write(self._out_fd, f"\n{line}\n".encode())
            return True

    def close(self) -> None:
        """No event line from now on."""
        with self._lock:
            self._closed.set()


def tail(directory: str, offset: int) -> int:
    """Stream ``out`` from ``offset`` (see the module docstring); returns the process exit code."""
    out_path, exit_path = os.path.join(directory, OUT), os.path.join(directory, EXIT)
    supervisor = _read_int(os.path.join(directory, SUPERVISOR))
    if supervisor is None or not os.path.exists(out_path):
        print(f"follow: {directory} is not a launched run directory", file=sys.stderr)
        return 2
    stdout, stderr = sys.stdout.buffer, sys.stderr
    last_beat = 0.0
    with open(out_path, "rb") as fh:
        fh.seek(offset)
        while True:
            # Looked at before reading: once the exit file exists, a read to EOF has every byte.
            done = os.path.exists(exit_path)
            chunk = fh.read(1 << 16)
            if chunk:
                stdout.write(chunk)
                stdout.flush()
                continue
            if done:
                stderr.write(f"exit {_read_int(exit_path)}\n")
                stderr.flush()
                return 0
            now = time.monotonic()
            if now - last_beat >= HEARTBEAT_S:
                if not _alive(supervisor) and not os.path.exists(exit_path):
                    stderr.write(f"lost the supervisor (pid {supervisor}) ended without an exit status\n")
                    stderr.flush()
                    return 0
                stderr.write("alive\n")
                stderr.flush()
                last_beat = now
            time.sleep(_POLL_S)


def main(args: list[str]) -> int:
    """``launch`` or ``tail`` (see the module docstring)."""
    try:
        if len(args) >= 3 and args[0] == "tail":
            return tail(args[1], int(args[2]))
        if len(args) >= 5 and args[0] == "launch" and "--" in args:
            split = args.index("--")
            options, argv = args[2:split], args[split + 1 :]
            cwd, env_pairs, then_tail, tpu_worker_env, env_stdin = ".", [], False, False, False
            words = iter(options)
            for flag in words:
                if flag == "--tail":
                    then_tail = True
                elif flag == "--env-stdin":
                    env_stdin = True
                elif flag == "--tpu-worker-env":
                    tpu_worker_env = True
                elif flag == "--cwd":
                    cwd = next(words)
                elif flag == "--env":
                    env_pairs.append(next(words))
                else:
                    raise ValueError(flag)
            if argv:
                return launch(
                    args[1],
                    cwd,
                    env_pairs,
                    argv,
                    then_tail=then_tail,
                    tpu_worker_env=tpu_worker_env,
                    env_stdin=env_stdin,
                )
    except BrokenPipeError:
        # The SSH channel is gone: nothing to report to. Quiet exit (stdout is a dead pipe).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (ValueError, StopIteration):
        pass
    print(
        "usage: follow.py launch DIR [--cwd D] [--env K=V]... [--env-stdin] [--tpu-worker-env] [--tail] "
        "-- ARGV... | "
        "follow.py tail DIR OFFSET",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
