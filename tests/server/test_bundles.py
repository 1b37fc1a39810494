"""Uploaded bundles: kept under their digest (a body that is not the digest's refused), and pruned a day
after their last upload."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from tpuctl.server.bundles import BundleStore
from tpuctl.server.problems import RequestProblem


def test_a_bundle_is_kept_under_its_digest_only(tmp_path: Path) -> None:
    store = BundleStore(tmp_path / "bundles")
    data = b"a tarball"
    sha = hashlib.sha256(data).hexdigest()
    with pytest.raises(RequestProblem) as caught:
        store.put("0" * 64, data)
    assert caught.value.status == 400
    assert store.put(sha, data) == len(data) and store.get(sha) == data
    assert (tmp_path / "bundles" / f"{sha}.tar.gz").stat().st_mode & 0o777 == 0o600


def test_uploaded_bundles_are_pruned_a_day_after_their_last_upload(tmp_path: Path) -> None:
    store = BundleStore(tmp_path / "bundles")
    old, new = b"old", b"new"
    old_sha, new_sha = (hashlib.sha256(d).hexdigest() for d in (old, new))
    store.put(old_sha, old)
    store.put(new_sha, new)
    now = (tmp_path / "bundles" / f"{new_sha}.tar.gz").stat().st_mtime
    os.utime(tmp_path / "bundles" / f"{old_sha}.tar.gz", (now - 90_000, now - 90_000))
    assert store.prune(now=now) == [old_sha]
    assert store.get(new_sha) == new
    with pytest.raises(RequestProblem) as caught:
        store.get(old_sha)
    assert caught.value.status == 409  # upload it again
