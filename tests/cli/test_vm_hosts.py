"""Simulated hosts are VMs: `tpuctl run` reaches them over SSH only, each has its own address,
disk and metadata server at Google's standard paths, and nothing of the launcher's machine shows through.
Stdlib-only programs with ``--no-runtime-deps``: nothing to install, so these runs take seconds."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tpuctl.sim import SimAdminClient
from tpuctl.sim.iam import ADC_TOKEN
from tpuctl.sim.network import API_PORT
from tpuctl.sim.vms.layout import services_address
from tpuctl.testing.cli import Cli

WORLD: dict[str, Any] = {
    "speed": 1000,
    "zones": {"us-central1-a": {"v5e": {"on_demand": 64, "preemptible": 64}}},
    "quotas": {
        "default": {"on_demand": {"zone": -1, "region": -1}, "preemptible": {"zone": -1, "region": -1}}
    },
    "latency": {"base_ms": 0, "jitter_ms": 0},
}

PROBE = r"""
import json, os, urllib.request

def metadata(path):
    request = urllib.request.Request(
        f"http://{os.environ['GCE_METADATA_HOST']}/computeMetadata/v1/{path}",
        headers={"Metadata-Flavor": "Google"},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return answer.read().decode()

worker = metadata("instance/attributes/agent-worker-number")
mine = os.path.join(os.path.expanduser("~"), f"probe-{worker}")
with open(mine, "w") as fh:
    fh.write(worker)
others = sorted(n for n in os.listdir(os.path.expanduser("~")) if n.startswith("probe-"))
print("PROBE " + json.dumps({
    "worker": int(worker),
    "ip": metadata("instance/network-interfaces/0/ip"),
    "endpoints": metadata("instance/attributes/worker-network-endpoints"),
    "home": os.path.expanduser("~"),
    "cwd": os.getcwd(),
    "seen": others,
    "env": dict(os.environ),
}), flush=True)
"""


@pytest.fixture
def admin(serve_sim: Callable[..., SimAdminClient]) -> SimAdminClient:
    return serve_sim(WORLD)


def probes(stdout: str) -> list[dict[str, Any]]:
    found = [json.loads(m.group(1)) for m in re.finditer(r"PROBE (\{.*\})$", stdout, re.MULTILINE)]
    return sorted(found, key=lambda p: p["worker"])


def test_each_host_of_a_v5e_16_is_a_vm_of_its_own(
    admin: SimAdminClient, cli: Cli, tmp_path: Path, state_dir: Path
) -> None:
    script = tmp_path / "proj" / "probe.py"
    script.parent.mkdir()
    script.write_text(PROBE)
    assert cli("pod", "create", "v5e-16", "--zone", "us-central1-a", "--name", "vms").code == 0
    result = cli("run", str(script), "--pod", "vms", "--no-runtime-deps")
    assert result.code == 0, result.stderr[-3000:]
    found = probes(result.stdout)
    assert [p["worker"] for p in found] == [0, 1, 2, 3]
    ips = [p["ip"] for p in found]
    assert len(set(ips)) == 4 and all(ip.startswith("127.") and ip != "127.0.0.1" for ip in ips)
    # The real format, with every host's own address, in worker order.
    assert found[0]["endpoints"] == ",".join(f"unknown:unknown:{ip}" for ip in ips)
    for probe in found:
        # Its own disk: it sees its own file only, and nothing of tpuctl's state dir shows through.
        assert probe["seen"] == [f"probe-{probe['worker']}"]
        assert str(state_dir) not in json.dumps(probe["env"]) and str(state_dir) not in probe["cwd"]
        assert not any(k.startswith("TPUCTL_STATE") for k in probe["env"])
        # Nor the laptop's simulator: the APIs a host is told of are its network's (the state's own
        # address), as a Google VM's are googleapis.com.
        assert admin.base_url.rstrip("/") not in json.dumps(probe["env"])
        assert probe["env"]["TPUCTL_SIM_URL"] == f"http://{services_address(state_dir)}:{API_PORT}"
    homes = {p["home"] for p in found}
    assert len(homes) == 4
    # A second run on the same slice finds the files again (the disk lives as long as the VM) ...
    again = probes(cli("run", str(script), "--pod", "vms", "--no-runtime-deps").stdout)
    assert [p["seen"] for p in again] == [[f"probe-{w}"] for w in range(4)]
    # ... and the disk goes with the slice.
    assert cli("pod", "delete", "vms", "-y").code == 0
    assert not any(Path(h).exists() for h in homes)


def test_a_program_that_imports_a_missing_module_fails_in_seconds_naming_it(
    admin: SimAdminClient, cli: Cli, tmp_path: Path
) -> None:
    script = tmp_path / "proj" / "needs.py"
    script.parent.mkdir()
    script.write_text("import tpuctl_not_installed_anywhere\nprint('never')\n")
    result = cli("run", str(script), "--type", "v5e-8", "--no-runtime-deps")
    assert result.code == 8, result.stderr[-2000:]
    assert "tpuctl_not_installed_anywhere" in result.stderr and "--requirements" in result.stderr
    assert "never" not in result.stdout
    assert cli("sim", "status", "-o", "json").json["nodes"] == []  # nothing left billing


def test_setup_failing_on_one_host_names_it_and_the_command(
    admin: SimAdminClient, cli: Cli, tmp_path: Path
) -> None:
    script = tmp_path / "proj" / "ok.py"
    script.parent.mkdir()
    script.write_text("print('ran')\n")
    failing = (
        'python3 -c "import os, sys, urllib.request as u; '
        "r = u.Request('http://' + os.environ['GCE_METADATA_HOST'] + "
        "'/computeMetadata/v1/instance/attributes/agent-worker-number', "
        "headers={'Metadata-Flavor': 'Google'}); "
        "sys.exit(1 if u.urlopen(r).read() == b'3' else 0)\""
    )
    result = cli("run", str(script), "--type", "v5e-16", "--no-runtime-deps", "--setup", failing)
    assert result.code == 8, result.stderr[-3000:]
    assert "setup failed on host 3" in result.stderr and "agent-worker-number" in result.stderr
    assert "ran" not in result.stdout
    assert cli("sim", "status", "-o", "json").json["nodes"] == []


def test_a_local_checkpoint_dir_is_refused_before_anything_is_made(
    admin: SimAdminClient, cli: Cli, tmp_path: Path
) -> None:
    script = tmp_path / "proj" / "ok.py"
    script.parent.mkdir()
    script.write_text("print('ran')\n")
    for path, says in (("ckpt", "relative path"), ("/tmp/ckpt", "one host's own disk")):
        result = cli("run", str(script), "--type", "v5e-8", "--checkpoint-dir", path)
        assert result.code == 2 and says in result.stderr and "gs://" in result.stderr
    assert cli("sim", "status", "-o", "json").json["nodes"] == []


def test_a_runs_programs_keep_jaxs_compilation_cache_in_its_bucket(
    admin: SimAdminClient, cli: Cli, tmp_path: Path
) -> None:
    script = tmp_path / "proj" / "train.py"
    script.parent.mkdir()
    script.write_text("print('ran')\n")

    def env(*flags: str) -> dict[str, str]:
        result = cli("run", str(script), "--type", "v5e-8", *flags, "--dry-run", "-o", "json")
        assert result.code == 0, result.stderr
        (host,) = result.json["plan"]["hosts"]
        return dict(host["env"])

    # A bucket that exists (the simulator's own): the run checks its hosts can use it before planning.
    planned = env("--checkpoint-dir", "gs://tpuctl-sim/exp/1")
    run_prefix = planned["TPUCTL_CHECKPOINT_DIR"]
    assert run_prefix == "gs://tpuctl-sim/exp/1"
    cache = planned["JAX_COMPILATION_CACHE_DIR"]
    assert cache.startswith("gs://tpuctl-sim/tpuctl/runs/") and cache.endswith("/compilation-cache")
    assert planned["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "0"
    # The user's own settings win; without the runtime's packages (etils, gcsfs) JAX could not open a
    # gs:// cache, so none is set.
    mine = env("--env", "JAX_COMPILATION_CACHE_DIR=/tmp/mine")
    assert mine["JAX_COMPILATION_CACHE_DIR"] == "/tmp/mine"
    assert "JAX_COMPILATION_CACHE_DIR" not in env("--no-runtime-deps")
    assert admin.status()["nodes"] == []


@pytest.mark.parametrize("flags", [["--spot"], ["--preemptible"]])
def test_on_google_a_preemptible_run_without_a_bucket_is_refused_before_any_request(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: list[str]
) -> None:
    import google.auth
    import requests
    import respx

    def refuse(what: str) -> Callable[..., object]:
        def call(*args: object, **kwargs: object) -> object:
            raise AssertionError(f"{what} before the refusal")

        return call

    # The TPU client speaks requests (google-auth's AuthorizedSession); other clients speak httpx.
    monkeypatch.setattr(google.auth, "default", refuse("credentials were looked up"))
    monkeypatch.setattr(requests.Session, "send", refuse("a request was sent"))
    script = tmp_path / "proj" / "train.py"
    script.parent.mkdir()
    script.write_text("print('ran')\n")
    with respx.mock(assert_all_called=False) as router:
        result = cli("--backend", "gcp", "--project", "p", "run", str(script), "--type", "v5e-8", *flags)
        assert router.calls.call_count == 0
    assert result.code == 2, result.stderr[-2000:]
    assert "--checkpoint-dir gs://" in result.stderr and "bucket" in result.stderr


COUNTER = """\
import time
for n in range(1, 41):
    print("line", n, flush=True)
    time.sleep(0.1)
"""


def test_a_run_survives_its_hosts_sshd_dying_and_coming_back(
    admin: SimAdminClient, cli: Cli, tmp_path: Path, state_dir: Path
) -> None:
    """The hypervisor (every sshd of the VMs) is killed mid-run: every connection drops, the programs run
    on; the run's simulator brings the hypervisor back, tpuctl reconnects, and the log has every line
    exactly once."""
    import os
    import signal
    import threading
    import time

    from tpuctl.sim.hypervisor import hypervisor_pid
    from tpuctl.sim.vms.layout import vm_root_for

    script = tmp_path / "proj" / "counter.py"
    script.parent.mkdir()
    script.write_text(COUNTER)
    killed: list[int] = []

    def kill_when_running() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            logs = list((state_dir / "runs").glob("*/worker-3.log"))
            if logs and "line 5" in logs[0].read_text():
                pid = hypervisor_pid(vm_root_for(state_dir))
                if pid is not None:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                return
            time.sleep(0.02)

    killer = threading.Thread(target=kill_when_running, daemon=True)
    killer.start()
    result = cli("run", str(script), "--type", "v5e-16", "--no-runtime-deps", "-o", "json")
    killer.join(timeout=10)
    assert killed, "the hypervisor was never killed"
    assert result.code == 0, result.stderr[-3000:]
    assert hypervisor_pid(vm_root_for(state_dir)) not in (None, killed[0])  # a new one serves
    run_id = result.json["run"]["run_id"]
    for worker in range(4):
        log = (state_dir / "runs" / run_id / f"worker-{worker}.log").read_text()
        lines = [line for line in log.splitlines() if line.startswith("line ")]
        assert lines == [f"line {n}" for n in range(1, 41)], (worker, lines)


RAISER = """\
import os, time
if os.environ["TPUCTL_WORKER_ID"] == "2":
    time.sleep(1.0)
    raise ValueError("boom at step 30")
time.sleep(120)
"""


def test_an_exception_on_host_2_ends_the_run_in_seconds_naming_host_2_and_quoting_it(
    admin: SimAdminClient, cli: Cli, tmp_path: Path
) -> None:
    import time

    script = tmp_path / "proj" / "raiser.py"
    script.parent.mkdir()
    script.write_text(RAISER)
    started = time.monotonic()
    result = cli("run", str(script), "--type", "v5e-16", "--no-runtime-deps", "-o", "json")
    took = time.monotonic() - started
    assert result.code == 8, result.stderr[-3000:]
    assert result.json["worker"] == 2, result.json
    assert "host 2" in result.json["message"] and "ValueError: boom at step 30" in result.json["message"]
    assert took < 30, took  # the others sleep 120 s: they were stopped, not waited for
    assert cli("sim", "status", "-o", "json").json["nodes"] == []


# --- OS Login ----------------------------------------------------------------------------------------

#: The simulator's principal (its default) and the POSIX account OS Login gives it.
PRINCIPAL = "sim-user@example.com"
POSIX = "sim_user_example_com"
LM_ARGS = ("--steps", "3", "--log-every", "1", "--batch", "8", "--seq-len", "16")


def logins(state_dir: Path) -> list[str]:
    """Every login the simulated hosts' sshds accepted (the disks of slices still up)."""
    from tpuctl.sim.vms.layout import vm_root_for
    from tpuctl.sim.vms.sshd import auth_log

    disks = (vm_root_for(state_dir) / "disks").glob("*")
    return [
        line for disk in disks if auth_log(disk).exists() for line in auth_log(disk).read_text().splitlines()
    ]


def assert_logged_in_through_os_login(admin: SimAdminClient, state_dir: Path) -> None:
    """Every login the kept slice's host accepted was the principal's POSIX account (none the ssh-keys
    user), with the run's own key, imported into the principal's profile with an expiry."""
    accepted = logins(state_dir)
    assert accepted and all(line.startswith(f"Accepted publickey for {POSIX} from ") for line in accepted)
    auth = {"Authorization": f"Bearer {ADC_TOKEN}"}  # the principal's own credentials, as tpuctl's
    profile = httpx.get(f"{admin.base_url}/v1/users/{PRINCIPAL}/loginProfile", headers=auth).json()
    (entry,) = profile["sshPublicKeys"].values()
    assert int(entry["expirationTimeUsec"]) > 0
    (node,) = admin.status()["nodes"]
    assert entry["key"] in admin.metadata(node["zone"], node["name"], 0, "instance/attributes/ssh-keys")


def test_with_os_login_on_a_run_imports_its_key_and_logs_in_as_the_principals_posix_account(
    serve_sim: Callable[..., SimAdminClient], cli: Cli, tmp_path: Path, state_dir: Path
) -> None:
    admin = serve_sim({**WORLD, "os_login": True})
    script = tmp_path / "proj" / "who.py"
    script.parent.mkdir()
    script.write_text("import os\nprint('USER=' + os.environ['USER'], 'HOME=' + os.path.expanduser('~'))\n")
    result = cli("run", str(script), "--type", "v5e-8", "--no-runtime-deps", "--keep-pod")
    assert result.code == 0, result.stderr[-3000:]
    assert f"USER={POSIX} HOME=" in result.stdout and f"/home/{POSIX}" in result.stdout
    assert_logged_in_through_os_login(admin, state_dir)


@pytest.mark.slow  # the example's JAX environment takes most of a minute to set up on 2 cores
def test_with_os_login_on_the_example_lm_finishes_logged_in_as_the_posix_account(
    serve_sim: Callable[..., SimAdminClient], cli: Cli, state_dir: Path
) -> None:
    admin = serve_sim({**WORLD, "os_login": True})
    result = cli("run", "--example", "lm", "--type", "v5e-8", "--keep-pod", "--", *LM_ARGS)
    assert result.code == 0, result.stderr[-3000:]
    assert "w0 | process 0/1 devices 8/8" in result.stdout and "step 3 loss" in result.stdout
    assert_logged_in_through_os_login(admin, state_dir)


@pytest.mark.slow  # the host refuses the key for 30 s before the run gives up (a guest agent may be late)
def test_with_os_login_on_a_run_whose_key_was_not_imported_fails_naming_os_login(
    serve_sim: Callable[..., SimAdminClient], cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tpuctl.cloud.oslogin import OsLoginAccess, PosixAccount

    def no_import(
        self: OsLoginAccess, project: str, public_openssh: str, *, expires_at: float
    ) -> PosixAccount:
        return self.client.login_profile(self.caller(), project).primary  # the account, no key imported

    monkeypatch.setattr(OsLoginAccess, "authorize_key", no_import)
    serve_sim({**WORLD, "os_login": True})
    script = tmp_path / "proj" / "hello.py"
    script.parent.mkdir()
    script.write_text("print('hello')\n")
    result = cli("run", str(script), "--type", "v5e-8", "--no-runtime-deps")
    assert result.code != 0
    assert f"cannot reach host 0 at {POSIX}@" in result.stderr
    assert "authorized through OS Login" in result.stderr and "roles/compute.osAdminLogin" in result.stderr
    assert "hello" not in result.stdout
    assert cli("sim", "status", "-o", "json").json["nodes"] == []  # nothing left billing
