"""Secrets and exposure: a sentinel service-account key (GOOGLE_APPLICATION_CREDENTIALS), a sentinel
billing API key and sentinel values in a run's --env never appear in any output, log, ledger row, bundle
or error message (every file under the state dir and every captured stream is scanned). A run's
``--secret`` and ``--env`` values reach its program, again after a takeover from another state dir, and
are found nowhere else: not in a file of either state dir, the shared ledger or the simulated hosts'
disks, not in the output, and not in the argv of any process while the program runs. The state dir is
0700 and its files 0600; the simulator binds 127.0.0.1 only."""

from __future__ import annotations

import hashlib
import json
import socket
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from hardening_helpers import fast_world, no_crash, walk_modes, write_world

from tpuctl.sim import SimAdminClient, SimServer
from tpuctl.sim.vms.layout import vm_roots_of
from tpuctl.sim.world import world_from_data
from tpuctl.store.secrets import generate_key
from tpuctl.testing.cli import CliResult, invoke
from tpuctl.testing.exposure import leaks

SENTINEL_KEY = "SENTINELPRIVKEY9f3a1c"
SENTINEL_TOKEN = "SENTINELTOKEN7b2e44"
SENTINEL_ENV = "SENTINELENV5d6c88"
SENTINEL_SECRET = "SENTINELSECRET3e91f0"
SENTINEL_PLAIN = "SENTINELPLAIN0c7d2a"
SENTINELS = (SENTINEL_KEY, SENTINEL_TOKEN, SENTINEL_ENV, SENTINEL_SECRET, SENTINEL_PLAIN)
#: A program that reports a digest of its secret and --env values (never the values), and how many
#: processes of this machine (the simulated hosts' among them) hold either in their argv as it runs. Its
#: first attempt fails, so that the run is resumed from another state dir.
REPORTER = """
import glob, hashlib, os, sys
values = [os.environ["API_TOKEN"], os.environ["PLAIN_SETTING"]]
in_argv = 0
for path in glob.glob("/proc/[0-9]*/cmdline"):
    try:
        with open(path, "rb") as fh:
            argv = fh.read()
    except OSError:
        continue
    in_argv += sum(v.encode() in argv for v in values)
digest = hashlib.sha256("|".join(values).encode()).hexdigest()
attempt = os.environ["TPUCTL_RESTART_COUNT"]
print(f"attempt {attempt} digest {digest} in_argv {in_argv}", flush=True)
sys.exit(3 if attempt == "0" else 0)
"""


@pytest.fixture
def cli() -> tuple[Callable[..., CliResult], list[str]]:
    seen: list[str] = []

    def run(*args: str) -> CliResult:
        result = invoke(args)
        seen.append(result.output)
        no_crash(result)
        return result

    return run, seen


def fake_service_account(path: Path) -> Path:
    path.write_text(
        json.dumps(
            {
                "type": "service_account",
                "project_id": "sentinel-project",
                "private_key_id": "0123456789abcdef",
                "private_key": f"-----BEGIN PRIVATE KEY-----\n{SENTINEL_KEY}\n-----END PRIVATE KEY-----\n",
                "client_email": "fake@sentinel-project.iam.gserviceaccount.com",
                "client_id": "1",
                "token_uri": "http://127.0.0.1:9/token",
            }
        )
    )
    return path


#: A run's saved request, for `runs resume`: in the ledger and in runs/RUN/request.json, both without its
#: --env values (those are an encrypted secret of the run's in the ledger).
RESUME_REQUEST = "request.json"


def scan(root: Path, texts: list[str]) -> list[str]:
    """Every sentinel in ``texts``, in a file below ``root`` or on the disk of a simulated host of a
    simulator whose state is below ``root`` (its VMs live in the temp dir)."""
    return leaks(SENTINELS, texts=texts, roots=[root, *vm_roots_of(root)])


def test_sentinels_never_leak_and_state_is_private(
    cli: tuple[Callable[..., CliResult], list[str]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    state_dir: Path,
) -> None:
    run, seen = cli
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(fake_service_account(tmp_path / "sa.json")))
    monkeypatch.setenv("TPUCTL_BILLING_API_KEY", SENTINEL_TOKEN)
    monkeypatch.setenv("TPUCTL_SIM_WORLD", str(write_world(tmp_path / "world.yaml", fast_world())))

    # The simulator path: create, list, describe, cost report, a run with a secret in --env, delete.
    r = run("-o", "json", "pod", "create", "v5e-4", "--name", "sec")
    assert r.code == 0, r.output
    assert run("pod", "list").code == 0
    assert run("-o", "json", "pod", "describe", "sec").code == 0
    assert run("cost", "report").code == 0
    job = tmp_path / "job"
    job.mkdir()
    (job / "main.py").write_text("import os\nprint('token length', len(os.environ['API_TOKEN']))\n")
    for fmt in ("table", "json"):
        # A stdlib program: nothing to install on the host (the setup never sees --env values).
        r = run(
            "-o",
            fmt,
            "run",
            str(job / "main.py"),
            "--pod",
            "sec",
            "--no-runtime-deps",
            "--env",
            f"API_TOKEN={SENTINEL_ENV}",
        )
        assert r.code == 0, r.output
        assert f"token length {len(SENTINEL_ENV)}" in r.output  # the program got it
    r = run(
        "-o",
        "json",
        "run",
        str(job / "main.py"),
        "--pod",
        "sec",
        "--env",
        f"API_TOKEN={SENTINEL_ENV}",
        "--dry-run",
    )
    assert r.code == 0, r.output
    assert run("runs", "list").code == 0
    assert run("doctor").code in (0, 1)
    # The billing API key on a refresh that cannot connect, and the SA key on the Google path.
    r = run("-o", "json", "catalog", "prices", "--refresh", "--billing-url", "http://127.0.0.1:9")
    assert r.code != 0
    r = run("-o", "json", "--project", "sentinel-project", "pod", "list", "--zone", "us-central1-a")
    assert r.code != 0 and r.code != 1, r.output
    assert run("pod", "delete", "sec", "-y").code == 0

    leaks = scan(state_dir, seen)
    assert leaks == [], leaks
    # The saved request was scanned above with the rest: it is there, and it keeps no --env value.
    assert list(state_dir.rglob(RESUME_REQUEST)), "no saved run request found"

    # 0700 directories and 0600 files, everywhere under the state dir.
    modes = walk_modes(state_dir)
    assert modes, "nothing under the state dir"
    assert stat.S_IMODE(state_dir.stat().st_mode) == 0o700
    for path, mode in modes:
        if path.is_dir():
            assert mode == 0o700, f"{path} is {oct(mode)}, want 0o700"
        elif "sim-hosts" in path.parts and "bundles" in path.parts:
            # A shipped program keeps its owner bits (an executable stays executable), nothing more.
            assert mode & 0o077 == 0 and mode & 0o600 == 0o600, f"{path} is {oct(mode)}"
        else:
            assert mode == 0o600, f"{path} is {oct(mode)}, want 0o600"
    # Regression: run log dirs and files (runs/, supervisor.lock, worker-N.log) were made with the umask
    # (0755/0644); the walk above now holds them to 0700/0600 like the rest.


def test_a_secret_reaches_its_program_again_after_a_takeover_and_is_found_nowhere_else(
    tmp_path: Path, serve_sim: Callable[..., SimAdminClient]
) -> None:
    serve_sim(fast_world())  # one simulated cloud for both state dirs (TPUCTL_SIM_URL)
    team = {
        "TPUCTL_DATABASE_URL": f"sqlite:///{tmp_path / 'shared' / 'team.db'}",
        "TPUCTL_SECRET_KEY": generate_key().decode("ascii"),
    }
    one, two = (
        {**team, "TPUCTL_STATE_DIR": str(tmp_path / "one")},
        {**team, "TPUCTL_STATE_DIR": str(tmp_path / "two")},
    )
    seen: list[str] = []

    def run(*args: str, env: dict[str, str]) -> CliResult:
        result = invoke(args, env=env)
        seen.append(result.output)
        no_crash(result)
        return result

    assert run("pod", "create", "v5e-4", "--name", "sec", env=one).code == 0
    job = tmp_path / "job"
    job.mkdir()
    (job / "main.py").write_text(REPORTER)
    # The secret's value from the submitting environment (`--secret NAME`), the --env one as a flag.
    first = run("-o", "json", "run", str(job / "main.py"), "--pod", "sec", "--no-runtime-deps",
                "--secret", "API_TOKEN", "--env", f"PLAIN_SETTING={SENTINEL_PLAIN}",
                env={**one, "API_TOKEN": SENTINEL_SECRET})  # fmt: skip
    assert first.code == 8, first.output  # the first attempt fails by design
    (listed,) = run("-o", "json", "runs", "list", env=one).json["runs"]
    run_id = listed["run_id"]
    # Machine two: the same ledger and key, another state dir, no API_TOKEN in its environment.
    resumed = run("runs", "resume", run_id, env=two)
    assert resumed.code == 0, resumed.output

    digest = hashlib.sha256(f"{SENTINEL_SECRET}|{SENTINEL_PLAIN}".encode()).hexdigest()
    assert f"attempt 0 digest {digest} in_argv 0" in first.output
    assert f"attempt 1 digest {digest} in_argv 0" in resumed.output
    # Both state dirs, the shared ledger and the simulated hosts' disks (the served simulator's state).
    leaks = scan(tmp_path, seen)
    assert leaks == [], leaks


def test_simulator_binds_loopback_only(tmp_path: Path) -> None:
    server = SimServer(tmp_path / "s", world_from_data(fast_world(), "test"))
    url = server.start()
    try:
        httpd = server._httpd
        assert httpd is not None
        host, port = httpd.socket.getsockname()[:2]
        assert host == "127.0.0.1" and url == f"http://127.0.0.1:{port}"
        # Not reachable on another local address of this machine.
        others = {a[4][0] for a in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)} - {
            "127.0.0.1"
        }
        for addr in others:
            with socket.socket() as s, pytest.raises(OSError):
                s.settimeout(1)
                s.connect((addr, port))
    finally:
        server.stop()


def test_config_file_secrets_are_not_echoed(
    cli: tuple[Callable[..., CliResult], list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bad config file is reported by field, not by dumping the file (which may hold a secret)."""
    run, seen = cli
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"profiles": {"default": {"max_price": "x", "note": SENTINEL_TOKEN}}}))
    monkeypatch.setenv("TPUCTL_CONFIG", str(config))
    r = run("-o", "json", "cost", "report", "--no-reconcile")
    assert r.code == 2, r.output
    assert [s for s in SENTINELS if s in "".join(seen)] == []
