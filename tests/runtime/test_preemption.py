"""Preemption notices on simulated hosts: a SIGTERM on ONE host, or the metadata server's flag, becomes a
checkpoint on EVERY host at the same step (JAX's preemption sync point over gloo on CPU), the hosts exit
with the "preempted" code, and a restart from that checkpoint ends bit-identical to an uninterrupted run.
Plus the watcher itself without JAX (single process: its own SIGTERM handler, the metadata poll)."""

from __future__ import annotations

import http.server
import json
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tpuctl.runtime.preemption import (
    PREEMPTED_EXIT_CODE,
    MetadataClient,
    PreemptionWatch,
    parse_event,
)
from tpuctl.testing.clock import wait_for

LM = ["-m", "tpuctl.runtime.examples.lm_train"]
LM_ARGS = ["--steps", "14", "--checkpoint-every", "5", "--log-every", "1", "--batch", "8", "--seed", "3",
           "--layers", "1", "--d-model", "16", "--heads", "2", "--vocab", "32",
           "--seq-len", "16"]  # fmt: skip
HASH = re.compile(r"^final_params_sha256 ([0-9a-f]{64})$", re.M)
HOST_TIMEOUT = 150


def events(text: str) -> list[dict[str, Any]]:
    return [e for e in (parse_event(line) for line in text.splitlines()) if e is not None]


class _Metadata:
    """A metadata server lookalike: ``instance/preempted`` is FALSE until ``preempt()``."""

    def __init__(self) -> None:
        self.flag = "FALSE"
        self.requests = 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                outer.requests += 1
                ok = self.path.endswith("/computeMetadata/v1/instance/preempted")
                ok = ok and self.headers.get("Metadata-Flavor") == "Google"
                body = outer.flag.encode() if ok else b"no"
                self.send_response(200 if ok else 403)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/sim/metadata/z/n/0"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def metadata() -> Iterator[_Metadata]:
    server = _Metadata()
    try:
        yield server
    finally:
        server.close()


# --- the watcher on its own (no JAX) ----------------------------------------------------------------


def test_metadata_client_reads_the_flag_and_sends_the_header(metadata: _Metadata) -> None:
    client = MetadataClient(metadata.url)
    try:
        assert client.preempted() is False
        metadata.flag = "TRUE"
        assert client.preempted() is True
    finally:
        client.close()
    with pytest.raises(ValueError, match="http://"):
        MetadataClient("ftp://x")


def test_local_watch_stops_on_sigterm_and_says_so_once() -> None:
    said: list[dict[str, Any]] = []
    watch = PreemptionWatch(None, poll_s=0.05, announce=lambda event, **f: said.append({"event": event, **f}))
    watch.install()
    try:
        assert watch.should_stop(1) is False
        os.kill(os.getpid(), signal.SIGTERM)  # our handler, not death
        deadline = time.monotonic() + 5
        while not said and time.monotonic() < deadline:
            time.sleep(0.01)
        assert watch.should_stop(2) is True and watch.notice_source == "sigterm"
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)
    finally:
        watch.close()
    assert [(e["event"], e["source"]) for e in said] == [("notice", "sigterm")]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # put back


def test_local_watch_stops_on_the_metadata_flag_and_survives_failed_polls(metadata: _Metadata) -> None:
    watch = PreemptionWatch(metadata.url, poll_s=0.05, announce=lambda *a, **k: None)
    dead = PreemptionWatch("http://127.0.0.1:9", poll_s=0.05, announce=lambda *a, **k: None)
    watch.install()
    dead.install()
    try:
        # Both watches have polled at least twice (the dead one failing each time).
        wait_for(lambda: metadata.requests >= 2 and dead.poll_errors >= 2, 5, what="two polls of each watch")
        assert not watch.should_stop(1) and metadata.requests >= 2
        assert not dead.should_stop(1) and dead.poll_errors >= 2  # unreachable: never a preemption
        metadata.flag = "TRUE"
        deadline = time.monotonic() + 5
        while not watch.noticed and time.monotonic() < deadline:
            time.sleep(0.01)
        assert watch.should_stop(2) and watch.notice_source == "metadata"
    finally:
        watch.close()
        dead.close()


# --- on a 2-host slice, through JAX's sync point ----------------------------------------------------


def _wait_for_step(hosts: Any, step: int, timeout: float = HOST_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = [e["step"] for e in events(hosts.read(0)[0]) if e["event"] == "step"]
        if done and done[-1] >= step:
            return
        if any(p.poll() is not None for p in hosts.procs):
            raise AssertionError("a host ended early:\n" + "\n".join(str(hosts.read(w)) for w in (0, 1)))
        time.sleep(0.02)
    raise AssertionError(f"step {step} not reached")


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, start_hosts: Callable[..., Any]) -> str:
    work = tmp_path_factory.mktemp("pre-reference")
    procs = start_hosts(work, 2, 2, [*LM, *LM_ARGS], checkpoint_dir=work / "ckpt").wait(HOST_TIMEOUT)
    for proc in procs:
        assert proc.returncode == 0, proc.describe()
    m = HASH.search(procs[0].stdout)
    assert m, procs[0].describe()
    return m.group(1)


# The metadata case covers the propagation too (host 0 hands the notice to JAX as a SIGTERM to itself and
# host 1 learns it through the coordination service); the direct SIGTERM case is one more pair of runs.
@pytest.mark.parametrize("how", [pytest.param("sigterm-host-1", marks=pytest.mark.slow), "metadata-host-0"])
def test_notice_on_one_host_checkpoints_every_host_at_one_step_then_resumes_bit_identical(
    how: str, reference: str, start_hosts: Callable[..., Any], tmp_path: Path, metadata: _Metadata
) -> None:
    ckpt = tmp_path / "ckpt"
    # Only host 0 gets a working metadata server; in the SIGTERM case it never says TRUE.
    hosts = start_hosts(
        tmp_path / "a",
        2,
        2,
        [*LM, *LM_ARGS, "--step-delay", "0.1"],
        checkpoint_dir=ckpt,
        metadata_url=metadata.url,
        env={"TPUCTL_PREEMPTION_POLL_S": "0.1"},
    )
    _wait_for_step(hosts, 3)
    noticed_at = time.time()
    if how == "sigterm-host-1":
        hosts.procs[1].send_signal(signal.SIGTERM)
    else:
        metadata.flag = "TRUE"
    procs = hosts.wait(HOST_TIMEOUT)
    described = procs[0].describe() + procs[1].describe()
    assert [p.returncode for p in procs] == [PREEMPTED_EXIT_CODE] * 2, described
    evs = events(procs[0].stdout)
    start = evs[0]
    assert start["event"] == "start" and start["sync"] == "jax" and start["step"] == 0
    preempted = [e for e in evs if e["event"] == "preempted"]
    assert len(preempted) == 1 and preempted[0]["checkpoint"] == "saved"
    stopped = preempted[0]["step"]
    last_step = max(e["step"] for e in evs if e["event"] == "step")
    assert stopped == last_step and 3 < stopped < 14
    assert str(stopped) in {p.name for p in ckpt.iterdir()}
    notices = [e for e in evs if e["event"] == "notice"]
    if how == "metadata-host-0":
        # Seen within a few polls of the flag turning TRUE.
        assert notices and notices[0]["source"] == "metadata" and notices[0]["t"] - noticed_at < 2.0
    assert not HASH.search(procs[0].stdout)
    # Start again from that checkpoint: no step is done twice, and the end is the uninterrupted run's.
    again = start_hosts(tmp_path / "b", 2, 2, [*LM, *LM_ARGS], checkpoint_dir=ckpt, restart_count=1)
    resumed = again.wait(HOST_TIMEOUT)
    for proc in resumed:
        assert proc.returncode == 0, proc.describe()
    evs2 = events(resumed[0].stdout)
    assert evs2[0]["event"] == "start" and evs2[0]["restored"] == stopped and evs2[0]["restart_count"] == 1
    assert [e["step"] for e in evs2 if e["event"] == "step"] == list(range(stopped + 1, 15))
    m = HASH.search(resumed[0].stdout)
    assert m and m.group(1) == reference
    assert json.loads(json.dumps(evs2[-1])) == {"event": "done", "step": 14}
