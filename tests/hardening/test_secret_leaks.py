"""Secrets and exposure: a sentinel service-account key (GOOGLE_APPLICATION_CREDENTIALS), a sentinel
billing API key and sentinel values in a run's --env never appear in any output, log, ledger row, bundle
or error message (every file under the state dir and every captured stream is scanned). The state dir is
0700 and its files 0600; the simulator binds 127.0.0.1 only."""

from __future__ import annotations

import json
import socket
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from hardening_helpers import fast_world, no_crash, walk_modes, write_world

from tpuctl.sim import SimServer
from tpuctl.sim.world import world_from_data
from tpuctl.testing.cli import CliResult, invoke

SENTINEL_KEY = "SENTINELPRIVKEY9f3a1c"
SENTINEL_TOKEN = "SENTINELTOKEN7b2e44"
SENTINEL_ENV = "SENTINELENV5d6c88"
SENTINELS = (SENTINEL_KEY, SENTINEL_TOKEN, SENTINEL_ENV)


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
    leaks = []
    for text in texts:
        leaks += [s for s in SENTINELS if s in text]
    for path in root.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            leaks += [f"{path}: {s}" for s in SENTINELS if s.encode() in data]
    return leaks


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
