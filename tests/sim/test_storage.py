"""The storage emulator: gcp-storage-emulator on loopback with the default bucket, reached by gcsfs as a
simulated host reaches it (network_env), with Cloud Storage's checks of who calls."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tpuctl.sim import default_world
from tpuctl.sim.iam import ADC_TOKEN
from tpuctl.sim.network import caller_storage_env, network_env
from tpuctl.sim.storage import DEFAULT_BUCKET, StorageEmulator

AUTH = {"Authorization": f"Bearer {ADC_TOKEN}"}


def _gcs(url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> object:
    env = network_env(mirror_url="http://127.0.0.1:9/", storage_url=url)
    env |= caller_storage_env(ADC_TOKEN, tmp_path, "tpuctl-sim")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    import fsspec.config
    import gcsfs

    # fsspec reads its FSSPEC_* variables once, at import (a host's program starts with them set).
    conf: dict[str, dict[str, str]] = {}
    fsspec.config.set_conf_env(conf)
    monkeypatch.setattr(fsspec.config, "conf", conf)
    return gcsfs.GCSFileSystem(skip_instance_cache=True)


def test_default_bucket_and_objects(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    emulator = StorageEmulator(default_world)
    url = emulator.start()
    try:
        assert url.startswith("http://127.0.0.1:") and not url.endswith("/")
        buckets = httpx.get(f"{url}/storage/v1/b", params={"project": "p"}, headers=AUTH).json()
        assert [b["name"] for b in buckets["items"]] == [DEFAULT_BUCKET]
        fs = _gcs(url, monkeypatch, tmp_path)
        fs.pipe(f"{DEFAULT_BUCKET}/a/b.txt", b"hello")  # type: ignore[attr-defined]
        assert fs.cat(f"{DEFAULT_BUCKET}/a/b.txt") == b"hello"  # type: ignore[attr-defined]
        assert fs.ls(f"{DEFAULT_BUCKET}/a", detail=False) == [f"{DEFAULT_BUCKET}/a/b.txt"]  # type: ignore[attr-defined]
    finally:
        emulator.stop()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/storage/v1/b")


def test_data_dir_survives_a_restart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    emulator = StorageEmulator(default_world, tmp_path / "gcs", default_bucket="other")
    url = emulator.start()
    _gcs(url, monkeypatch, tmp_path).pipe("other/k", b"v")  # type: ignore[attr-defined]
    emulator.stop()
    again = StorageEmulator(default_world, tmp_path / "gcs", default_bucket="other")
    url = again.start()  # the bucket exists already: no error
    try:
        assert _gcs(url, monkeypatch, tmp_path).cat("other/k") == b"v"  # type: ignore[attr-defined]
    finally:
        again.stop()


def test_generations_as_cloud_storage_gives_them_and_stale_writes_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tensorstore's conditional writes (OCDBT's manifest) against the emulator behave as on Google: a
    download carries x-goog-generation, a write against the current generation lands, a stale one (or
    one expecting an object that does not exist) is refused with 412 and changes nothing."""
    emulator = StorageEmulator(default_world, tmp_path / "gcs")
    url = emulator.start()
    try:
        monkeypatch.setenv("TENSORSTORE_GCS_HTTP_URL", url)
        monkeypatch.setenv("GOOGLE_AUTH_TOKEN_FOR_TESTING", ADC_TOKEN)
        import tensorstore as ts

        kv = ts.KvStore.open({"driver": "gcs", "bucket": DEFAULT_BUCKET, "path": "x/"}).result()
        kv.write("k", b"one").result()
        first = kv.read("k").result().stamp.generation
        media = httpx.get(
            f"{url}/download/storage/v1/b/{DEFAULT_BUCKET}/o/x%2Fk", params={"alt": "media"}, headers=AUTH
        )
        meta = httpx.get(f"{url}/storage/v1/b/{DEFAULT_BUCKET}/o/x%2Fk", headers=AUTH).json()
        assert media.headers["x-goog-generation"] == meta["generation"]
        assert kv.write("k", b"two", if_equal=first).result().generation != b""  # landed
        assert kv.write("k", b"three", if_equal=first).result().generation == b""  # stale: refused
        assert kv.read("k").result().value == b"two"
        assert kv.write("new", b"x", if_equal=first).result().generation == b""
        assert kv.read("new").result().state == "missing"
        stale = httpx.post(
            f"{url}/upload/storage/v1/b/{DEFAULT_BUCKET}/o",
            params={"uploadType": "media", "name": "x/k", "ifGenerationMatch": "1"},
            content=b"late",
            headers=AUTH,
        )
        assert stale.status_code == 412 and stale.json()["error"]["code"] == 412
    finally:
        emulator.stop()


def test_callers_are_checked_as_cloud_storage_checks_them(tmp_path: Path) -> None:
    """No token is Cloud Storage's anonymous caller (401), an account without the permission 403 naming
    it; overwriting needs delete as well; testIamPermissions answers what the caller holds."""
    from tpuctl.sim.iam import access_token, default_service_account
    from tpuctl.sim.world import world_from_data

    hosts = default_service_account("tpuctl-sim")
    creator = {"role": "roles/storage.objectCreator", "members": [f"serviceAccount:{hosts}"]}
    owner = {"role": "roles/owner", "members": ["user:sim-user@example.com"]}
    world = world_from_data({"iam": {"tpuctl-sim": [owner, creator]}}, "test world")
    emulator = StorageEmulator(lambda: world, tmp_path / "gcs")
    url = emulator.start()
    upload = f"{url}/upload/storage/v1/b/{DEFAULT_BUCKET}/o"
    as_hosts = {"Authorization": f"Bearer {access_token(hosts)}"}
    try:
        anonymous = httpx.post(upload, params={"uploadType": "media", "name": "k"}, content=b"v")
        assert anonymous.status_code == 401
        assert anonymous.json()["error"]["message"].startswith(
            "Anonymous caller does not have storage.objects.create access to the Google Cloud Storage object."
        )
        bad = httpx.get(f"{url}/storage/v1/b/{DEFAULT_BUCKET}/o", headers={"Authorization": "Bearer nope"})
        assert bad.status_code == 401 and bad.json()["error"]["errors"][0]["reason"] == "authError"
        first = httpx.post(
            upload, params={"uploadType": "media", "name": "k"}, content=b"v", headers=as_hosts
        )
        assert first.status_code == 200
        again = httpx.post(
            upload, params={"uploadType": "media", "name": "k"}, content=b"w", headers=as_hosts
        )
        assert again.status_code == 403
        assert again.json()["error"]["message"] == (
            f"{hosts} does not have storage.objects.delete access to the Google Cloud Storage object. "
            "Permission 'storage.objects.delete' denied on resource (or it may not exist)."
        )
        read = httpx.get(
            f"{url}/storage/v1/b/{DEFAULT_BUCKET}/o/k", params={"alt": "media"}, headers=as_hosts
        )
        assert read.status_code == 403 and read.json()["error"]["errors"][0]["reason"] == "forbidden"
        asked = ["storage.objects.create", "storage.objects.get"]
        tested = httpx.get(
            f"{url}/storage/v1/b/{DEFAULT_BUCKET}/iam/testPermissions",
            params={"permissions": asked},
            headers=as_hosts,
        )
        assert tested.json() == {
            "kind": "storage#testIamPermissionsResponse",
            "permissions": ["storage.objects.create"],
        }
        assert httpx.get(f"{url}/storage/v1/b/nope/iam/testPermissions", headers=AUTH).status_code == 404
    finally:
        emulator.stop()


def test_a_whole_object_streamed_from_disk_is_the_emulators_answer(tmp_path: Path) -> None:
    """A plain media download from a bucket kept on disk (streamed from the object's file) answers with
    the bytes and headers the emulator gives for the same object kept in memory (read whole); a ranged
    read of it is still the emulator's."""
    body = bytes(range(256)) * 4096 + b"tail"
    answers = []
    for data_dir in (None, tmp_path / "gcs"):
        emulator = StorageEmulator(default_world, data_dir)
        url = emulator.start()
        try:
            stored = httpx.post(
                f"{url}/upload/storage/v1/b/{DEFAULT_BUCKET}/o",
                params={"uploadType": "media", "name": "env/a.tar"},
                content=body,
                headers={**AUTH, "Content-Type": "application/x-tar"},
            )
            assert stored.status_code == 200, stored.text
            whole = httpx.get(
                f"{url}/download/storage/v1/b/{DEFAULT_BUCKET}/o/env%2Fa.tar?alt=media", headers=AUTH
            )
            ranged = httpx.get(
                f"{url}/download/storage/v1/b/{DEFAULT_BUCKET}/o/env%2Fa.tar?alt=media",
                headers={**AUTH, "Range": "bytes=10-19"},
            )
            meta = httpx.get(f"{url}/storage/v1/b/{DEFAULT_BUCKET}/o/env%2Fa.tar", headers=AUTH).json()
            missing = httpx.get(
                f"{url}/download/storage/v1/b/{DEFAULT_BUCKET}/o/nothing?alt=media", headers=AUTH
            )
        finally:
            emulator.stop()
        assert (whole.status_code, whole.content) == (200, body)
        assert (ranged.status_code, ranged.content) == (206, body[10:20])
        assert missing.status_code == 404
        assert whole.headers["x-goog-generation"] == meta["generation"]  # each bucket's own generation
        kept = ("content-type", "content-length", "x-goog-hash", "x-goog-metageneration")
        answers.append({name: whole.headers.get(name) for name in kept})
    in_memory, on_disk = answers
    assert on_disk == in_memory and on_disk["x-goog-hash"] and on_disk["content-type"] == "application/x-tar"
