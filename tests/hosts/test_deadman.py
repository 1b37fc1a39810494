"""The backstop's deadman on a host: when it deletes (the program over or the deadline passed, and no
check-in within the grace), what it sends (the VM's token from the metadata server, the reason for the
audit log, the deletes in order), what a refusal leaves in its log, and the real detached process armed
as tpuctl arms it: silent while checked in, deleting once the check-ins stop."""

from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tpuctl.hosts import deadman
from tpuctl.hosts.deadman import Config, Program, delete_slice, program_state, verdict
from tpuctl.testing.clock import wait_for
from tpuctl.testing.metadata_server import MetadataServer

SCRIPT = Path(deadman.__file__)
TOKEN = "host-token-1"
RUNNING = Program(True, "the program of attempt 0 runs")
ENDED = Program(False, "the program ended (attempt 0, exit 0)")


class FakeApi:
    """Answers DELETEs with the next status of ``statuses`` (then 200), recording each request."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.statuses: list[int] = []
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_DELETE(self) -> None:
                api.requests.append(("DELETE", self.path, dict(self.headers.items())))
                status = api.statuses.pop(0) if api.statuses else 200
                body = b'{"name": "operations/op-1"}' if status == 200 else b'{"error": {"code": 403}}'
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}{path}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def api() -> Iterator[FakeApi]:
    fake = FakeApi()
    yield fake
    fake.close()


@pytest.fixture
def metadata() -> Iterator[MetadataServer]:
    token = json.dumps({"access_token": TOKEN, "expires_in": 3599, "token_type": "Bearer"})
    server = MetadataServer({"instance/service-accounts/default/token": token})
    yield server
    server.close()


def test_it_waits_for_the_grace_and_for_the_program_or_the_deadline() -> None:
    grace = 60.0
    assert verdict(1000.0, 950.0, ENDED, None, grace) is None  # checked in 50 s ago: within the grace
    reason = verdict(1000.0, 930.0, ENDED, None, grace)
    assert (
        reason == "the program ended (attempt 0, exit 0), and no supervisor checked in for 70 s (grace 60 s)"
    )
    assert verdict(1000.0, 0.0, RUNNING, None, grace) is None  # silent, but the program still works
    assert verdict(1000.0, 0.0, RUNNING, 2000.0, grace) is None  # ... and its deadline is ahead
    late = verdict(1000.0, 0.0, RUNNING, 999.0, grace)
    assert late is not None and late.startswith("the run's deadline 1970-01-01T00:16:39Z passed")
    assert verdict(1000.0, 990.0, RUNNING, 999.0, grace) is None  # past it, but its supervisor is there


def test_the_program_state_follows_the_newest_attempt(tmp_path: Path) -> None:
    runs = tmp_path / "runs" / "r1"
    assert program_state(str(runs)) == Program(False, "no program of the run was started")
    first = runs / "0"
    first.mkdir(parents=True)
    (first / "exit").write_text("1\n")
    second = runs / "1"
    second.mkdir()
    assert program_state(str(runs)).what == "the program of attempt 1 never started"
    (second / "supervisor").write_text(f"{os.getpid()}\n")
    assert program_state(str(runs)) == Program(True, "the program of attempt 1 runs")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (second / "supervisor").write_text(f"{dead.pid}\n")
    assert program_state(str(runs)).what == "the program of attempt 1 was lost (its supervisor is gone)"
    (second / "exit").write_text("-9\n")
    assert program_state(str(runs)) == Program(False, "the program ended (attempt 1, exit -9)")


def _config(api: FakeApi, metadata: MetadataServer, runs_dir: Path, **changes: Any) -> Config:
    data: dict[str, Any] = {
        "grace_s": 60,
        "deadline_at": None,
        "runs_dir": str(runs_dir),
        "delete": [
            {"method": "DELETE", "url": api.url("/compute/v1/projects/p/zones/z/instanceGroupManagers/s")},
            {"method": "DELETE", "url": api.url("/compute/v1/projects/p/global/instanceTemplates/s")},
        ],
        "metadata_host": metadata.host,
        **changes,
    }
    return Config.of(data)


def test_the_deletes_carry_the_hosts_token_and_the_reason_in_order(
    api: FakeApi, metadata: MetadataServer, tmp_path: Path
) -> None:
    lines: list[str] = []
    config = _config(api, metadata, tmp_path)
    assert delete_slice(config, "the program ended\n(exit 0)", lines.append) is True
    assert [path for _, path, _ in api.requests] == [
        "/compute/v1/projects/p/zones/z/instanceGroupManagers/s",
        "/compute/v1/projects/p/global/instanceTemplates/s",
    ]
    headers = api.requests[0][2]
    assert headers["Authorization"] == f"Bearer {TOKEN}"
    assert headers[deadman.REASON_HEADER] == "the program ended?(exit 0)"  # one line of ASCII
    assert [flavor for _, _, flavor in metadata.requests] == ["Google"]
    assert len(lines) == 2 and all("accepted (HTTP 200)" in line for line in lines)


def test_a_refused_delete_names_the_permission_and_stops_the_round(
    api: FakeApi, metadata: MetadataServer, tmp_path: Path
) -> None:
    lines: list[str] = []
    api.statuses = [403]
    assert delete_slice(_config(api, metadata, tmp_path), "why", lines.append) is False
    assert len(api.requests) == 1  # the template is not tried while the group stays
    assert "refused (HTTP 403)" in lines[0]
    assert "compute.instanceGroupManagers.delete (roles/compute.instanceAdmin.v1)" in lines[0]
    tpu = Config.of(
        {**_raw(api, metadata, tmp_path), "delete": [{"method": "DELETE", "url": api.url("/v2/n")}]}
    )
    api.statuses = [403]
    assert delete_slice(tpu, "why", lines.append) is False
    assert "tpu.nodes.delete (roles/tpu.admin)" in lines[-1]


def _raw(api: FakeApi, metadata: MetadataServer, runs_dir: Path) -> dict[str, Any]:
    return {"grace_s": 1, "runs_dir": str(runs_dir), "metadata_host": metadata.host, "delete": []}


def test_armed_it_stays_while_checked_in_and_deletes_once_the_check_ins_stop(
    api: FakeApi, metadata: MetadataServer, tmp_path: Path
) -> None:
    """The real script, armed as tpuctl arms it (a process of its own that outlives the command), with a
    1.5 s grace (a busy machine's scheduling fits in it): check-ins every 0.1 s for 2 s keep the slice;
    after the last one it goes within the grace and a poll, and not before."""
    runs = tmp_path / "home" / ".tpuctl" / "runs" / "r1"
    (runs / "0").mkdir(parents=True)
    (runs / "0" / "exit").write_text("0\n")  # the program is over: only the check-ins keep the slice
    backstop = runs / "backstop"
    config = {
        "grace_s": 1.5,
        "poll_s": 0.05,
        "deadline_at": None,
        "runs_dir": str(runs),
        "delete": [{"method": "DELETE", "url": api.url("/v2/projects/p/locations/z/nodes/s")}],
    }
    env = {**os.environ, "GCE_METADATA_HOST": metadata.host}
    armed = subprocess.run(
        [sys.executable, "-I", "-S", str(SCRIPT), "arm", str(backstop), json.dumps(config)],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
        check=True,
    )
    pid = int(armed.stdout.split()[1])
    try:
        again = subprocess.run(
            [sys.executable, "-I", "-S", str(SCRIPT), "arm", str(backstop), json.dumps(config)],
            capture_output=True,
            text=True,
            env=env,
            timeout=30,
            check=True,
        )
        assert again.stdout.split() == ["deadman", str(pid)]  # one deadman per run, re-armed in place
        deadman.checkin(str(backstop))
        checked_in_until = time.monotonic() + 2.0
        last = time.monotonic()
        while last < checked_in_until:
            time.sleep(0.1)  # a real process on the real clock: the supervisor's check-in period
            assert api.requests == []
            deadman.checkin(str(backstop))
            last = time.monotonic()
        wait_for(lambda: api.requests or None, timeout=10.0, interval=0.02, what="the deadman's delete")
        took = time.monotonic() - last
        assert 1.5 <= took < 4.0, took
        assert api.requests[0][2]["Authorization"] == f"Bearer {TOKEN}"
        fired = json.loads((backstop / deadman.FIRED).read_text())
        assert fired["reason"].startswith("the program ended (attempt 0, exit 0), and no supervisor")

        # The deadman logs the answer once it has it, after the fake API recorded the request: on a loaded
        # machine, a moment later.
        def answered() -> str | None:
            text = (backstop / deadman.LOG).read_text()
            return text if "accepted (HTTP" in text else None

        log = wait_for(answered, timeout=10.0, interval=0.02, what="the deadman's log of the answer")
        assert log is not None and "deleting the slice: the program ended" in log
        assert "accepted (HTTP 200)" in log
    finally:
        os.kill(pid, signal.SIGKILL)


def test_a_malformed_config_is_refused_before_anything_starts(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-I", "-S", str(SCRIPT), "arm", str(tmp_path / "b"), '{"runs_dir": "x"}'],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2 and "bad config: KeyError" in done.stderr
    assert not (tmp_path / "b" / deadman.PID).exists()
