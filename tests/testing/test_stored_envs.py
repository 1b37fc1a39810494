"""``StoredEnvs``: a simulated bucket's run environments kept and put into the next bucket, byte for byte,
served by the emulator there; nothing else of the bucket kept, nor an environment whose store was cut."""

from __future__ import annotations

from pathlib import Path

import httpx

from tpuctl.sim import default_world
from tpuctl.sim.iam import ADC_TOKEN
from tpuctl.sim.storage import DEFAULT_BUCKET, StorageEmulator, stored_objects
from tpuctl.testing.stored_envs import StoredEnvs

ARCHIVE = b"tar bytes " * 10_000
COMPLETE = "tpuctl/envs/k1"
CUT_SHORT = "tpuctl/envs/k2"  # an archive with no record: its builder was stopped mid-store


def _upload(url: str, name: str, body: bytes) -> None:
    answer = httpx.post(
        f"{url}/upload/storage/v1/b/{DEFAULT_BUCKET}/o",
        params={"uploadType": "media", "name": name},
        content=body,
        headers={"Content-Type": "application/octet-stream", "Authorization": f"Bearer {ADC_TOKEN}"},
    )
    assert answer.status_code == 200, answer.text


def _download(url: str, name: str) -> bytes:
    answer = httpx.get(
        f"{url}/download/storage/v1/b/{DEFAULT_BUCKET}/o/{name.replace('/', '%2F')}",
        params={"alt": "media"},
        headers={"Authorization": f"Bearer {ADC_TOKEN}"},
    )
    assert answer.status_code == 200, answer.text
    return answer.content


def test_a_complete_environment_is_kept_and_served_from_the_next_bucket(tmp_path: Path) -> None:
    world = default_world()
    first = StorageEmulator(lambda: world, tmp_path / "first")
    url = first.start()
    try:
        _upload(url, f"{COMPLETE}/env-a.tar", ARCHIVE)
        _upload(url, f"{COMPLETE}/stored.json", b'{"archive": "tpuctl/envs/k1/env-a.tar", "bytes": 100000}')
        _upload(url, f"{CUT_SHORT}/env-b.tar", b"half an archive")
        _upload(url, "tpuctl/runs/r1/checkpoints/3/data", b"a run's checkpoint")
    finally:
        first.stop()
    kept = StoredEnvs(tmp_path / "kept")
    assert kept.harvest(tmp_path / "first") == 2
    assert kept.harvest(tmp_path / "first") == 0  # kept already

    assert kept.seed(tmp_path / "second") == 2
    assert stored_objects(tmp_path / "second") == [f"{COMPLETE}/env-a.tar", f"{COMPLETE}/stored.json"]
    second = StorageEmulator(lambda: world, tmp_path / "second")
    url = second.start()
    try:
        assert _download(url, f"{COMPLETE}/env-a.tar") == ARCHIVE
        # The bucket works as any other: a new object beside the seeded ones.
        _upload(url, "tpuctl/runs/r2/x", b"new")
    finally:
        second.stop()
    assert set(stored_objects(tmp_path / "second")) == {
        f"{COMPLETE}/env-a.tar",
        f"{COMPLETE}/stored.json",
        "tpuctl/runs/r2/x",
    }
    assert kept.seed(tmp_path / "second") == 0  # there already


def test_nothing_kept_seeds_nothing_and_creates_nothing(tmp_path: Path) -> None:
    kept = StoredEnvs(tmp_path / "kept")
    assert kept.harvest(tmp_path / "no-such-bucket-dir") == 0
    assert kept.seed(tmp_path / "fresh") == 0
    assert not (tmp_path / "fresh").exists()
