"""After every provision, before the program: set every host up, then check the program's imports.

A TPU VM (and a simulated one) boots a stock image: no JAX, optax or orbax, maybe an older Python. Every
attempt therefore gives every host the run's environment (skipped on a host that already has the same
setup, keyed by its inputs): restored from the run's bucket, where the first host that lacked it built
and stored it (``tpuctl.hosts.envstore``), or, for a run without a bucket, built on each host by the
setup script of ``tpuctl.hosts.setup``. Each host's output is streamed with its prefix and kept in its
log. A failure names the host, the command and its last lines, and nothing starts. Then one check
that the program's imports resolve in the hosts' environment, so a missing module is reported in seconds
with the fix, not as a traceback on every host after start-up.
"""

from __future__ import annotations

import functools
import importlib.util
import shlex
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from tpuctl.errors import RunFailedError
from tpuctl.services.run.model import PhaseUpdate
from tpuctl.words import counted

if TYPE_CHECKING:
    from tpuctl.hosts.base import CommandResult, Executor
    from tpuctl.hosts.setup import SetupSpec
    from tpuctl.services.run.hostlog import HostLog
    from tpuctl.services.run.model import LaunchObserver, PreparedRun

#: The longest a host's setup may take (a cold install of jax[tpu] on Google takes a few minutes).
SETUP_TIMEOUT_S = 1800.0
_CHECK_TIMEOUT_S = 120.0
#: The exit status of the import check when a module is missing.
_MISSING = 3
_CHECK_CODE = (
    "import importlib.util, sys\n"
    "missing = [m for m in sys.argv[1:] if importlib.util.find_spec(m) is None]\n"
    "print('missing:', ' '.join(missing)) if missing else None\n"
    f"sys.exit({_MISSING} if missing else 0)\n"
)


def run_setup(
    observer: LaunchObserver,
    executor: Executor,
    prepared: PreparedRun,
    logs: Mapping[int, HostLog],
    *,
    uv_wheelhouse: Path | None,
    uv_download_dir: Path,
) -> float:
    """Set every host up; returns the seconds it took (every host done). Raises RunFailedError naming the
    first failed host and command.

    With an environment to make and a bucket (``env_bucket``): every host restores it from the bucket
    (``tpuctl.hosts.envstore``); where the bucket lacks it, the first host that found none builds it
    (bringing it uv: the pinned wheel from ``uv_wheelhouse``, else from ``uv_download_dir``, else
    downloaded from PyPI into it) and stores it, and the others then restore it. Without a bucket, every
    host builds its own, as it must."""
    from tpuctl.hosts.uv_tool import bring_uv, download_wheel

    spec = prepared.setup
    hosts = executor.num_hosts
    if spec.does_nothing:
        # Nothing to install or run: the program uses the image's python3 as it is, and a session per
        # host that only makes an empty directory would be a large part of a large slice's start-up.
        observer.detail(None, f"no setup on {counted(hosts, 'host')}: nothing to install or run")
        return 0.0
    steps = _Steps(observer, executor, prepared, logs, _title(spec, hosts))
    started = time.monotonic()

    def bring(workers: list[int]) -> None:
        if spec.needs_env:
            wheelhouses = [*([uv_wheelhouse] if uv_wheelhouse else []), uv_download_dir]
            download = functools.partial(download_wheel, cache_dir=uv_download_dir)
            sent = bring_uv(executor, steps.root, wheelhouses, download=download, workers=workers)
            observer.detail(None, f"uv on {counted(len(workers), 'host')} ({sent} sent it)")

    bucket = env_bucket(prepared)
    if bucket is None or not spec.needs_env:
        bring(list(range(hosts)))
        steps.build(list(range(hosts)), store_in=None)
    else:
        if spec.commands:
            bring(list(range(hosts)))  # for a command that runs `uv pip install` after a restore
        missing = steps.restore(list(range(hosts)), bucket)
        if missing:
            builder = missing[0]
            if not spec.commands:
                bring([builder])
            steps.build([builder], store_in=bucket)
            observer.detail(None, f"environment built on host {builder}, stored in {steps.url(bucket)}")
            if missing[1:] and steps.restore(missing[1:], bucket):
                raise RunFailedError(
                    f"the environment host {builder} stored is not in {steps.url(bucket)}",
                    worker=builder,
                    fix=f"check that nothing deletes objects under gs://{bucket}/tpuctl/envs/",
                )
    took = time.monotonic() - started
    observer.phase(PhaseUpdate(steps.title, done=hosts, total=hosts, outcome=f"done in {took:.1f} s"))
    return took


def env_bucket(prepared: PreparedRun) -> str | None:
    """The bucket the run's environment is kept in: its checkpoint bucket (None: the run has none)."""
    from tpuctl.services.run.checkpoints import bucket_of

    return bucket_of(prepared.checkpoint_dir)


def _title(spec: SetupSpec, hosts: int) -> str:
    what = ", ".join(
        part
        for part in (
            f"runtime ({spec.runtime})" if spec.runtime else "",
            "--requirements" if spec.requirements else "",
            f"{len(spec.commands)} --setup command(s)" if spec.commands else "",
        )
        if part
    )
    return f"setting up {counted(hosts, 'host')}: {what}"


class _Steps:
    """The setup's scripts, run on some hosts at a time, with the phase's count of hosts done."""

    def __init__(
        self,
        observer: LaunchObserver,
        executor: Executor,
        prepared: PreparedRun,
        logs: Mapping[int, HostLog],
        title: str,
    ) -> None:
        self.observer, self.executor, self.prepared, self.logs = observer, executor, prepared, logs
        self.title = title
        self.root = prepared.request.ssh_remote_root
        self.done = 0
        observer.phase(PhaseUpdate(title, done=0, total=executor.num_hosts))

    def url(self, bucket: str) -> str:
        from tpuctl.hosts.envstore import env_url

        return env_url(bucket, self.prepared.setup.key())

    def build(self, workers: list[int], *, store_in: str | None) -> None:
        """Make the environment on ``workers`` (and store it in ``store_in``)."""
        from tpuctl.hosts.setup import setup_script

        script = setup_script(self.prepared.setup, self.root, store_in=store_in)
        self._run(script, workers, fix="fix the --setup command or --requirements file", store_in=store_in)

    def restore(self, workers: list[int], bucket: str) -> list[int]:
        """Restore the environment on ``workers`` from ``bucket``; returns those it was not in yet."""
        from tpuctl.hosts.envstore import ENV_MISSING
        from tpuctl.hosts.setup import restore_script

        script = restore_script(self.prepared.setup, bucket, self.root)
        fix = (
            f"check that the hosts' service account can read gs://{bucket} (roles/storage.objectViewer) "
            "and that the hosts have room on their disks"
        )
        results = self._run(script, workers, fix=fix, missing=ENV_MISSING)
        return sorted(w for w, r in results.items() if r.exit_status == ENV_MISSING)

    def _run(
        self,
        script: str,
        workers: list[int],
        *,
        fix: str,
        missing: int | None = None,
        store_in: str | None = None,
    ) -> dict[int, CommandResult]:
        from tpuctl.hosts.setup import RUN_SCRIPT_FROM_STDIN, finished

        total = self.executor.num_hosts

        def on_line(worker: int, text: str) -> None:
            self.logs[worker].write(text)
            self.observer.detail(worker, text)  # the commands and their output: in the log, with -v
            if finished(text):
                self.done += 1  # under the executor's one callback at a time
                self.observer.phase(PhaseUpdate(self.title, done=self.done, total=total))

        results = self.executor.run_command(
            RUN_SCRIPT_FROM_STDIN,
            stdin=script.encode(),
            on_line=on_line,
            timeout_s=SETUP_TIMEOUT_S,
            workers=workers,
        )
        failed = sorted(w for w, r in results.items() if r.exit_status not in (0, missing))
        if failed:
            raise self._failure(results, failed, fix, store_in)
        return results

    def _failure(
        self, results: Mapping[int, CommandResult], failed: list[int], fix: str, store_in: str | None
    ) -> RunFailedError:
        from tpuctl.hosts.envstore import is_store_step
        from tpuctl.hosts.setup import failed_command

        worker = failed[0]
        result = results[worker]
        command = failed_command(result.tail) or "the setup script"
        if store_in is not None and is_store_step(command):
            fix = (
                f"let the hosts' service account write gs://{store_in} (roles/storage.objectCreator), "
                "or give the run a bucket it can write with --bucket"
            )
        status = (
            "no exit status (the host was lost)"
            if result.exit_status is None
            else f"exit {result.exit_status}"
        )
        tail = "\n".join(f"    {line}" for line in result.tail[-10:])
        return RunFailedError(
            f"setup failed on host {worker} ({status}) running: {command}\n{tail}"
            + (f"\n(hosts {', '.join(map(str, failed[1:]))} failed too)" if len(failed) > 1 else ""),
            worker=worker,
            fix=f"{fix}; the host's whole output is in "
            f"`tpuctl runs logs {self.prepared.run_id} --worker {worker}`",
        )


def check_imports(observer: LaunchObserver, executor: Executor, prepared: PreparedRun) -> None:
    """Raise RunFailedError when a module the program imports is missing from the hosts' environment."""
    modules = program_imports(prepared)
    if not modules:
        return
    command = " ".join(shlex.quote(part) for part in (prepared.python, "-c", _CHECK_CODE, *sorted(modules)))
    # One host is enough: every host has the same setup (the same key), so the same environment.
    results = executor.run_command(
        command, on_line=lambda w, t: None, timeout_s=_CHECK_TIMEOUT_S, workers=[0]
    )
    result = results[min(results)]
    if result.exit_status == 0:
        return
    missing = next((line.split(":", 1)[1].split() for line in result.tail if line.startswith("missing:")), [])
    if result.exit_status == _MISSING and missing:
        names = ", ".join(missing)
        raise RunFailedError(
            f"the program imports {names}, which the hosts' environment does not have "
            f"(checked on host {result.worker} before starting)",
            worker=result.worker,
            # `uv pip install` in --setup only where there is an environment: uv is brought and on PATH,
            # and the environment active, only then (without one the command is "uv: command not found").
            fix=f"install it on every host: --requirements FILE listing {missing[0]}"
            + (f", or --setup 'uv pip install {missing[0]}'" if prepared.setup.needs_env else ""),
        )
    tail = " / ".join(result.tail[-3:])
    observer.status(f"note: could not check the program's imports on host {result.worker}: {tail}")


def program_imports(prepared: PreparedRun) -> set[str]:
    """The top-level modules the program imports at start-up that neither its bundle nor the standard
    library has (``import_check``: the script and the local modules it imports); for ``-m MODULE``,
    that module's own imports (``tpuctl`` itself ships in the bundle)."""
    from tpuctl.services.run import import_check

    program = prepared.program
    if program[0] != "-m":
        return set(import_check.program_imports(prepared.bundle, program[0]))
    spec = importlib.util.find_spec(program[1])
    origin = spec.origin if spec is not None else None
    if not origin:
        return set()
    source = Path(origin).read_text(encoding="utf-8")
    found = {name.split(".")[0] for name, _line, level in import_check.startup_imports(source) if not level}
    return {m for m in found if m not in ("__future__", "tpuctl") and m not in sys.stdlib_module_names}
