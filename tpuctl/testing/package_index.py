"""A user's own package index for tests: a static PEP 503 simple index over a directory of real wheels,
served on loopback by Python's ``http.server`` in a child process, as a plain web server serves one.

Tests never reach a real index: this stands in for the index a user's pip/uv configuration names
(``scripts/setup`` primes the test wheelhouse it serves, ``.tools/test-wheels``).
"""

from __future__ import annotations

import contextlib
import hashlib
import html
import re
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from tpuctl.testing.clock import wait_for
from tpuctl.testing.ports import unused_port

#: The test-only wheelhouse scripts/setup primes in a checkout (flax and what it needs beyond the
#: runtime's wheels).
TEST_WHEELS = Path(__file__).resolve().parents[2] / ".tools" / "test-wheels"
_START_TIMEOUT_S = 10.0


def write_simple_index(wheels: Path, root: Path) -> list[str]:
    """Lay out ``root`` as a static simple index of the wheels in ``wheels``: ``files/`` (a link to the
    directory) and ``simple/<project>/index.html`` per project, each link with its file's sha256, as
    PyPI gives it. Returns the projects, normalized."""
    (root / "simple").mkdir(parents=True, exist_ok=True)
    (root / "files").symlink_to(wheels.resolve(), target_is_directory=True)
    by_project: dict[str, list[Path]] = {}
    for wheel in sorted(wheels.glob("*.whl")):
        project = re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()
        by_project.setdefault(project, []).append(wheel)
    for project, files in by_project.items():
        links = "".join(
            f'<a href="../../files/{urllib.parse.quote(f.name)}#sha256='
            f'{hashlib.sha256(f.read_bytes()).hexdigest()}">{html.escape(f.name)}</a><br>\n'
            for f in files
        )
        page = root / "simple" / project / "index.html"
        page.parent.mkdir()
        page.write_text(f"<!DOCTYPE html>\n<html><body>\n{links}</body></html>\n", encoding="utf-8")
    return sorted(by_project)


@contextlib.contextmanager
def served_index(root: Path) -> Iterator[str]:
    """Serve ``root`` (``write_simple_index``'s layout) on loopback; yields the simple index's URL."""
    port = unused_port()
    command = [
        sys.executable,
        "-m",
        "http.server",
        str(port),
        "--bind",
        "127.0.0.1",
        "--directory",
        str(root),
    ]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/simple/"
    try:
        _wait_until_it_answers(url, server)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=5)


def _wait_until_it_answers(url: str, server: subprocess.Popen[bytes]) -> None:
    def answers() -> bool:
        if server.poll() is not None:
            raise RuntimeError(f"the test package index at {url} exited with {server.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return True
        except OSError:  # URLError is one: not listening yet
            return False

    wait_for(answers, timeout=_START_TIMEOUT_S, interval=0.05, what=f"the test package index at {url}")


__all__ = ["TEST_WHEELS", "served_index", "write_simple_index"]
