"""The one in-process runner of the ``tpuctl`` command line, for tests.

``invoke(args, env=..., stdin=..., backend=...)`` runs ``tpuctl.cli.main.run`` (the console script's own
entry point, so exit codes and error documents are exactly a user's) with ``sys.stdin``/``stdout``/
``stderr`` swapped for in-memory streams and the environment changed for the call only, and returns a
``CliResult``: the exit code, both streams, the time it took and, for ``-o json``, the parsed document.
``backend`` (e.g. ``tpuctl.testing.backend.InProcessBackend``) is what every session of the command opens,
instead of the backend the settings choose.

In-process runs share the interpreter: one command at a time (the streams are the process's own), and
anything a command leaves behind in module state is seen by the next, as in a test that imported it.
"""

from __future__ import annotations

import io
import json
import os
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from tpuctl.backends.base import Backend


@dataclass(frozen=True)
class CliResult:
    """One command's outcome. ``json`` parses stdout (a JSON object, else the test fails there)."""

    code: int
    stdout: str
    stderr: str
    seconds: float = 0.0
    wants_json: bool = False

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    @property
    def json(self) -> dict[str, Any]:
        data = json.loads(self.stdout)
        assert isinstance(data, dict), f"not a JSON object: {self.stdout[:200]!r}"
        return data

    @property
    def document(self) -> dict[str, Any] | None:
        """The JSON document of a ``-o json`` command; None for other formats or when stdout is not one."""
        if not self.wants_json:
            return None
        try:
            data = json.loads(self.stdout)
        except ValueError:
            return None
        return data if isinstance(data, dict) else None


class Cli(Protocol):
    """A test's runner: ``cli(*args, env=..., stdin=...)`` is ``invoke(args, env=env, stdin=stdin)``."""

    def __call__(
        self, *args: str, env: Mapping[str, str | None] | None = None, stdin: str = ""
    ) -> CliResult: ...


def invoke(
    args: Sequence[str],
    *,
    env: Mapping[str, str | None] | None = None,
    stdin: str = "",
    backend: Backend | None = None,
) -> CliResult:
    """Run ``tpuctl ARGS`` in this process. ``env`` sets (or, with None, removes) variables for this call
    only; ``stdin`` is what the command reads from standard input; ``backend``, when given, is the backend
    the command's sessions open."""
    from tpuctl.cli.main import run

    argv = list(args)
    out, err = io.StringIO(), io.StringIO()
    started = time.monotonic()
    with _environment(env or {}), _streams(io.StringIO(stdin), out, err):
        try:
            run(argv, backend=backend)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return CliResult(code, out.getvalue(), err.getvalue(), time.monotonic() - started, _wants_json(argv))


def _wants_json(argv: Sequence[str]) -> bool:
    for i, arg in enumerate(argv):
        if arg == "--":  # the rest is a program's own arguments
            return False
        if arg in ("-o", "--output") and i + 1 < len(argv) and argv[i + 1] == "json":
            return True
        if arg in ("-ojson", "--output=json"):
            return True
    return False


@contextmanager
def _environment(changes: Mapping[str, str | None]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in changes}
    try:
        for name, value in changes.items():
            _set(name, value)
        yield
    finally:
        for name, value in saved.items():
            _set(name, value)


def _set(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


@contextmanager
def _streams(stdin: io.StringIO, stdout: io.StringIO, stderr: io.StringIO) -> Iterator[None]:
    saved = sys.stdin, sys.stdout, sys.stderr
    sys.stdin, sys.stdout, sys.stderr = stdin, stdout, stderr
    try:
        yield
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved
