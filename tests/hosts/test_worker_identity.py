"""A Compute Engine host's TPU_WORKER_ID and TPU_WORKER_HOSTNAMES, derived from what its metadata server
publishes (tpu-env, worker-network-endpoints), and ``follow.py launch --tpu-worker-env`` handing them to
the program; a host whose metadata does not say is refused before anything starts."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tpuctl.hosts import worker_identity
from tpuctl.hosts.ssh import _FOLLOW_STUB
from tpuctl.hosts.worker_identity import WorkerIdentityError, tpu_worker_env
from tpuctl.testing.metadata_server import MetadataServer

REPO = Path(__file__).resolve().parents[2]
TPU_ENV = (
    "TPU_ACCELERATOR_TYPE: 'tpu7x-32'\nTOPOLOGY: '2x2x4'\nTPU_WORKER_ID: '2'\nHOST_BOUNDS: '1,1,4'\n"
    "CHIPS_PER_HOST_BOUNDS: '2,2,1'\n"
)
NAMES = "slice-mig-1a2b,slice-mig-3c4d,slice-mig-5e6f,slice-mig-7g8h"


@pytest.fixture
def server() -> Iterator[MetadataServer]:
    s = MetadataServer(
        {
            "instance/attributes/tpu-env": TPU_ENV,
            "instance/attributes/worker-network-endpoints": NAMES,
        }
    )
    try:
        yield s
    finally:
        s.close()


def test_the_ids_come_from_tpu_env_and_the_endpoints_in_their_order(server: MetadataServer) -> None:
    assert tpu_worker_env({"GCE_METADATA_HOST": server.host}) == {
        "TPU_WORKER_ID": "2",
        "TPU_WORKER_HOSTNAMES": NAMES,
    }
    assert {flavor for _, _, flavor in server.requests} == {"Google"}


def test_what_the_environment_already_says_is_kept_and_not_asked(server: MetadataServer) -> None:
    env = {"GCE_METADATA_HOST": server.host, "TPU_WORKER_ID": "7"}
    assert tpu_worker_env(env) == {"TPU_WORKER_HOSTNAMES": NAMES}
    both = {**env, "TPU_WORKER_HOSTNAMES": "a,b"}
    before = len(server.requests)
    assert tpu_worker_env(both) == {} and len(server.requests) == before


def test_tpu_api_triples_become_addresses_as_jax_reads_them() -> None:
    assert worker_identity.worker_hostnames("w-0:1:10.0.0.2,w-1:2:10.0.0.3") == ["10.0.0.2", "10.0.0.3"]
    with pytest.raises(WorkerIdentityError, match="'a:b'"):
        worker_identity.worker_hostnames("a:b")


def test_a_tpu_env_without_a_worker_id_is_refused_naming_it() -> None:
    assert worker_identity.worker_id("TOPOLOGY: '2x2x1'\nTPU_WORKER_ID: '11'\n") == "11"
    with pytest.raises(WorkerIdentityError, match="no TPU_WORKER_ID line"):
        worker_identity.worker_id("TOPOLOGY: '2x2x1'\n")
    with pytest.raises(WorkerIdentityError, match="'x'"):
        worker_identity.worker_id("TPU_WORKER_ID: 'x'\n")


def test_an_unpublished_attribute_is_named_after_jaxs_tries(server: MetadataServer) -> None:
    del server.values["instance/attributes/tpu-env"]
    with pytest.raises(
        WorkerIdentityError, match=rf"{server.host} did not answer .*tpu-env in 6 tries \(HTTP 404"
    ):
        tpu_worker_env({"GCE_METADATA_HOST": server.host}, sleep_s=0.0)
    assert sum(path.endswith("/tpu-env") for path, _, _ in server.requests) == 6


def _launch(
    tmp_path: Path, server: MetadataServer, *flags: str, run: str = "run"
) -> subprocess.CompletedProcess[str]:
    """``follow.py launch`` as the SSH executor runs it (``-I -S``, from the repo as a bundle), of a
    program that prints its TPU_WORKER_* variables."""
    show = "import os; print(os.environ.get('TPU_WORKER_ID'), os.environ.get('TPU_WORKER_HOSTNAMES'))"
    argv = [
        sys.executable,
        "-I",
        "-S",
        "-c",
        _FOLLOW_STUB,
        str(REPO),
        "launch",
        str(tmp_path / run),
        "--tail",
    ]
    argv += [*flags, "--cwd", str(tmp_path), "--", sys.executable, "-c", show]
    env = {"PATH": "/usr/bin:/bin", "GCE_METADATA_HOST": server.host}
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)


def test_follow_hands_the_program_its_worker_identity(tmp_path: Path, server: MetadataServer) -> None:
    done = _launch(tmp_path, server, "--tpu-worker-env")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"2 {NAMES}"
    # Without the flag (a TPU API slice) the program's environment is untouched.
    plain = _launch(tmp_path, server, run="plain")
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.strip() == "None None"


def test_follow_starts_nothing_when_the_metadata_does_not_say(tmp_path: Path, server: MetadataServer) -> None:
    server.values["instance/attributes/worker-network-endpoints"] = "bad:entry"
    done = _launch(tmp_path, server, "--tpu-worker-env")
    assert done.returncode == 2
    assert "worker-network-endpoints has an entry 'bad:entry'" in done.stderr
    assert not (tmp_path / "run" / "pid").exists()
