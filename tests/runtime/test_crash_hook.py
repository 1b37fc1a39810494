"""An uncaught exception ends a host's program at once, with the traceback and an ``exception`` event.

The hook comes from the sitecustomize start-up hook (every backend), so the programs here are plain
Python; the slice case is an unmodified 2-process JAX program in which one process raises while the
other waits for it: the raising one must not wait in JAX's shutdown barrier.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tpuctl.runtime import crash
from tpuctl.runtime.hostenv import sim_host_env
from tpuctl.runtime.preemption import parse_event

REPO = Path(__file__).resolve().parents[2]

MAIN = """
import atexit
atexit.register(lambda: print("atexit ran", flush=True))
def step(n):
    raise KeyError(f"missing key at step {n}")
step(30)
"""

THREAD = """
import threading, time
t = threading.Thread(target=lambda: 1 / 0, name="loader")
t.start()
t.join()
time.sleep(30)  # the hook must have ended the process before this
print("still alive", flush=True)
"""


JITTED = """
import jax, jax.numpy as jnp
def step(lr):
    raise ValueError("bad lr")
jax.jit(step)(jnp.float32(3.0))
"""


def _events(text: str) -> list[dict[str, Any]]:
    return [e for e in (parse_event(line) for line in text.splitlines()) if e is not None]


def _host_env(worker: int = 3) -> dict[str, str]:
    env = sim_host_env("r", worker, 4, 1, 23456, "v5litepod-16", "4x4", "/ck", 0, REPO)
    env["TPUCTL_SIM"] = "0"  # the crash hook is installed on every backend, not only the simulator
    return env


def test_main_thread_exception_prints_traceback_event_and_exits_1(run_py: Callable[..., Any]) -> None:
    p = run_py(["-c", MAIN], env=_host_env(), timeout=30)
    assert p.returncode == 1, p.describe()
    assert "Traceback (most recent call last)" in p.stderr and "in step" in p.stderr
    assert _events(p.stdout) == [
        {
            "event": "exception",
            "type": "KeyError",
            "message": "'missing key at step 30'",
            "worker": 3,
        }
    ]
    assert "atexit ran" not in p.stdout  # os._exit: no exit handlers, so no JAX shutdown barrier


def test_thread_exception_ends_the_process_too(run_py: Callable[..., Any]) -> None:
    started = time.monotonic()
    p = run_py(["-c", THREAD], env=_host_env(0), timeout=30)
    assert p.returncode == 1, p.describe()
    assert time.monotonic() - started < 20
    assert "still alive" not in p.stdout
    assert "Exception in thread loader" in p.stderr and "ZeroDivisionError" in p.stderr
    (event,) = _events(p.stdout)
    assert event == {
        "event": "exception",
        "type": "ZeroDivisionError",
        "message": "division by zero",
        "worker": 0,
        "thread": "loader",
    }


def test_an_exception_raised_in_jitted_code_is_said_as_raised_not_as_jaxs_note(
    run_py: Callable[..., Any],
) -> None:
    p = run_py(["-c", JITTED], env=_host_env(1), timeout=60)
    assert p.returncode == 1, p.describe()
    assert "JAX_TRACEBACK_FILTERING" in p.stderr  # the note is in the traceback, where it helps
    (event,) = _events(p.stdout)
    assert event == {"event": "exception", "type": "ValueError", "message": "bad lr", "worker": 1}


def test_without_the_sitecustomize_dir_python_behaves_as_usual(run_py: Callable[..., Any]) -> None:
    p = run_py(["-c", MAIN], timeout=30)
    assert p.returncode == 1 and "atexit ran" in p.stdout and not _events(p.stdout)


def test_the_message_is_the_exceptions_own_last_line_never_a_note_a_library_attached() -> None:
    assert crash.own_last_line(ValueError("boom\nat step 30")) == "at step 30"
    assert crash.own_last_line(ValueError()) == ""
    assert crash.own_last_line(KeyError("learning_rate")) == "'learning_rate'"
    # What JAX attaches to every exception raised through a jitted function (a note, which Python 3.11+
    # prints as the traceback's last lines).
    jitted = ValueError("bad lr")
    jitted.add_note(
        "--------------------\nFor simplicity, JAX has removed its internal frames from the traceback of "
        "the following exception. Set JAX_TRACEBACK_FILTERING=off to include these."
    )
    assert crash.own_last_line(jitted) == "bad lr"


def test_exception_on_one_of_two_jax_processes_ends_it_in_seconds(
    start_hosts: Callable[..., Any], scripts_dir: Path, tmp_path: Path
) -> None:
    hosts = start_hosts(tmp_path, 2, 1, [str(scripts_dir / "raise_on_one_host.py")])
    try:
        deadline = time.monotonic() + 150
        while hosts.procs[1].poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        ended_at = time.time()
        assert hosts.procs[1].returncode == 1, hosts.read(1)
        # Host 0 is still waiting at its barrier: host 1 did not need it to exit.
        assert hosts.procs[0].poll() is None, hosts.read(0)
    finally:
        hosts.kill()
    out, err = hosts.read(1)
    raised_at = float(out.split("raising_at ", 1)[1].split()[0])
    assert ended_at - raised_at < 10, (ended_at - raised_at, out, err)
    print(f"host 1 ended {ended_at - raised_at:.2f} s after raising")
    assert "ValueError: boom on host 1" in err
    evs = _events(out)
    assert evs == [{"event": "exception", "type": "ValueError", "message": "at step 30", "worker": 1}]
