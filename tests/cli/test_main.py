"""The ``tpuctl`` process's entry point (``console_main``): it ends the process without the interpreter's
teardown, so what it must keep is checked here, in real processes: the exit code, every byte of the
output, no traceback on a closed pipe, and work still running (a non-daemon thread) is waited for."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tpuctl.testing.cli import Cli


def _tpuctl(*args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # type: ignore[call-overload, no-any-return]
        [sys.executable, "-m", "tpuctl", *args], capture_output=True, text=True, timeout=120, **kwargs
    )


def test_the_whole_document_reaches_a_pipe_and_the_exit_code_is_kept() -> None:
    done = _tpuctl("cost", "estimate", "v5e-64", "--hours", "12", "-o", "json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)  # complete: it parses
    assert doc["backend"] == "sim" and len(doc["estimate"]["options"]) > 10
    bad = _tpuctl("cost", "report", "--group-by", "nope")
    assert bad.returncode == 2
    assert "'nope'" in bad.stderr and "Traceback" not in bad.stderr


def test_a_reader_that_stops_early_gets_no_traceback() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tpuctl", "cost", "estimate", "v5e-64", "-o", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.read(1) == "{"
    proc.stdout.close()  # as `| head -c 1` does
    err = proc.stderr.read()
    proc.wait(timeout=120)
    assert "Traceback" not in err


def test_work_still_running_at_the_end_is_waited_for(tmp_path: Path) -> None:
    marker = tmp_path / "written"
    code = textwrap.dedent(
        f"""
        import threading, time
        from tpuctl.cli import main as entry

        def command():
            def late():
                time.sleep(0.3)
                open({str(marker)!r}, "w").write("done")
            threading.Thread(target=late).start()  # not a daemon: the process must wait for it
            raise SystemExit(3)

        entry.run = command
        entry.console_main()
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=dict(os.environ)
    )
    assert done.returncode == 3, done.stderr
    assert marker.read_text() == "done"


def test_the_database_option_chooses_the_ledger(cli: Cli, tmp_path: Path) -> None:
    """--database puts the ledger where it says, apart from the state dir; a bad URL: exit 2 and the fix."""
    shared = tmp_path / "shared" / "ledger.db"
    for state in ("one", "two"):
        done = cli("--state-dir", str(tmp_path / state), "--database", f"sqlite:///{shared}", "runs", "list")
        assert done.code == 0, done.output
        assert not (tmp_path / state / "ledger.db").exists()
    assert shared.exists()
    bad = cli("--database", "sqlite:///ledger.db", "runs", "list")
    assert bad.code == 2
    assert "--database" in bad.output and "relative path" in bad.output and "sqlite:////" in bad.output
