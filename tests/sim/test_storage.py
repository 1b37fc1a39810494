"""The storage emulator: gcp-storage-emulator on loopback with the default bucket, reached by gcsfs as a
simulated host reaches it (network_env)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tpuctl.sim.network import network_env
from tpuctl.sim.storage import DEFAULT_BUCKET, StorageEmulator


def _gcs(url: str, monkeypatch: pytest.MonkeyPatch) -> object:
    for name, value in network_env(mirror_url="http://127.0.0.1:9/", storage_url=url).items():
        monkeypatch.setenv(name, value)
    import gcsfs

    return gcsfs.GCSFileSystem(endpoint_url=url, token="anon", skip_instance_cache=True)


def test_default_bucket_and_objects(monkeypatch: pytest.MonkeyPatch) -> None:
    emulator = StorageEmulator()
    url = emulator.start()
    try:
        assert url.startswith("http://127.0.0.1:") and not url.endswith("/")
        buckets = httpx.get(f"{url}/storage/v1/b", params={"project": "p"}).json()
        assert [b["name"] for b in buckets["items"]] == [DEFAULT_BUCKET]
        fs = _gcs(url, monkeypatch)
        fs.pipe(f"{DEFAULT_BUCKET}/a/b.txt", b"hello")  # type: ignore[attr-defined]
        assert fs.cat(f"{DEFAULT_BUCKET}/a/b.txt") == b"hello"  # type: ignore[attr-defined]
        assert fs.ls(f"{DEFAULT_BUCKET}/a", detail=False) == [f"{DEFAULT_BUCKET}/a/b.txt"]  # type: ignore[attr-defined]
    finally:
        emulator.stop()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/storage/v1/b")


def test_data_dir_survives_a_restart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    emulator = StorageEmulator(tmp_path / "gcs", default_bucket="other")
    url = emulator.start()
    _gcs(url, monkeypatch).pipe("other/k", b"v")  # type: ignore[attr-defined]
    emulator.stop()
    again = StorageEmulator(tmp_path / "gcs", default_bucket="other")
    url = again.start()  # the bucket exists already: no error
    try:
        assert _gcs(url, monkeypatch).cat("other/k") == b"v"  # type: ignore[attr-defined]
    finally:
        again.stop()


def test_generations_as_cloud_storage_gives_them_and_stale_writes_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tensorstore's conditional writes (OCDBT's manifest) against the emulator behave as on Google: a
    download carries x-goog-generation, a write against the current generation lands, a stale one (or
    one expecting an object that does not exist) is refused with 412 and changes nothing."""
    emulator = StorageEmulator(tmp_path / "gcs")
    url = emulator.start()
    try:
        monkeypatch.setenv("TENSORSTORE_GCS_HTTP_URL", url)
        import tensorstore as ts

        kv = ts.KvStore.open({"driver": "gcs", "bucket": DEFAULT_BUCKET, "path": "x/"}).result()
        kv.write("k", b"one").result()
        first = kv.read("k").result().stamp.generation
        media = httpx.get(f"{url}/download/storage/v1/b/{DEFAULT_BUCKET}/o/x%2Fk", params={"alt": "media"})
        meta = httpx.get(f"{url}/storage/v1/b/{DEFAULT_BUCKET}/o/x%2Fk").json()
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
        )
        assert stale.status_code == 412 and stale.json()["error"]["code"] == 412
    finally:
        emulator.stop()
