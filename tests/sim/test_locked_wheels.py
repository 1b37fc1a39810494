"""The mirror serves tpuctl's own locked dependencies (the team server's) from the uv cache: only the
locked version, repacked into the wheel it was, with fetch-through off; nothing the cache lacks."""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

import httpx

from tpuctl.sim.fetch_through import FetchThrough
from tpuctl.sim.locked_wheels import LockedWheels, locked_pins, wheel_name
from tpuctl.sim.mirror import PackageMirror
from tpuctl.testing.package_index import served_index, write_simple_index

_WHEEL = "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py2-none-any\nTag: py3-none-any\n"


def _unpacked(cache: Path, archive_id: str, dist: str, version: str) -> Path:
    """One package as uv's cache keeps it: ``archive-v0/<id>/`` with the module and its dist-info."""
    entry = cache / "archive-v0" / archive_id
    (entry / dist).mkdir(parents=True)
    (entry / dist / "__init__.py").write_text("VALUE = 42\n")
    info = entry / f"{dist}-{version}.dist-info"
    info.mkdir()
    (info / "WHEEL").write_text(_WHEEL)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "RECORD").write_text("")
    return entry


def test_locked_pins_are_the_registry_packages_of_the_lock(tmp_path: Path) -> None:
    lock = tmp_path / "uv.lock"
    lock.write_text(
        'version = 1\n[[package]]\nname = "Fast_API"\nversion = "0.1"\nsource = { registry = "x" }\n'
        '[[package]]\nname = "tpuctl"\nversion = "0.1.0"\nsource = { editable = "." }\n'
    )
    assert locked_pins(lock) == {"fast-api": "0.1"}
    assert locked_pins(tmp_path / "absent.lock") == {}


def test_wheel_name_compresses_the_tag_set(tmp_path: Path) -> None:
    entry = _unpacked(tmp_path, "a", "six_ish", "1.0")
    assert wheel_name(entry / "six_ish-1.0.dist-info") == "six_ish-1.0-py2.py3-none-any.whl"


def test_the_mirror_serves_the_locked_version_from_the_cache_only(tmp_path: Path) -> None:
    cache = tmp_path / "uv-cache"
    _unpacked(cache, "old", "serverdep", "0.9")
    _unpacked(cache, "new", "serverdep", "1.0")
    locked = LockedWheels({"serverdep": "1.0", "uncached": "2.0"}, cache, tmp_path / "out")
    fetch = FetchThrough("http://127.0.0.1:9/simple/", tmp_path / "fetched", lambda: False, locked=locked)
    mirror = PackageMirror(tmp_path / "wheelhouse", fetch_through=fetch)
    url = mirror.start()
    try:
        with httpx.Client(base_url=url) as http:
            page = http.get("/simple/serverdep/")
            assert page.status_code == 200
            assert "serverdep-1.0-py2.py3-none-any.whl" in page.text and "0.9" not in page.text
            wheel = http.get("/serverdep-1.0-py2.py3-none-any.whl")
            assert wheel.status_code == 200
            assert http.get("/simple/uncached/").status_code == 404  # locked, but not in the cache
            assert http.get("/simple/other/").status_code == 404  # not locked: never served
    finally:
        mirror.stop()
    (tmp_path / "got.whl").write_bytes(wheel.content)
    with zipfile.ZipFile(tmp_path / "got.whl") as got:
        assert got.read("serverdep/__init__.py") == b"VALUE = 42\n"
        assert "serverdep-1.0.dist-info/WHEEL" in got.namelist()


def test_with_fetch_through_on_the_users_index_answers_first(tmp_path: Path) -> None:
    cache = tmp_path / "uv-cache"
    _unpacked(cache, "a", "serverdep", "1.0")
    upstream = tmp_path / "upstream-wheels"
    upstream.mkdir()
    shutil.make_archive(str(upstream / "serverdep-2.0-py3-none-any"), "zip", cache / "archive-v0" / "a")
    (upstream / "serverdep-2.0-py3-none-any.zip").rename(upstream / "serverdep-2.0-py3-none-any.whl")
    write_simple_index(upstream, tmp_path / "index")
    locked = LockedWheels({"serverdep": "1.0"}, cache, tmp_path / "out")
    with served_index(tmp_path / "index") as index_url:
        fetch = FetchThrough(index_url, tmp_path / "fetched", lambda: True, locked=locked)
        page = fetch.page("/simple/serverdep/")
    assert page is not None and b"serverdep-2.0-py3-none-any.whl#sha256=" in page
    assert b"serverdep-1.0" not in page
