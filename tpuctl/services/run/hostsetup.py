"""After every provision, before the program: set every host up, then check the program's imports.

A TPU VM (and a simulated one) boots a stock image: no JAX, optax or orbax, maybe an older Python. Every
attempt therefore runs the setup script of ``tpuctl.hosts.setup`` on every host (skipped on a host that
already has the same setup, keyed by its inputs), each host's output streamed with its prefix and kept in
its log. A failure names the host, the command and its last lines, and nothing starts. Then one check
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
    from tpuctl.hosts.base import Executor
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
    """Run the setup on every host, after bringing them uv (the pinned wheel from ``uv_wheelhouse``, else
    from ``uv_download_dir``, else downloaded from PyPI into it) where it installs anything; returns the
    seconds it took (every host done). Raises RunFailedError naming the first failed host and command."""
    from tpuctl.hosts.setup import RUN_SCRIPT_FROM_STDIN, failed_command, finished, setup_script
    from tpuctl.hosts.uv_tool import bring_uv, download_wheel

    spec = prepared.setup
    hosts = executor.num_hosts
    if spec.does_nothing:
        # Nothing to install or run: the program uses the image's python3 as it is, and a session per
        # host that only makes an empty directory would be a large part of a large slice's start-up.
        observer.detail(None, f"no setup on {counted(hosts, 'host')}: nothing to install or run")
        return 0.0
    script = setup_script(spec, prepared.request.ssh_remote_root)
    what = ", ".join(
        part
        for part in (
            f"runtime ({spec.runtime})" if spec.runtime else "",
            "--requirements" if spec.requirements else "",
            f"{len(spec.commands)} --setup command(s)" if spec.commands else "",
        )
        if part
    )
    title = f"setting up {counted(hosts, 'host')}: {what}"
    observer.phase(PhaseUpdate(title, done=0, total=hosts))
    started = time.monotonic()
    done = 0
    if spec.needs_env:
        wheelhouses = [*([uv_wheelhouse] if uv_wheelhouse else []), uv_download_dir]
        download = functools.partial(download_wheel, cache_dir=uv_download_dir)
        sent = bring_uv(executor, prepared.request.ssh_remote_root, wheelhouses, download=download)
        observer.detail(None, f"uv on {counted(hosts, 'host')} ({sent} sent it, {hosts - sent} had it)")

    def on_line(worker: int, text: str) -> None:
        nonlocal done
        logs[worker].write(text)
        observer.detail(worker, text)  # the commands and their output: in the log, on the console with -v
        if finished(text):
            done += 1  # under the executor's one callback at a time
            observer.phase(PhaseUpdate(title, done=done, total=hosts))

    results = executor.run_command(
        RUN_SCRIPT_FROM_STDIN, stdin=script.encode(), on_line=on_line, timeout_s=SETUP_TIMEOUT_S
    )
    failed = sorted(w for w, r in results.items() if r.exit_status != 0)
    if failed:
        worker = failed[0]
        result = results[worker]
        command = failed_command(result.tail) or "the setup script"
        status = (
            "no exit status (the host was lost)"
            if result.exit_status is None
            else f"exit {result.exit_status}"
        )
        tail = "\n".join(f"    {line}" for line in result.tail[-10:])
        raise RunFailedError(
            f"setup failed on host {worker} ({status}) running: {command}\n{tail}"
            + (f"\n(hosts {', '.join(map(str, failed[1:]))} failed too)" if len(failed) > 1 else ""),
            worker=worker,
            fix="fix the --setup command or --requirements file; the host's whole output is in "
            f"`tpuctl runs logs {prepared.run_id} --worker {worker}`",
        )
    took = time.monotonic() - started
    observer.phase(PhaseUpdate(title, done=hosts, total=hosts, outcome=f"done in {took:.1f} s"))
    return took


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
