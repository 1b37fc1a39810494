"""What the end-to-end tests of `tpuctl server` share: a ``Place`` (one ledger, one served simulator, the
servers' and a client's environments) and the waits on it. Servers and clients are child processes, as a
user runs them; a place kills whatever it started when the test ends. (A module of its own, not a
conftest: the tests import it by name.)"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tpuctl.sim import SimAdminClient
from tpuctl.store.ledger import Ledger
from tpuctl.store.records import RunStatus
from tpuctl.store.secrets import generate_key
from tpuctl.testing.clock import wait_for
from tpuctl.testing.ports import unused_port

ZONE = "us-central1-a"
#: The team acceptance's workspace file: team-a (a1 member, a2 viewer, lead admin; 32 v5e chips, 50 USD a
#: month) and team-b (b1 and a CI service account, members; 16 v5e chips), and a scrape token.
CI = "ci@proj.iam.gserviceaccount.com"
SCRAPE_TOKEN = "scrape-0123456789"
TEAM_WORKSPACES = f"""\
workspaces:
  team-a:
    chips: {{v5e: 32}}
    usd_per_month: 50
    members:
      a1@example.com: member
      a2@example.com: viewer
      lead@example.com: admin
  team-b:
    chips: {{v5e: 16}}
    members:
      b1@example.com: member
      {CI}: member
metrics:
  scrape_token_sha256: {hashlib.sha256(SCRAPE_TOKEN.encode()).hexdigest()}
"""
WORLD: dict[str, Any] = {
    "speed": 1000,
    "zones": {ZONE: {"v5e": {"on_demand": 64, "preemptible": 64}}},
    "quotas": {
        "default": {"on_demand": {"zone": -1, "region": -1}, "preemptible": {"zone": -1, "region": -1}}
    },
    "latency": {"base_ms": 0, "jitter_ms": 0},
}
LINES = 48
#: The first attempt's lines come a quarter second apart (12 s: long enough to kill its server mid-run on a
#: loaded machine; it is never waited for to the end); a takeover's quickly.
PROGRAM = f"""
import os, time
attempt = os.environ.get("TPUCTL_RESTART_COUNT", "0")
for i in range({LINES}):
    print(f"attempt {{attempt}} line {{i}}", flush=True)
    time.sleep(0.25 if attempt == "0" else 0.02)
"""


@dataclass
class Place:
    """One ledger, one simulated cloud, a server's environment and a client's."""

    database: str
    server_env: dict[str, str]
    client_env: dict[str, str]
    admin: SimAdminClient
    script: Path
    url: str
    started: list[subprocess.Popen[bytes]]

    def ledger(self) -> Ledger:
        return Ledger.open(self.database)

    def signed_in(self, email: str, where: Path) -> Place:
        """This place with a client acting as simulated account ``email``: its credentials file (from the
        simulator's issuer, written under ``where``) in GOOGLE_APPLICATION_CREDENTIALS, as a user or CI
        points the CLI at theirs. Servers and what they started stay the place's."""
        import dataclasses

        path = where / f"credentials-{email}.json"
        if not path.exists():
            path.write_text(json.dumps(self.admin.credentials(email)))
        return dataclasses.replace(
            self, client_env={**self.client_env, "GOOGLE_APPLICATION_CREDENTIALS": str(path)}
        )

    def start_server(self, *args: str) -> subprocess.Popen[bytes]:
        """A server process (``args``: more of `tpuctl server`'s flags), once it is ready."""
        listen = self.url.removeprefix("http://")
        argv = [sys.executable, "-m", "tpuctl", "server", "--listen", listen, *args]
        proc = subprocess.Popen(argv, env=self.server_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.started.append(proc)

        def ready() -> bool:
            assert proc.poll() is None, output(proc)
            try:
                return httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(ready, timeout=60.0, interval=0.1, what="the server to be ready")
        return proc

    def client(self, *args: str, output: Path | None = None) -> subprocess.Popen[bytes]:
        """A client process; its output piped, or written to ``output`` (read while it runs)."""
        argv = [sys.executable, "-m", "tpuctl", *args]
        stdout = subprocess.PIPE if output is None else output.open("wb")
        proc = subprocess.Popen(argv, env=self.client_env, stdout=stdout, stderr=subprocess.STDOUT)
        self.started.append(proc)
        return proc

    def submit_detached(self) -> str:
        """Submit the program with ``--detach`` from a client process (which exits at once); its run id."""
        argv = ("run", str(self.script), "--type", "v5e-8", "--zone", ZONE, "--no-runtime-deps", "--detach")
        detached = self.client(*argv, "-o", "json")
        out = detached.communicate(timeout=120)[0].decode()
        assert detached.returncode == 0, out
        return str(json.loads(out[out.index("{") :])["run"]["run_id"])

    def creates(self) -> int:
        return len(
            [m for m in self.admin.mutations() if m["method"] == "POST" and m["path"].endswith("/nodes")]
        )


def ended_under(
    place: Place, server: subprocess.Popen[bytes], run_id: str, *, timeout: float = 120.0
) -> RunStatus:
    """How the run ended, waited for while ``server`` (the one that must finish it) lives."""

    def ended() -> RunStatus | None:
        assert server.poll() is None, output(server)
        with place.ledger() as ledger:
            record = ledger.get_run(run_id)
        assert record is not None
        status = RunStatus(record.status)
        return status if status.finished else None

    status = wait_for(ended, timeout=timeout, interval=0.2, what=f"run {run_id} to end")
    assert status is not None
    return status


def output(proc: subprocess.Popen[bytes]) -> str:
    if proc.poll() is None:
        proc.kill()
    out = proc.communicate(timeout=10)[0] if proc.stdout is not None else b""
    return out.decode(errors="replace")[-4000:]


def make_place(
    tmp_path: Path,
    serve_sim: Callable[..., SimAdminClient],
    database: str,
    *,
    world: dict[str, Any] | None = None,
    program: str = PROGRAM,
    server_env: dict[str, str] | None = None,
) -> Iterator[Place]:
    """A place on ``database`` (yielded; every process it started is killed after): ``world`` served
    (default ``WORLD``), ``program`` as its script, ``server_env`` added to the servers' environment."""
    admin = serve_sim(WORLD if world is None else world)  # points TPUCTL_SIM_URL at it
    base = {k: v for k, v in os.environ.items() if not k.startswith("TPUCTL_")}
    base["TPUCTL_SIM_URL"] = os.environ["TPUCTL_SIM_URL"]
    server_env = {
        **base,
        "TPUCTL_STATE_DIR": str(tmp_path / "server"),
        "TPUCTL_DATABASE_URL": database,
        "TPUCTL_SECRET_KEY": generate_key().decode("ascii"),
        "TPUCTL_LEASE_DURATION": "3",
        "TPUCTL_LEASE_RENEW_EVERY": "0.5",
        **(server_env or {}),
    }
    url = f"http://127.0.0.1:{unused_port()}"
    client_env = {**base, "TPUCTL_STATE_DIR": str(tmp_path / "laptop"), "TPUCTL_SERVER": url}
    script = tmp_path / "proj" / "prog.py"
    script.parent.mkdir()
    script.write_text(program)
    started: list[subprocess.Popen[bytes]] = []
    yield Place(database, server_env, client_env, admin, script, url, started)
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
