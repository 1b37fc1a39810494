"""The run's environment in the bucket: one host builds it from the package mirror and stores it; another
host, with no route to the mirror and no uv, restores it with the image's python3 and tar alone, at a
different home, and it works there; a key the bucket lacks says so; a second builder stores nothing."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from setup_helpers import bring_uv, host_env, run_script

from tpuctl.hosts import envstore
from tpuctl.hosts.setup import SetupSpec, env_python, failed_command, finished, restore_script, setup_script
from tpuctl.sim import default_world
from tpuctl.sim.iam import access_token, default_service_account
from tpuctl.sim.storage import DEFAULT_BUCKET, StorageEmulator
from tpuctl.testing.metadata_server import MetadataServer

TOKEN = access_token(default_service_account(default_world().project))
#: Nothing listens there: a host whose package index is this has no route to one.
NO_INDEX = "http://127.0.0.1:9/"


@pytest.fixture(scope="module")
def storage_url() -> Iterator[str]:
    emulator = StorageEmulator(default_world)
    yield emulator.start()
    emulator.stop()


@pytest.fixture(scope="module")
def metadata_host() -> Iterator[str]:
    """A host's metadata server, handing out its service account's token."""
    token = json.dumps({"access_token": TOKEN, "expires_in": 3599, "token_type": "Bearer"})
    server = MetadataServer({"instance/service-accounts/default/token": token})
    yield server.host
    server.close()


def _host(home: Path, image: Path, index_url: str, storage_url: str, metadata_host: str) -> dict[str, str]:
    home.mkdir(parents=True, exist_ok=True)
    env: dict[str, str] = host_env(image, home, index_url)
    env |= {"API_ENDPOINT_OVERRIDE": storage_url, "GCE_METADATA_HOST": metadata_host}
    return env


def _record(storage_url: str, key: str) -> dict[str, object] | None:
    """The environment's record in the bucket (which archive, how many bytes), or None."""
    name = envstore.env_record(key).replace("/", "%2F")
    answer = httpx.get(
        f"{storage_url}/storage/v1/b/{DEFAULT_BUCKET}/o/{name}",
        params={"alt": "media"},
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    return dict(answer.json()) if answer.status_code == 200 else None


def test_built_once_then_restored_without_index_or_uv(
    image: Path, mirror_url: str, storage_url: str, metadata_host: str, tmp_path: Path
) -> None:
    spec = SetupSpec(None, "zipp\n", ('echo "ran on $HOME" >> "$VIRTUAL_ENV/ran"',))
    builder = _host(tmp_path / "builder", image, mirror_url, storage_url, metadata_host)
    bring_uv(builder)
    rc, lines, _ = run_script(setup_script(spec, store_in=DEFAULT_BUCKET), builder)
    assert rc == 0, "\n".join(lines)
    assert finished(lines[-1])
    record = _record(storage_url, spec.key())
    assert record is not None and int(str(record["bytes"])) > 10_000, record

    # Another host: no uv, no route to an index, another home (so another absolute path).
    other = _host(tmp_path / "other", image, NO_INDEX, storage_url, metadata_host)
    rc, lines, _ = run_script(restore_script(spec, DEFAULT_BUCKET), other)
    assert rc == 0, "\n".join(lines)
    assert lines[-1] == f"[tpuctl-setup] restored: {tmp_path}/other/.tpuctl/envs/{spec.key()}"
    python = tmp_path / "other" / env_python(spec)
    _bytecode_came_in_the_archive_and_is_used(python, other)  # before anything here imports zipp
    probe = "import sys, zipp; print(sys.prefix); print(open(sys.prefix + '/ran').read())"
    done = subprocess.run([python, "-c", probe], capture_output=True, text=True, env=other, check=False)
    # The environment works where it landed, and the command ran on both hosts (its effects outside
    # the environment are each host's own).
    prefix = str(python.parent.parent)
    assert done.stdout.splitlines() == [prefix, f"ran on {tmp_path}/builder", f"ran on {tmp_path}/other", ""]
    assert not list((tmp_path / "other" / ".tpuctl" / "envs").glob("*.part-*"))
    # Restored once: the marker makes the next start a no-op.
    rc, lines, _ = run_script(restore_script(spec, DEFAULT_BUCKET), other)
    assert (rc, lines[-1].split(":")[0]) == (0, "[tpuctl-setup] up to date")


def _bytecode_came_in_the_archive_and_is_used(python: Path, env: dict[str, str]) -> None:
    """The restored environment has the builder's bytecode for a package it installed, and Python takes
    it as valid: an import leaves the file as it was (a stale or missing one is written anew)."""
    where = "import importlib.util as u; s = u.find_spec('zipp'); print(u.cache_from_source(s.origin))"
    done = subprocess.run([python, "-c", where], capture_output=True, text=True, env=env, check=True)
    pyc = Path(done.stdout.strip())
    assert pyc.is_file(), f"no bytecode restored for zipp: {pyc}"
    before = pyc.stat()
    subprocess.run([python, "-c", "import zipp"], env=env, check=True)
    after = pyc.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_a_second_builder_stores_nothing_and_a_uv_pip_install_command_asks_no_index_on_a_restoring_host(
    image: Path, mirror_url: str, storage_url: str, metadata_host: str, tmp_path: Path
) -> None:
    """Two builders of one key (two runs at once): the first archive stands, the second still sets up.
    A builder whose bucket refuses the archive fails at the storing step (which the run's error names).
    The fix tpuctl suggests for a missing module (``--setup 'uv pip install X'``) runs again on a
    restoring host that has uv but no route to an index: X is in the restored environment already."""
    spec = SetupSpec(None, "zipp\n", ("uv pip install typing_extensions",))
    records = []
    for name in ("first", "second"):
        builder = _host(tmp_path / name, image, mirror_url, storage_url, metadata_host)
        bring_uv(builder)
        rc, lines, _ = run_script(setup_script(spec, store_in=DEFAULT_BUCKET), builder)
        assert rc == 0, "\n".join(lines)
        records.append(_record(storage_url, spec.key()))
    assert "stored already" in " ".join(lines)
    assert records[0] == records[1] is not None

    refused = _host(tmp_path / "refused", image, mirror_url, storage_url, metadata_host)
    bring_uv(refused)
    rc, lines, _ = run_script(setup_script(spec, store_in="no-such-bucket"), refused)
    assert rc != 0
    assert envstore.is_store_step(failed_command(lines) or ""), lines

    other = _host(tmp_path / "other", image, NO_INDEX, storage_url, metadata_host)
    bring_uv(other)
    rc, lines, _ = run_script(restore_script(spec, DEFAULT_BUCKET), other)
    assert rc == 0, "\n".join(lines)
    python = tmp_path / "other" / env_python(spec)
    assert subprocess.run([python, "-c", "import typing_extensions"], env=other, check=False).returncode == 0


def _put(storage_url: str, name: str, data: bytes) -> None:
    answer = httpx.post(
        f"{storage_url}/upload/storage/v1/b/{DEFAULT_BUCKET}/o",
        params={"uploadType": "media", "name": name},
        content=data,
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/octet-stream"},
    )
    assert answer.status_code == 200, answer.text


def test_an_environment_the_bucket_lacks_is_named_and_leaves_nothing(
    image: Path, storage_url: str, metadata_host: str, tmp_path: Path
) -> None:
    """No record: missing, even with an archive there (a builder cut off before its record); a record
    whose archive came up short: a failure, not an environment."""
    spec = SetupSpec(None, "six\n", ("echo never built",))
    host = _host(tmp_path, image, NO_INDEX, storage_url, metadata_host)
    archive = f"{envstore.env_prefix(spec.key())}/env-cut-off.tar"
    _put(storage_url, archive, b"\0" * 10240)
    rc, lines, _ = run_script(restore_script(spec, DEFAULT_BUCKET), host)
    assert rc == envstore.ENV_MISSING
    assert lines[-1] == f"[tpuctl-setup] not in the bucket: {envstore.env_url(DEFAULT_BUCKET, spec.key())}"
    assert list((tmp_path / ".tpuctl" / "envs").iterdir()) == []

    _put(
        storage_url,
        envstore.env_record(spec.key()),
        json.dumps({"archive": archive, "bytes": 20480}).encode(),
    )
    rc, lines, _ = run_script(restore_script(spec, DEFAULT_BUCKET), host)
    assert rc not in (0, envstore.ENV_MISSING)
    assert "10240 of 20480 bytes" in lines[-1], lines
    assert list((tmp_path / ".tpuctl" / "envs").iterdir()) == []
