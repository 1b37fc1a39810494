"""Host setup: the bash script that prepares a host's Python environment before a run starts on it.

Every provision gives stock hosts (a fresh disk after each recovery), so a run's environment is built on
a host, from its inputs, by a script the executor runs over SSH (``setup_script``; with a bucket, on one
host, which then stores it there for the others to restore with ``restore_script``, see
``tpuctl.hosts.envstore``): uv (which tpuctl brings to the host
first, ``tpuctl.hosts.uv_tool``: no pip, no package index for uv itself) makes a virtual environment
with the Python the runtime needs, installs the runtime's pinned set
(``tpuctl/runtime/requirements/{cpu,tpu}.txt``) and the user's requirements, then runs the user's setup
commands in it. Each runtime set is a complete lock (``uv export`` of pyproject's ``runtime-cpu`` or
``runtime-tpu`` group: the whole closure pinned and hashed), installed with ``--no-deps
--require-hashes``: nothing to resolve (resolving fetched every wheel's metadata first, ~0.7 s of a fresh
host's setup on the simulator), and a wheel that is not the one tested does not install. The environment
lives at ``<remote_root>/envs/<key>``, where the key hashes every input, and a ``.complete`` marker
written last makes the script a no-op on a host that already has that setup.

The script prints ``[tpuctl-setup] $ <command>`` before each step (stdout and stderr go to one stream), so
``failed_command`` can name the step a failed setup stopped at from the output's lines, and ends a host's
setup with ``[tpuctl-setup] done: <env>``, ``restored: <env>`` or ``up to date: <env>`` (``finished``), so a
console can count the hosts done while the others still install. Those lines are details: a console shows
one line for the whole setup (``tpuctl.services.run.hostsetup``); the host's log keeps every line.
"""

from __future__ import annotations

import functools
import hashlib
import json
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tpuctl.hosts import envstore
from tpuctl.hosts.uv_tool import UV_VERSION, host_uv

Runtime = Literal["cpu", "tpu"]

#: The prefix of the lines the script prints itself; ``STEP_PREFIX`` starts each step's line, one of
#: ``FINISHED_PREFIXES`` its last line on a host whose setup succeeded.
LINE_PREFIX = "[tpuctl-setup]"
STEP_PREFIX = f"{LINE_PREFIX} $ "
FINISHED_PREFIXES = (f"{LINE_PREFIX} done: ", f"{LINE_PREFIX} up to date: ", f"{LINE_PREFIX} restored: ")
#: Part of every key: a change to the script's steps makes hosts set up again rather than trust a marker
#: written by an older script (4: relocatable environments, which a host may restore from the bucket;
#: 5: a stored environment carries its bytecode, so a bucket's older archive, without it, is not reused).
SCRIPT_VERSION = 5
REQUIREMENTS_DIR = Path(__file__).resolve().parent.parent / "runtime" / "requirements"


@functools.cache
def runtime_requirements(runtime: Runtime) -> str:
    """The text of the runtime's pinned set (``tpuctl/runtime/requirements/<runtime>.txt``), read once:
    ``SetupSpec.key()`` hashes it, and the key is asked for by the script, the env path and the plan."""
    return (REQUIREMENTS_DIR / f"{runtime}.txt").read_text(encoding="utf-8")


@dataclass(frozen=True)
class SetupSpec:
    """What a host's setup installs and runs.

    ``runtime``: the bundled runtime's pinned set to install (``"cpu"``: CPU JAX, the simulator;
    ``"tpu"``: ``jax[tpu]``, Google), or None for none. ``requirements``: the text of a user requirements
    file (uv pip syntax), or None. ``commands``: shell commands run in order after the installs, with the
    environment activated. ``python``: the interpreter version uv creates the environment with (found on
    the host, or downloaded by uv where allowed). ``uv_version``: the uv the script runs (the one
    ``tpuctl.hosts.uv_tool`` brings to the host).
    """

    runtime: Runtime | None
    requirements: str | None = None
    commands: tuple[str, ...] = ()
    python: str = "3.11"
    uv_version: str = UV_VERSION

    @property
    def needs_env(self) -> bool:
        """Whether the setup makes a virtual environment (anything to install)."""
        return self.runtime is not None or bool(self.requirements)

    @property
    def does_nothing(self) -> bool:
        """Whether there is nothing to install and no command to run (no setup step at all)."""
        return not self.needs_env and not self.commands

    def key(self) -> str:
        """sha256 (hex) of every input: the runtime's pinned set (its text, not its name), the user's
        requirements and commands, the Python and uv versions, and the script's version."""
        inputs = {
            "script": SCRIPT_VERSION,
            "runtime": self.runtime,
            "runtime_set": runtime_requirements(self.runtime) if self.runtime else None,
            "requirements": self.requirements,
            "commands": list(self.commands),
            "python": self.python,
            "uv": self.uv_version,
        }
        return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def env_dir(spec: SetupSpec, remote_root: str = ".tpuctl") -> str:
    """The host path of the setup's directory (relative paths are relative to the login home)."""
    return f"{remote_root.rstrip('/')}/envs/{spec.key()}"


def env_python(spec: SetupSpec, remote_root: str = ".tpuctl") -> str:
    """The host path of the python a run should use after this setup: the environment's, or the image's
    ``python3`` when the setup installs nothing (relative paths are relative to the login home)."""
    if not spec.needs_env:
        return "python3"
    return f"{env_dir(spec, remote_root)}/bin/python"


#: How the executor runs the script: sent as the command's standard input, kept in a file, run by bash. Not
#: as the command itself: sshd hands a command to ``sh -c`` as one argument, which Linux caps at 128 KiB,
#: and the runtime lock alone is larger. Not ``bash -s`` either: a step that reads its standard input would
#: eat the rest of the script. POSIX sh, whatever the login shell.
RUN_SCRIPT_FROM_STDIN = 'f=$(mktemp) && cat > "$f" && { bash "$f"; s=$?; rm -f "$f"; exit $s; }'


def failed_command(lines: Iterable[str]) -> str | None:
    """The step a setup's output stopped at: the last ``[tpuctl-setup] $ <command>`` line's command."""
    last = None
    for line in lines:
        line = line.rstrip("\r\n")
        if line.startswith(STEP_PREFIX):
            last = line[len(STEP_PREFIX) :]
    return last


def finished(line: str) -> bool:
    """Whether ``line`` is the last one of a host's successful setup (done, or already up to date)."""
    return line.startswith(FINISHED_PREFIXES)


# The script ---------------------------------------------------------------------------------------------

_PREAMBLE = r"""#!/usr/bin/env bash
# tpuctl host setup {key}
set -euo pipefail
exec 2>&1  # one stream, so a step's errors follow its line
root={root}
case $root in /*) ;; *) root=$HOME/$root ;; esac
env=$root/envs/{key}
if [ -f "$env/.complete" ]; then
  echo "{prefix} up to date: $env"
  exit 0
fi
step() {{ printf '{prefix} $'; printf ' %s' "$@"; printf '\n'; "$@"; }}
run() {{ printf '{prefix} $ %s\n' "$1"; bash -c "$1"; }}
rm -rf "$env"
"""

# uv is brought to the host before the script runs (``tpuctl.hosts.uv_tool``: shipped, verified, cached);
# the script only checks that it is there, so a host without it fails at a named step, not halfway.
_UV = r"""uv={uv}
case $uv in /*) ;; *) uv=$HOME/$uv ;; esac
step test -x "$uv"
# On PATH too, so a --setup command can run `uv pip install ...` (the fix suggested for a missing module).
export PATH="${{uv%/uv}}:$PATH"
# The environment's files are hard links into uv's cache (same disk). A host that keeps its environment
# to itself compiles no bytecode at install time: Python compiles what it imports, on first import, and
# keeps it (``_COMPILE_FOR_STORE`` for an environment that others restore).
export UV_LINK_MODE=${{UV_LINK_MODE:-hardlink}}
# A Python uv downloads (where the image lacks the version and downloads are allowed) goes inside the
# environment, so its archive is whole: on Google every host of a slice has the same home, so the same
# absolute path.
export UV_PYTHON_INSTALL_DIR="$env/python"
"""

# An environment stored for other hosts is byte-compiled once, here, and its bytecode travels in the
# archive: otherwise every host of every start compiles what it imports again, on a fresh disk, from
# source (~2.5 s of jax, orbax and gcsfs per process on the simulator's CPU; before each step of a
# recovery). uv reads the variable in the runtime's installs and in a --setup `uv pip install` alike
# (pip compiles by default). The bytecode is checked against its source's mtime and size, which tar
# keeps on extraction, so a restored host uses it as it is.
_COMPILE_FOR_STORE = """export UV_COMPILE_BYTECODE=${UV_COMPILE_BYTECODE:-1}
"""

# A restoring host runs the --setup commands again (what they do outside the environment, e.g. a system
# package, is each host's own); uv is on PATH where tpuctl brought it, for a command that runs
# `uv pip install ...`, which finds its packages already in the restored environment.
_UV_IF_BROUGHT = r"""uv={uv}
case $uv in /*) ;; *) uv=$HOME/$uv ;; esac
if [ -x "$uv" ]; then export PATH="${{uv%/uv}}:$PATH"; fi
"""

_FILE = """cat > "$env/{name}" <<'{tag}'
{text}
{tag}
"""


def setup_script(spec: SetupSpec, remote_root: str = ".tpuctl", *, store_in: str | None = None) -> str:
    """The bash script that sets a host up for ``spec`` (run it with bash, in the login home).

    Idempotent: exits 0 at once when ``<remote_root>/envs/<key>/.complete`` exists; otherwise starts that
    directory afresh, checks that the uv ``tpuctl.hosts.uv_tool`` brought is there, creates the
    environment with ``uv venv --python <spec.python>``, ``uv pip install``s the runtime set
    and the user's requirements, runs ``spec.commands`` with the environment activated (``bash -c``, in
    order), and writes the marker last. Exits non-zero at the first failing step, whose
    ``[tpuctl-setup] $`` line is the last one printed. The package index is the host's (pip's and uv's
    own environment variables; the simulator points them at its mirror). With ``store_in`` (a bucket)
    and an environment to make, the built environment is then packed and stored there
    (``tpuctl.hosts.envstore``) before the marker, for ``restore_script`` on the other hosts.
    """
    key = spec.key()
    parts = [_PREAMBLE.format(key=key, root=shlex.quote(remote_root), prefix=LINE_PREFIX)]
    if spec.needs_env:
        parts.append(_UV.format(uv=shlex.quote(host_uv(remote_root))))
        if store_in is not None:
            parts.append(_COMPILE_FOR_STORE)
        parts.append(_env_steps(spec, key))
    else:
        parts.append('mkdir -p "$env"\n')
    parts.append(_command_steps(spec))
    if store_in is not None and spec.needs_env:
        parts.append(envstore.tool_steps(remote_root))
        parts.append(envstore.store_steps(store_in, key))
    parts.append(f'touch "$env/.complete"\necho "{LINE_PREFIX} done: $env"\n')
    return "".join(parts)


def restore_script(spec: SetupSpec, bucket: str, remote_root: str = ".tpuctl") -> str:
    """The bash script that gives a host ``spec``'s environment from ``bucket``, where a builder's
    ``setup_script(..., store_in=bucket)`` stored it: a no-op where the marker is there already; else
    the archive streamed into a fresh directory, ``spec.commands`` run again in it (their effects
    outside the environment are each host's), the marker, and ``[tpuctl-setup] restored: <env>``.
    Exits ``envstore.ENV_MISSING`` when the bucket has no such environment yet. Needs only the image's
    ``python3`` and ``tar``: no uv (on PATH for the commands where tpuctl brought it), no package index."""
    key = spec.key()
    parts = [
        _PREAMBLE.format(key=key, root=shlex.quote(remote_root), prefix=LINE_PREFIX),
        envstore.tool_steps(remote_root),
        envstore.restore_steps(bucket, key, LINE_PREFIX),
    ]
    if spec.commands:
        parts.append(_UV_IF_BROUGHT.format(uv=shlex.quote(host_uv(remote_root))))
        parts.append(_command_steps(spec))
    parts.append(f'touch "$env/.complete"\necho "{LINE_PREFIX} restored: $env"\n')
    return "".join(parts)


def _command_steps(spec: SetupSpec) -> str:
    """Run the --setup commands in order (``bash -c``), with the environment activated where there is
    one."""
    if not spec.commands:
        return ""
    activate = 'export VIRTUAL_ENV="$env" PATH="$env/bin:$PATH"\n' if spec.needs_env else ""
    return activate + "".join(f"run {shlex.quote(command)}\n" for command in spec.commands)


def _env_steps(spec: SetupSpec, key: str) -> str:
    """Make the venv, write the requirement files into it, install them: the runtime's lock as it is (no
    resolving, only its hashes), then the user's requirements, resolved against what the lock installed."""
    tag = f"TPUCTL_SETUP_{key[:16]}"
    install = 'step "$uv" pip install --quiet --python "$env/bin/python"'
    # The image's own python<version> by path where it has one: uv's search skips interpreters that are
    # themselves virtual environments (the simulator's image is one), an explicit path it takes as given.
    python = shlex.quote(spec.python)
    steps = [
        f"python=$(command -v python{python} || echo {python})\n",
        # Relocatable (entry points and activation scripts find the environment from where they are): a
        # restoring host's home, hence the environment's path, is not the builder's.
        'step "$uv" venv --quiet --relocatable --python "$python" "$env"\n',
    ]
    if spec.runtime is not None:
        text = runtime_requirements(spec.runtime).rstrip("\n")
        steps.append(_FILE.format(name="tpuctl-runtime.txt", tag=tag, text=text))
        steps.append(f'{install} --no-deps --require-hashes -r "$env/tpuctl-runtime.txt"\n')
    if spec.requirements:
        text = spec.requirements.rstrip("\n")
        steps.append(_FILE.format(name="tpuctl-requirements.txt", tag=tag, text=text))
        steps.append(f'{install} -r "$env/tpuctl-requirements.txt"\n')
    return "".join(steps)
