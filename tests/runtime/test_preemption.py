"""Preemption notices on simulated hosts: a SIGTERM on ONE host, or the metadata server's flag, becomes a
checkpoint on EVERY host at the same step (JAX's preemption sync point over gloo on CPU), the hosts exit
with the "preempted" code, and a restart from that checkpoint ends bit-identical to an uninterrupted run.
Plus the watcher itself without JAX (single process: its own SIGTERM handler, the metadata poll)."""

from __future__ import annotations

import contextlib
import http.client
import inspect
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tpuctl.runtime import preemption
from tpuctl.runtime.preemption import (
    PREEMPTED_EXIT_CODE,
    MetadataClient,
    MetadataValue,
    PreemptionWatch,
    exit_preempted,
    parse_event,
)
from tpuctl.testing.clock import wait_for
from tpuctl.testing.metadata_server import MetadataServer, etag_of, slice_values

LM = ["-m", "tpuctl.runtime.examples.lm_train"]
LM_ARGS = ["--steps", "14", "--checkpoint-every", "5", "--log-every", "1", "--batch", "8", "--seed", "3",
           "--layers", "1", "--d-model", "16", "--heads", "2", "--vocab", "32",
           "--seq-len", "16"]  # fmt: skip
HASH = re.compile(r"^final_params_sha256 ([0-9a-f]{64})$", re.M)
HOST_TIMEOUT = 150


def events(text: str) -> list[dict[str, Any]]:
    return [e for e in (parse_event(line) for line in text.splitlines()) if e is not None]


@pytest.fixture
def metadata() -> Iterator[MetadataServer]:
    server = MetadataServer(slice_values(0, ["127.0.0.1"]))
    try:
        yield server
    finally:
        server.close()


# --- the watcher on its own (no JAX) ----------------------------------------------------------------


def test_metadata_client_reads_values_with_the_header_and_etag(metadata: MetadataServer) -> None:
    client = MetadataClient(metadata.host)
    try:
        assert client.preempted() is False
        metadata.set("instance/preempted", "TRUE")
        assert client.preempted() is True
        value = client.get("instance/maintenance-event")
        assert value == MetadataValue("NONE", etag_of("NONE"))
        with pytest.raises(http.client.HTTPException, match="404"):
            client.get("instance/attributes/no-such-key")
    finally:
        client.close()
    assert {flavor for _, _, flavor in metadata.requests} == {"Google"}
    assert metadata.requests[0][0] == "/computeMetadata/v1/instance/preempted"
    for bad in ("ftp://x", "http://127.0.0.1:9/sim/metadata", ""):
        with pytest.raises(ValueError, match="host"):
            MetadataClient(bad or "http://")


def test_long_poll_returns_at_the_change_not_at_the_timeout(metadata: MetadataServer) -> None:
    client = MetadataClient(metadata.host)
    first = client.get("instance/preempted")

    def change_once_asked() -> None:
        # The value changes only once the long poll has reached the server: a TRUE answer is the change.
        wait_for(lambda: len(metadata.requests) == 2, what="the long poll at the server")
        metadata.set("instance/preempted", "TRUE")

    changer = threading.Thread(target=change_once_asked)
    changer.start()
    started = time.monotonic()
    try:
        changed = client.get("instance/preempted", wait_for_change=True, last_etag=first.etag, timeout_sec=30)
    finally:
        client.close()
        changer.join(timeout=10)
    assert changed.text == "TRUE" and changed.etag != first.etag
    assert time.monotonic() - started < 10  # at the change, long before the 30 s timeout
    query = metadata.requests[-1][1]
    assert query == {"wait_for_change": "true", "last_etag": str(first.etag), "timeout_sec": "30"}


def test_from_env_finds_the_server_as_google_auth_does() -> None:
    def host(env: dict[str, str]) -> str | None:
        return PreemptionWatch.from_env(env).metadata_host

    assert host({"GCE_METADATA_HOST": "127.16.0.3:8080", "GCE_METADATA_IP": "x"}) == "127.16.0.3:8080"
    assert host({"GCE_METADATA_IP": "127.16.0.4"}) == "127.16.0.4"
    # Launched by tpuctl on a real TPU VM: the standard name.
    assert host({"TPUCTL_RUN_ID": "r"}) == "metadata.google.internal"
    # A plain run on a laptop: SIGTERM only.
    assert host({}) is None
    assert "TPUCTL_METADATA_URL" not in inspect.getsource(preemption)


def test_local_watch_stops_on_sigterm_and_says_so_once() -> None:
    said: list[dict[str, Any]] = []
    watch = PreemptionWatch(None, poll_s=0.05, announce=lambda event, **f: said.append({"event": event, **f}))
    watch.install()
    try:
        assert watch.should_stop(1) is False
        os.kill(os.getpid(), signal.SIGTERM)  # our handler, not death
        wait_for(lambda: said, 5, what="the notice said by the watcher's thread")
        assert watch.should_stop(2) is True and watch.notice_source == "sigterm"
        # A second SIGTERM: Python runs the handler in this thread before the next statement; still ours.
        os.kill(os.getpid(), signal.SIGTERM)
        assert watch.should_stop(3) is True and watch.notice_source == "sigterm"
    finally:
        watch.close()  # joins the watcher's thread: whatever it was going to say is said
    assert [(e["event"], e["source"]) for e in said] == [("notice", "sigterm")]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # put back


def test_on_the_way_out_sigterm_is_ignored_and_closing_the_watch_keeps_it_so() -> None:
    watch = PreemptionWatch(None, poll_s=0.05).install()
    try:
        assert exit_preempted(3, saved=False, say=False) == PREEMPTED_EXIT_CODE
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
        watch.close()
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


#: A program that stops for a preemption and leaves, as the runtime's programs do.
_LEAVING = """
import sys
from tpuctl.runtime.preemption import PreemptionWatch, exit_preempted
watch = PreemptionWatch(None, poll_s=0.05).install()
code = exit_preempted(3, saved=False, say=False)
print("leaving", flush=True)
sys.exit(code)
"""


def test_a_sigterm_while_the_program_finalizes_does_not_kill_it() -> None:
    """The VM's shutdown keeps signalling after the notice; Python puts SIGTERM's default back while it
    finalizes, so a handler alone would let one of these kill the program (it did, every time)."""
    codes = []
    for _ in range(3):
        child = subprocess.Popen([sys.executable, "-c", _LEAVING], stdout=subprocess.PIPE, text=True)
        assert child.stdout is not None and child.stdout.readline().strip() == "leaving"
        while child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGTERM)
            time.sleep(0.0002)
        codes.append(child.wait())
    assert codes == [PREEMPTED_EXIT_CODE] * 3


@pytest.mark.parametrize(
    ("path", "value", "source", "event"),
    [
        ("instance/preempted", "TRUE", "metadata", ("notice", "metadata")),
        (
            "instance/maintenance-event",
            "TERMINATE_ON_HOST_MAINTENANCE",
            "maintenance",
            ("maintenance", "TERMINATE_ON_HOST_MAINTENANCE"),
        ),
    ],
)
def test_watch_long_polls_both_keys_and_stops_on_either(
    metadata: MetadataServer, path: str, value: str, source: str, event: tuple[str, str]
) -> None:
    said: list[dict[str, Any]] = []
    watch = PreemptionWatch(
        metadata.host, poll_s=0.05, wait_s=30, announce=lambda e, **f: said.append({"event": e, **f})
    )
    watch.install()
    try:
        # Each key: one plain GET, then a long poll from its ETag (held by the server, not repeated).
        def polling(key: str) -> bool:
            return any(q.get("last_etag") for p, q, _ in metadata.requests if p.endswith(key))

        wait_for(lambda: polling("preempted") and polling("maintenance-event"), 5, what="two long polls")
        held = len(metadata.requests)
        metadata.set("instance/maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE")  # not an end for a TPU
        wait_for(lambda: len(metadata.requests) >= held + 1, 5, what="the next long poll")
        wait_for(lambda: said, 5, what="the MIGRATE said")
        assert not watch.should_stop(1)  # said, not acted on
        noticed_at = time.time()
        metadata.set(path, value)
        wait_for(lambda: watch.noticed, 5, what="the notice")
        assert watch.should_stop(2) and watch.notice_source == source
        wait_for(lambda: len(said) == 2, 5, what="the notice said")
        first, then = said
        assert (first["event"], first["value"]) == ("maintenance", "MIGRATE_ON_HOST_MAINTENANCE")
        assert (then["event"], then.get("source", then.get("value"))) == event
        assert then["t"] - noticed_at < 2
        assert len(metadata.requests) <= held + 5  # long polls, not a busy loop
    finally:
        started = time.monotonic()
        watch.close()
    assert time.monotonic() - started < 2  # a long poll in flight is cut, not waited for
    assert watch.poll_errors == 0


def test_watch_survives_an_unreachable_server() -> None:
    gone = MetadataServer()
    host = gone.host
    gone.close()  # nobody listens there now
    dead = PreemptionWatch(host, poll_s=0.05, announce=lambda *a, **k: None)
    dead.install()
    try:
        wait_for(lambda: dead.poll_errors >= 4, 5, what="failed requests on both keys")
        assert not dead.should_stop(1)  # unreachable: never a preemption
    finally:
        dead.close()


def test_a_server_without_etags_is_polled_instead() -> None:
    server = MetadataServer(slice_values(0, ["127.0.0.1"]), etags=False)
    watch = PreemptionWatch(server.host, poll_s=0.05, announce=lambda *a, **k: None)
    watch.install()
    try:
        wait_for(lambda: len(server.requests) >= 6, 5, what="plain polls")
        assert not any(q for _, q, _ in server.requests)  # never a wait_for_change without an ETag
        server.set("instance/preempted", "TRUE")
        wait_for(lambda: watch.noticed, 5, what="the notice")
        assert watch.notice_source == "metadata"
    finally:
        watch.close()
        server.close()


# --- on a 2-host slice, through JAX's sync point ----------------------------------------------------


def _wait_for_step(hosts: Any, step: int, timeout: float = HOST_TIMEOUT) -> None:
    def reached() -> bool:
        done = [e["step"] for e in events(hosts.read(0)[0]) if e["event"] == "step"]
        if done and done[-1] >= step:
            return True
        if any(p.poll() is not None for p in hosts.procs):
            raise AssertionError("a host ended early:\n" + "\n".join(str(hosts.read(w)) for w in (0, 1)))
        return False

    wait_for(reached, timeout, interval=0.02, what=f"step {step} on host 0")


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
    how: str, reference: str, start_hosts: Callable[..., Any], tmp_path: Path
) -> None:
    ckpt = tmp_path / "ckpt"
    # Each host has its own metadata server; only host 0's says TRUE, and only in the metadata case.
    hosts = start_hosts(
        tmp_path / "a",
        2,
        2,
        [*LM, *LM_ARGS, "--step-delay", "0.1"],
        checkpoint_dir=ckpt,
        env={"TPUCTL_PREEMPTION_POLL_S": "0.1"},
    )
    _wait_for_step(hosts, 3)
    noticed_at = time.time()
    if how == "sigterm-host-1":
        hosts.procs[1].send_signal(signal.SIGTERM)
    else:
        hosts.metadata[0].set("instance/preempted", "TRUE")
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
